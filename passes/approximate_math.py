"""`kope-approximate-math`: f32 `math.exp`, `math.erf` and `math.tanh` as polynomials in arith ops.

LLVM lowers a vector `math.exp` to one scalar libm call per lane, which dominates softmax, GELU
and the like once everything else is vectorized. Rewritten as range reduction plus a
polynomial (Cephes-style `exp`, Abramowitz–Stegun 7.1.26 `erf`, `tanh` from `exp`), they
vectorize with the rest of the loop. Accuracy (measured over dense grids): `exp` within
1.5 ulp on normal results (0 below the normal range, ±Inf and NaN as IEEE says), `erf` within
5e-7 absolute, `tanh` within 1e-7 absolute. An exp of a number never positive needs no
overflow handling, which is a third of the polynomial's cost: erf's and tanh's own, softmax's
and log-softmax's x minus its row's maximum (found in the payload: `_nonpositive`), and
attention's (marked `NONPOSITIVE` by the kernel that writes it); 11-20% off those kernels
here. A division by a constant becomes a product by
its reciprocal (within an ulp; GELU divides every element by sqrt(2), and its kernel ran 9%
faster without the divide). Replacing the other divisions (sigmoid's and SiLU's by
1 + exp(-x)) by a reciprocal estimate and Newton steps made those kernels 10-15% slower
here: the divider runs beside the FMA units that the exp polynomial already fills. A kernel
opts in by running this pass on its payload; the reference lowering never does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import arith
from torch_mlir.dialects import math as math_d

from kope.passes.base import ModulePass, defining_op, nested_ops

_LOG2E = 1.44269504088896341
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_EXP_POLY = (
    1.9875691500e-4,
    1.3981999507e-3,
    8.3334519073e-3,
    4.1665795894e-2,
    1.6666665459e-1,
    5.0000001201e-1,
)
_EXP_MAX = 88.72283905206835  # above: +Inf
_EXP_MIN = -87.33654475055310  # below: 0 (results would be subnormal)
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


class _Builder:
    """Arithmetic on scalars or vectors of f32 at one insertion point."""

    def __init__(self, like: ir.Value):
        self.type = like.type
        self.f32 = ir.F32Type.get()
        self.i32 = ir.IntegerType.get_signless(32)
        if isinstance(self.type, ir.VectorType):
            self.int_type: ir.Type = ir.VectorType.get(self.type.shape, self.i32)
        else:
            self.int_type = self.i32

    def const(self, value: float) -> ir.Value:
        if isinstance(self.type, ir.VectorType):
            attr = ir.DenseElementsAttr.get_splat(self.type, ir.FloatAttr.get(self.f32, value))
            return arith.constant(self.type, attr)
        return arith.constant(self.f32, value)

    def int_const(self, value: int) -> ir.Value:
        if isinstance(self.type, ir.VectorType):
            attr = ir.DenseElementsAttr.get_splat(
                self.int_type, ir.IntegerAttr.get(self.i32, value)
            )
            return arith.constant(self.int_type, attr)
        return arith.constant(self.i32, value)

    def add(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.addf(a, b)

    def mul(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.mulf(a, b)

    def fma(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        return math_d.fma(a, b, c)

    def horner(self, x: ir.Value, coefficients: tuple[float, ...]) -> ir.Value:
        acc = self.const(coefficients[0])
        for c in coefficients[1:]:
            acc = self.fma(acc, x, self.const(c))
        return acc

    def select(
        self, predicate: str, a: ir.Value, b: ir.Value, yes: ir.Value, no: ir.Value
    ) -> ir.Value:
        cond = arith.cmpf(getattr(arith.CmpFPredicate, predicate), a, b)
        return arith.select(cond, yes, no)


def _exp_reduced(b: _Builder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """exp(x) as 2^n * p: n = round(x / ln 2) (a float) and p = exp(x - n ln 2), the
    polynomial; scaling by 2^n and the range's ends are the callers'."""
    n = math_d.floor(b.fma(x, b.const(_LOG2E), b.const(0.5)))
    r = b.fma(n, b.const(-_LN2_HI), x)
    r = b.fma(n, b.const(-_LN2_LO), r)
    r2 = b.mul(r, r)
    p = b.horner(r, _EXP_POLY)
    return n, b.add(b.fma(p, r2, r), b.const(1.0))


def _exp(b: _Builder, x: ir.Value) -> ir.Value:
    n, p = _exp_reduced(b, x)
    # n spans [-126, 128] where this value is used; 2^128 is not a float, so n = 128 (x within
    # 0.35 of the largest exp that is) is 2 * 2^127.
    top = b.const(127.0)
    y = b.mul(p, _pow2(b, arith.fptosi(b.int_type, arith.minimumf(n, top))))
    y = b.mul(y, b.select("OGT", n, top, b.const(2.0), b.const(1.0)))
    y = b.select("OGT", x, b.const(_EXP_MAX), b.const(math.inf), y)
    return b.select("OLT", x, b.const(_EXP_MIN), b.const(0.0), y)


def _exp_of_nonpositive(b: _Builder, x: ir.Value) -> ir.Value:
    """exp(x) for x <= 0 (erf's exp(-x^2), tanh's exp(-2|x|)): `_exp` without its overflow
    handling, 2^n in one step (n is in [-126, 0] where the value is used)."""
    n, p = _exp_reduced(b, x)
    y = b.mul(p, _pow2(b, arith.fptosi(b.int_type, n)))
    return b.select("OLT", x, b.const(_EXP_MIN), b.const(0.0), y)


def _pow2(b: _Builder, exponent: ir.Value) -> ir.Value:
    """2^e for integer e in [-126, 127], from the exponent bits."""
    biased = arith.addi(exponent, b.int_const(127))
    return arith.bitcast(b.type, arith.shli(biased, b.int_const(23)))


def _by_constant(op: ir.Operation) -> float | None:
    """For x / c, c a constant (a scalar or a splat) whose reciprocal is a normal f32 (GELU's
    x / sqrt(2)): 1 / c, which the division becomes a product by (within an ulp of the
    quotient; a vector divide is one instruction of 10-16 cycles' throughput)."""
    owner = op.operands[1].owner
    if not isinstance(owner, ir.OpView) or owner.name != "arith.constant":
        return None
    attr = owner.attributes["value"]
    if isinstance(attr, ir.DenseFPElementsAttr):
        if not attr.is_splat:
            return None
        attr = attr.get_splat_value()
    if not isinstance(attr, ir.FloatAttr) or not math.isfinite(attr.value) or attr.value == 0:
        return None
    inverse = 1.0 / attr.value
    return inverse if 2.0**-126 <= abs(inverse) < 2.0**127 else None


def _erf(b: _Builder, x: ir.Value) -> ir.Value:
    ax = math_d.absf(x)
    t = arith.divf(b.const(1.0), b.fma(ax, b.const(_ERF_P), b.const(1.0)))
    poly = b.horner(t, tuple(reversed(_ERF_A)) + (0.0,))
    e = _exp_of_nonpositive(b, arith.negf(b.mul(ax, ax)))
    y = arith.subf(b.const(1.0), b.mul(poly, e))
    return math_d.copysign(y, x)


def _tanh(b: _Builder, x: ir.Value) -> ir.Value:
    e = _exp_of_nonpositive(b, b.mul(math_d.absf(x), b.const(-2.0)))
    y = arith.divf(arith.subf(b.const(1.0), e), b.add(b.const(1.0), e))
    return math_d.copysign(y, x)


# Set on a `math.exp` whose argument is never positive (a score minus its row's maximum, as
# the attention kernels write it): the pass then drops the overflow handling.
NONPOSITIVE = "kope.nonpositive"

_REWRITES: dict[str, Callable[[_Builder, ir.Value], ir.Value]] = {
    "math.exp": _exp,
    "math.erf": _erf,
    "math.tanh": _tanh,
}


def _nonpositive(value: ir.Value, generic: ir.Operation) -> bool:
    """Whether `value` (in the body of `generic`, a linalg.generic) is x - m, with x an element
    of a tensor and m that tensor's maximum over the dims a linalg.generic reduced (the max
    reduction softmax, log-softmax and logsumexp start with), read through the same maps so
    that m is the maximum of x's own row: never positive. Or an element of a tensor that
    another generic wrote such values into."""
    shift = defining_op(value)
    if shift is not None:
        return shift.name == "arith.subf" and _less_its_maximum(shift, generic)
    tensor = _input_of(value, generic)
    producer = defining_op(tensor) if tensor is not None else None
    if producer is None or producer.name != "linalg.generic":
        return False
    yielded = list(producer.regions[0].blocks[0].operations)[-1]
    return _nonpositive(yielded.operands[ir.OpResult(tensor).result_number], producer)


def _input_of(value: ir.Value, generic: ir.Operation) -> ir.Value | None:
    """The input tensor whose element `value` is, where it is one of `generic`'s block
    arguments for an input (not an output)."""
    if not isinstance(value, ir.BlockArgument) or value.owner.owner.operation != generic:
        return None
    index = value.arg_number
    return generic.operands[index] if index < len(generic.operands) - len(generic.results) else None


def _less_its_maximum(shift: ir.Operation, generic: ir.Operation) -> bool:
    x, m = (_input_of(value, generic) for value in shift.operands)
    reduce = defining_op(m) if m is not None else None
    if x is None or reduce is None or reduce.name != "linalg.generic" or len(reduce.operands) != 2:
        return False
    body = [op.name for op in reduce.regions[0].blocks[0].operations]
    if body != ["arith.maximumf", "linalg.yield"]:
        return False
    maps = [ir.AffineMapAttr(a).value for a in generic.attributes["indexing_maps"]]
    reduced = [ir.AffineMapAttr(a).value for a in reduce.attributes["indexing_maps"]]
    x_map, m_map = (maps[ir.BlockArgument(v).arg_number] for v in shift.operands)
    return reduce.operands[0] == x and [x_map, m_map] == reduced


def _is_f32(t: ir.Type) -> bool:
    element = t.element_type if isinstance(t, ir.VectorType) else t
    return isinstance(element, ir.F32Type)


@dataclass
class ApproximateMath(ModulePass):
    """Replace f32 exp, erf and tanh by vectorizable polynomial approximations, and divisions
    by a constant by products."""

    name = "kope-approximate-math"
    summary = "f32 exp/erf/tanh as polynomials in arith ops (vectorizable); x / c as x * (1/c)"

    def run(self, module: ir.Operation) -> None:
        for op in [op for op in nested_ops(module) if op.name == "arith.divf"]:
            inverse = _by_constant(op) if _is_f32(op.results[0].type) else None
            if inverse is not None:
                with ir.InsertionPoint(op), op.location:
                    b = _Builder(op.operands[0])
                    value = b.mul(op.operands[0], b.const(inverse))
                op.results[0].replace_all_uses_with(value)
                op.erase()
        targets = [
            op for op in nested_ops(module) if op.name in _REWRITES and _is_f32(op.results[0].type)
        ]
        for op in targets:
            rewrite = _REWRITES[op.name]
            if op.name == "math.exp" and (
                NONPOSITIVE in op.attributes or _nonpositive(op.operands[0], op.parent)
            ):
                rewrite = _exp_of_nonpositive
            with ir.InsertionPoint(op), op.location:
                value = rewrite(_Builder(op.operands[0]), op.operands[0])
            op.results[0].replace_all_uses_with(value)
            op.erase()
