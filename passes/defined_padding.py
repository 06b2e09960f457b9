"""`kope-defined-padding`: no float temporary ends in bytes that nothing wrote.

LLVM computes a vector of an odd length (a 15-float row) in the next whole register, and where
the buffer it loads from is aligned it loads that whole register (64 bytes under AVX-512): the
lanes past the row read whatever lies after it, and are computed with the rest, then dropped.
Bytes nobody wrote are often denormal as floats (allocator headers, small integers), and each
vector instruction on a denormal lane takes a microcode assist of ~100 cycles. An average pool
whose 15-float row buffer is read 720 times a call ran 45 us on such bytes and 17 us on zeros,
and which of the two a process saw depended on what its allocator had handed out before: the
same kernel timed 1.6x eager in one worker and 3.5x in the next, and the search learned from
whichever it saw.

So each static float `memref.alloc` becomes an allocation of whole 64-byte lines, its padding
zeroed once per call; a small one (`ZEROED_BYTES`, the row and tile buffers a loop reads again
and again, where a lane its vectors never write may be read before any is) is zeroed whole.
Zero is never an assist, and nothing a kernel computes may depend on these bytes (the verifier
checks every output), so results are unchanged. Runs after `kope-hoist-allocs`: the zeroing is
then once per call, not once per loop iteration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import arith, linalg, memref

from kope.passes.abi import plain_memref
from kope.passes.base import ModulePass, nested_ops

LINE = 64  # bytes: the widest vector register (AVX-512), and the alignment of a whole one
ZEROED_BYTES = 4096  # temporaries up to this size are zeroed whole, larger ones their padding


def _padded(alloc: ir.Operation) -> tuple[ir.MemRefType, int] | None:
    """The buffer type and its element's size in bytes, for a static float buffer in the
    identity layout; else None (dynamic sizes, other layouts, integers, which no assist
    slows)."""
    kind = ir.MemRefType(alloc.results[0].type)
    element = kind.element_type
    if alloc.operands or not isinstance(element, ir.FloatType) or not plain_memref(kind):
        return None
    return kind, ir.FloatType(element).width // 8


@dataclass
class DefinedPadding(ModulePass):
    """Allocate float temporaries in whole 64-byte lines and zero the bytes no op writes."""

    name = "kope-defined-padding"
    summary = "Give static float memref.allocs whole 64-byte lines, the padding zeroed"

    def run(self, module: ir.Operation) -> None:
        for alloc in [op for op in nested_ops(module) if op.name == "memref.alloc"]:
            found = _padded(alloc)
            if found is None:
                continue
            kind, width = found
            size = math.prod(kind.shape) * width
            lines = max(1, -(-size // LINE)) * LINE
            zero_from = 0 if lines <= ZEROED_BYTES else size
            if zero_from == lines:
                continue  # whole lines already, and too large to zero: nothing to define
            old = alloc.attributes["alignment"] if "alignment" in alloc.attributes else None
            align = max(LINE, ir.IntegerAttr(old).value if old is not None else 0)
            i8, index = ir.IntegerType.get_signless(8), ir.IndexType.get()
            with ir.InsertionPoint(alloc), alloc.location:
                raw = memref.alloc(
                    ir.MemRefType.get([lines], i8),
                    [],
                    [],
                    alignment=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), align),
                )
                start = arith.constant(index, 0)
                typed = memref.view(kind, raw, start, [])
                pad = ir.MemRefType.get([(lines - zero_from) // width], kind.element_type)
                offset = arith.constant(index, zero_from) if zero_from else start
                tail = memref.view(pad, raw, offset, [])
                zero = arith.constant(kind.element_type, 0.0)
                linalg.fill(zero, outs=[tail])
            result = alloc.results[0]
            for use in list(result.uses):
                owner = use.owner.operation
                if owner.name == "memref.dealloc":
                    owner.operands[0] = raw  # free the allocation, not a view of it
            result.replace_all_uses_with(typed)
            alloc.erase()
