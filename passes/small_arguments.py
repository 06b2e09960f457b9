"""`kope-expand-log1p-expm1`: `math.log1p` and `math.expm1` in forms exact near zero.

MLIR lowers `math.log1p(x)` to LLVM as `log(1 + x)` and `math.expm1(x)` as `exp(x) - 1`, which
lose every digit that `1 + x` rounds away: `log1p(1e-8)` came out 0 and `log1p(1e-6)` 4.6% off,
and so did softplus, ELU, log-sigmoid and Mish, which torch-mlir builds on them (`softplus(-20)`
gave 0, so a log of it gave -inf for eager's -20). This pass rewrites both, on scalars and
vectors of any float type, with the classic corrections that recover what the rounding of
`1 + x` (or of `exp(x)`) lost, using only `log`, `exp` and arithmetic, which still vectorize:

    log1p(x) = x                        where u = 1 + x rounds to 1
             = log(u) * (x / (u - 1))   else (Goldberg; u = +inf stays +inf)
    expm1(x) = x                        where u = exp(x) rounds to 1
             = -1                       where u - 1 rounds to -1
             = (u - 1) * (x / log(u))   else (Kahan; u = +inf stays +inf)

Both stay within a few ulp of the exact result where `log` and `exp` are correctly rounded to
within an ulp. NaN stays NaN, -0 stays -0, log1p(-1) is -inf. It runs in `kope-lower-cpu`,
before the math dialect is lowered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import arith
from torch_mlir.dialects import math as math_d

from kope.passes.base import ModulePass, nested_ops


def _const(like: ir.Type, value: float) -> ir.Value:
    element = like.element_type if isinstance(like, ir.VectorType) else like
    scalar = ir.FloatAttr.get(element, value)
    if isinstance(like, ir.VectorType):
        return arith.constant(like, ir.DenseElementsAttr.get_splat(like, scalar))
    return arith.constant(like, scalar)


def _where(predicate: str, a: ir.Value, b: ir.Value, yes: ir.Value, no: ir.Value) -> ir.Value:
    return arith.select(arith.cmpf(getattr(arith.CmpFPredicate, predicate), a, b), yes, no)


def log1p_from_log(x: ir.Value, log: Callable[[ir.Value], ir.Value]) -> ir.Value:
    """log1p(x) by Goldberg's correction, taking the log of 1 + x from `log` (`math.log`
    here; `kope-approximate-math` passes its polynomial)."""
    t = x.type
    u = arith.addf(x, _const(t, 1.0))
    d = arith.subf(u, _const(t, 1.0))
    r = arith.mulf(log(u), arith.divf(x, d))
    r = _where("OEQ", d, _const(t, 0.0), x, r)
    return _where("OEQ", u, _const(t, float("inf")), u, r)


def _log1p(x: ir.Value) -> ir.Value:
    return log1p_from_log(x, math_d.log)


def _expm1(x: ir.Value) -> ir.Value:
    t = x.type
    u = math_d.exp(x)
    um1 = arith.subf(u, _const(t, 1.0))
    r = arith.mulf(um1, arith.divf(x, math_d.log(u)))
    r = _where("OEQ", u, _const(t, 1.0), x, r)
    r = _where("OEQ", um1, _const(t, -1.0), um1, r)
    return _where("OEQ", u, _const(t, float("inf")), u, r)


_REWRITES = {"math.log1p": _log1p, "math.expm1": _expm1}


@dataclass
class ExpandLog1pExpm1(ModulePass):
    """Rewrite math.log1p / math.expm1 into forms exact for arguments near zero."""

    name = "kope-expand-log1p-expm1"
    summary = "math.log1p / math.expm1 as log / exp with the corrections exact near zero"

    def run(self, module: ir.Operation) -> None:
        for op in [op for op in nested_ops(module) if op.name in _REWRITES]:
            with ir.InsertionPoint(op), op.location:
                value = _REWRITES[op.name](op.operands[0])
            op.results[0].replace_all_uses_with(value)
            op.erase()
