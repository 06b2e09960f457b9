"""`kope-memref-copy-to-linalg`: turn a strided `memref.copy` into `linalg.copy`, lowered to loops.

Strided `memref.copy` lowers to a call of the `memrefCopy` runtime function, which the
ExecutionEngine in the torch-mlir wheel does not provide (bufferizing a padded conv2d hits it).
Expressing the copy as a linalg op removes the runtime dependency. A copy between two
contiguous buffers stays a `memref.copy`: `finalize-memref-to-llvm` makes it one `memcpy`,
where the loops `linalg.copy` becomes copy a scalar at a time (a group norm's result, computed
in a buffer of its own shape and copied to the destination through reshapes, spent 35 of its
kernel's 50 µs in that copy).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import linalg

from kope.passes.abi import plain_memref
from kope.passes.base import ModulePass, nested_ops


@dataclass
class MemrefCopyToLinalg(ModulePass):
    """Rewrite every `memref.copy` into an equivalent `linalg.copy`."""

    name = "kope-memref-copy-to-linalg"
    summary = "Rewrite memref.copy as linalg.copy (no memrefCopy runtime symbol needed)"

    def run(self, module: ir.Operation) -> None:
        for copy in [op for op in nested_ops(module) if op.name == "memref.copy"]:
            if all(plain_memref(value.type) for value in copy.operands):
                continue
            with ir.InsertionPoint(copy), copy.location:
                linalg.copy(copy.operands[0], outs=[copy.operands[1]])
            copy.erase()
