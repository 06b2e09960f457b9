"""`kope-narrow-f64`: the f64 arithmetic inside a function of f32 tensors computed in f32.

torch-mlir widens some f32 statistics to f64: `aten.var` (and so group norm, `var_mean`,
`std`) converts its input with `arith.extf`, sums and divides in f64 and truncates the
result. On a CPU an f64 vector holds half the lanes of an f32 one, and the conversions cost
as much as the arithmetic, so a kernel of such a payload runs at half speed or less. Eager
ATen computes group norm's statistics in f32, and the two-pass variance (the mean first, then
the squared deviations) loses nothing that matters in f32. A kernel opts in by running this
pass on its payload and is verified like any other; the reference lowering never does.

The pass changes a function only where every argument and result is free of f64 (the f64
values are then all intermediates) and every f64 constant is a scalar: each f64 value becomes
f32, and the `arith.extf` / `arith.truncf` between them vanish. Any other function is left
as it is, with a warning.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from kope.passes.abi import function_type
from kope.passes.base import ModulePass, nested_ops


def _narrowed(type_: ir.Type) -> ir.Type | None:
    """`type_` with f32 for f64 (scalar, tensor or vector); None if it holds no f64."""
    context = type_.context
    f64, f32 = ir.F64Type.get(context), ir.F32Type.get(context)
    if type_ == f64:
        return f32
    if isinstance(type_, ir.RankedTensorType) and type_.element_type == f64:
        return ir.RankedTensorType.get(type_.shape, f32, type_.encoding)
    if isinstance(type_, ir.VectorType) and type_.element_type == f64:
        return ir.VectorType.get(type_.shape, f32)
    return None


def has_f64(type_: ir.Type) -> bool:
    """Whether `type_` is f64 or a tensor or vector of f64."""
    f64 = ir.F64Type.get(type_.context)
    if isinstance(type_, (ir.RankedTensorType, ir.VectorType)):
        return bool(type_.element_type == f64)
    return bool(type_ == f64)


def boundary_has_f64(func: ir.Operation) -> bool:
    """Whether a `func.func` takes or returns f64 values (then its f64 is not internal)."""
    signature = function_type(func)
    return any(has_f64(t) for t in [*signature.inputs, *signature.results])


@dataclass
class NarrowF64(ModulePass):
    """Compute a function's internal f64 arithmetic in f32."""

    name = "kope-narrow-f64"
    summary = (
        "Compute in f32 the f64 intermediates of a function whose arguments and results "
        "hold no f64 (torch-mlir's widened variance)"
    )

    def run(self, module: ir.Operation) -> None:
        for func in module.regions[0].blocks[0].operations:
            func = func.operation
            if func.name == "func.func" and func.regions[0].blocks:
                with func.location:
                    self._narrow(func)

    def _narrow(self, func: ir.Operation) -> None:
        ops = nested_ops(func)[:-1]  # the walk ends with the function itself
        if not any(has_f64(r.type) for op in ops for r in op.results):
            return
        if boundary_has_f64(func):
            self.warn(func.location, "f64 arguments or results: the f64 arithmetic is kept")
            return
        for op in ops:
            if op.name == "arith.constant" and has_f64(op.results[0].type):
                if op.results[0].type != ir.F64Type.get():
                    self.warn(op.location, "an f64 constant that is not a scalar: kept as f64")
                    return
        for op in ops:
            for region in op.regions:
                for block in region.blocks:
                    for argument in block.arguments:
                        narrowed = _narrowed(argument.type)
                        if narrowed is not None:
                            argument.set_type(narrowed)
            if op.name == "arith.constant" and op.results[0].type == ir.F64Type.get():
                value = ir.FloatAttr(op.attributes["value"]).value
                op.attributes["value"] = ir.FloatAttr.get(ir.F32Type.get(), value)
            for result in op.results:
                narrowed = _narrowed(result.type)
                if narrowed is not None:
                    result.set_type(narrowed)
        for op in ops:
            if op.name in ("arith.extf", "arith.truncf") and (
                op.operands[0].type == op.results[0].type
            ):
                op.results[0].replace_all_uses_with(op.operands[0])
                op.erase()
