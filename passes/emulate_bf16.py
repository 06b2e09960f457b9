"""`kope-emulate-bf16`: bfloat16 arithmetic computed in f32, so that a bf16 kernel JIT-compiles.

A CPU without AVX512-BF16 has no bf16 arithmetic: LLVM promotes each bf16 operation to f32 and
rounds its result back with a call of compiler-rt's `__truncsfbf2`. Neither the JIT nor the
kernel cache's shared libraries can resolve that symbol (libgcc has it only from GCC 13), so
the ExecutionEngine found no `@kope_kernel` and every bf16 operator (a bf16 linear, layer norm,
an add) failed to compile and ran eagerly. This pass makes the promotion explicit in MLIR,
where eager ATen does it too (bf16 in memory, f32 in registers): arithmetic and math on bf16
computed on f32 values (`arith-emulate-unsupported-floats`, `math-extend-to-supported-types`),
and the f32 to bf16 rounding (nearest, ties to even, NaN kept) and its inverse as integer
operations (`arith-expand{include-bf16=true}`). Named linalg ops (a bf16 matmul accumulating
in f32) are generalized first: their bodies are implicit, and must stay so, so the conversions
could not go inside them.

A module that holds no bf16 value is left as it is: `arith-expand` also rewrites other
operations (maximumf, ceildivsi, ...) that the CPU lowering otherwise keeps as intrinsics.

The bf16 values left only move; `kope-bf16-bits` gives them the type i16 once they are in the
LLVM dialect, where LLVM's vectorizers would otherwise keep bfloats in registers and round
them with the same libcall.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import arith
from torch_mlir.passmanager import PassManager

from kope.passes.base import ModulePass, nested_ops

EMULATION = (
    "builtin.module("
    "func.func(linalg-generalize-named-ops),"
    "arith-emulate-unsupported-floats{source-types=bf16 target-type=f32},"
    "math-extend-to-supported-types{extra-types=f16 target-type=f32},"
    "arith-expand{include-bf16=true})"
)


def _element(type_: ir.Type) -> ir.Type:
    """The element type of a shaped type (tensor, vector, memref); a scalar type itself."""
    return type_.element_type if isinstance(type_, ir.ShapedType) else type_


def _is_bf16(type_: ir.Type) -> bool:
    return isinstance(_element(type_), ir.BF16Type)


def has_bf16(module: ir.Operation) -> bool:
    """Whether any operation of `module` takes or makes a bf16 value (scalar, tensor, vector,
    memref), block arguments included."""
    found = False

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal found
        values = [*op.operands, *op.results]
        for region in op.regions:
            for block in region.blocks:
                values.extend(block.arguments)
        if any(_is_bf16(v.type) for v in values):
            found = True
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return found


@dataclass
class EmulateBf16(ModulePass):
    """Compute bf16 arithmetic and math in f32, rounding to bf16 in integer operations."""

    name = "kope-emulate-bf16"
    summary = (
        "Compute bf16 arithmetic in f32 and round to bf16 in integer operations (no "
        "__truncsfbf2 calls, which the JIT cannot resolve)"
    )

    def run(self, module: ir.Operation) -> None:
        if has_bf16(module):
            _truncate_through_f32(module)
            PassManager.parse(EMULATION).run(module)


def _truncate_through_f32(module: ir.Operation) -> None:
    """`arith.truncf` from f64 to bf16 (torch-mlir's layer norm epsilon) as f64 to f32 to
    bf16: `arith-expand` rounds to bf16 from f32 only, and LLVM's f64 to bf16 is a libcall."""
    for op in nested_ops(module):
        if op.name != "arith.truncf" or not _is_bf16(op.results[0].type):
            continue
        if not isinstance(_element(op.operands[0].type), ir.F64Type):
            continue
        source = op.operands[0]
        f32 = ir.F32Type.get(source.type.context)
        narrow = (
            ir.VectorType.get(source.type.shape, f32)
            if isinstance(source.type, ir.VectorType)
            else f32
        )
        with ir.InsertionPoint(op), op.location:
            op.operands[0] = arith.truncf(narrow, source)
