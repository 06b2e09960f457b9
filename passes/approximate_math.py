"""`kope-approximate-math`: f32 `math.exp`, `expm1`, `erf`, `tanh`, `log`, `log1p` as polynomials.

LLVM lowers a vector `math.exp` (or `log`, ...) to one scalar libm call per lane, which
dominates softmax, GELU, ELU, softplus and the like once everything else is vectorized.
Rewritten as range reduction plus a polynomial (Cephes-style `exp` and `log`, `expm1` from
`exp`'s reduction, Abramowitz–Stegun 7.1.26 `erf`, `tanh` from `expm1`, `log1p` from `log` with
Goldberg's correction), they vectorize with the rest of the loop. Accuracy (measured over dense
grids): `exp` within 1.5 ulp on normal results (0 below the normal range, ±Inf and NaN as IEEE
says), `erf` within 5e-7 absolute; `log`, `log1p`, `expm1` and `tanh` (relative, small
arguments too) are held to a few ulp by `test_polynomial_math_stays_within_a_few_ulp`. An
exp of a number never positive needs no overflow handling, which is a third of the
polynomial's cost: erf's and tanh's own (tanh's an expm1), softmax's and log-softmax's x minus
its row's maximum (found in the payload: `_nonpositive`), and attention's (marked
`NONPOSITIVE` by the kernel that writes it); 11-20%
off those kernels here. An op on values that stay the same along a row keeps its libm call
(`_same_along_rows`). A division by a constant becomes a product by its reciprocal (within
an ulp; GELU divides every element by sqrt(2), and its kernel ran 9% faster without the
divide). Replacing the other divisions (sigmoid's and SiLU's by 1 + exp(-x)) by a
reciprocal estimate and Newton steps made those kernels 10-15% slower
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
from kope.passes.small_arguments import log1p_from_log

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
_EXPM1_MIN = -88.0  # below: -1 (2^n would be 0, and n's bits are not a float's below it)
_FLT_MIN = 1.17549435e-38  # the smallest normal f32: below it log scales x by 2^23
_SQRT_HALF = 0.707106781186547524
_LOG_POLY = (
    7.0376836292e-2,
    -1.1514610310e-1,
    1.1676998740e-1,
    -1.2420140846e-1,
    1.4249322787e-1,
    -1.6668057665e-1,
    2.0000714765e-1,
    -2.4999993993e-1,
    3.3333331174e-1,
)
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
    """exp(x) as 2^n * (1 + q): n = round(x / ln 2) (a float) and q = exp(x - n ln 2) - 1, the
    polynomial (kept apart from its 1 for expm1, whose q is exact near 0); scaling by 2^n
    and the range's ends are the callers'."""
    n = math_d.floor(b.fma(x, b.const(_LOG2E), b.const(0.5)))
    r = b.fma(n, b.const(-_LN2_HI), x)
    r = b.fma(n, b.const(-_LN2_LO), r)
    r2 = b.mul(r, r)
    p = b.horner(r, _EXP_POLY)
    return n, b.fma(p, r2, r)


def _overflowing(
    b: _Builder, x: ir.Value, n: ir.Value, scaled: Callable[[ir.Value], ir.Value]
) -> ir.Value:
    """`scaled(2^n)` for n up to 128 and +Inf above the largest exp that is a float: n spans
    [-126, 128] where the value is used, and 2^128 is not a float, so n = 128 (x within 0.35
    of that largest exp) is 2 * `scaled(2^127)`."""
    top = b.const(127.0)
    y = scaled(_pow2(b, arith.fptosi(b.int_type, arith.minimumf(n, top))))
    y = b.mul(y, b.select("OGT", n, top, b.const(2.0), b.const(1.0)))
    return b.select("OGT", x, b.const(_EXP_MAX), b.const(math.inf), y)


def _exp(b: _Builder, x: ir.Value) -> ir.Value:
    n, q = _exp_reduced(b, x)
    p = b.add(q, b.const(1.0))
    y = _overflowing(b, x, n, lambda s: b.mul(p, s))
    return b.select("OLT", x, b.const(_EXP_MIN), b.const(0.0), y)


def _exp_of_nonpositive(b: _Builder, x: ir.Value) -> ir.Value:
    """exp(x) for x <= 0 (erf's exp(-x^2), tanh's exp(-2|x|)): `_exp` without its overflow
    handling, 2^n in one step (n is in [-126, 0] where the value is used)."""
    n, q = _exp_reduced(b, x)
    y = b.mul(b.add(q, b.const(1.0)), _pow2(b, arith.fptosi(b.int_type, n)))
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
    """tanh |x| = e / (-2 - e) with e = expm1(-2|x|), its sign restored: e is exact near 0,
    so a small x keeps its digits (from exp, (1 - e) / (1 + e) lost them: tanh(1e-5) came
    out 3e-3 off), at exp's cost."""
    e = _expm1_of_nonpositive(b, b.mul(math_d.absf(x), b.const(-2.0)))
    y = arith.divf(e, arith.subf(b.const(-2.0), e))
    return math_d.copysign(y, x)


def _expm1_of_nonpositive(b: _Builder, x: ir.Value) -> ir.Value:
    """expm1(x) for x <= 0: `_expm1` without its overflow handling (n is in [-127, 0]; 2^-127
    is 0 here, and 2^n q + (2^n - 1) then -1)."""
    n, q = _exp_reduced(b, x)
    y = _expm1_scaled(b, q, _pow2(b, arith.fptosi(b.int_type, n)))
    return _expm1_underflow(b, x, y)


def _expm1_scaled(b: _Builder, q: ir.Value, s: ir.Value) -> ir.Value:
    """2^n q + (2^n - 1), s = 2^n: exp(x) - 1 in one rounding (n = 0 gives q itself)."""
    return b.fma(s, q, arith.subf(s, b.const(1.0)))


def _expm1_underflow(b: _Builder, x: ir.Value, y: ir.Value) -> ir.Value:
    """-1 below expm1's range, where 2^n is 0 or its bits are not."""
    return b.select("OLT", x, b.const(_EXPM1_MIN), b.const(-1.0), y)


def _expm1(b: _Builder, x: ir.Value) -> ir.Value:
    """exp(x) - 1 as 2^n q + (2^n - 1) (one rounding; n = 0 gives q itself, exact near 0),
    with `_exp`'s overflow handling; -1 below the range, where 2^n is 0 or its bits are not."""
    n, q = _exp_reduced(b, x)
    y = _overflowing(b, x, n, lambda s: _expm1_scaled(b, q, s))
    return _expm1_underflow(b, x, y)


def _log(b: _Builder, x: ir.Value) -> ir.Value:
    """log(x) (Cephes' logf): x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) by a polynomial
    in m - 1, e ln 2 in two parts. A subnormal x is scaled into the normal range first; 0
    gives -inf, +inf itself, a negative x or NaN NaN."""
    subnormal = arith.cmpf(arith.CmpFPredicate.OLT, x, b.const(_FLT_MIN))
    xs = arith.select(subnormal, b.mul(x, b.const(2.0**23)), x)
    bits = arith.bitcast(b.int_type, xs)
    exponent = arith.subi(arith.shrui(bits, b.int_const(23)), b.int_const(126))
    mantissa_bits = arith.ori(arith.andi(bits, b.int_const(0x007FFFFF)), b.int_const(0x3F000000))
    m = arith.bitcast(b.type, mantissa_bits)  # in [0.5, 1)
    e = arith.sitofp(b.type, exponent)
    e = arith.subf(e, arith.select(subnormal, b.const(23.0), b.const(0.0)))
    low = arith.cmpf(arith.CmpFPredicate.OLT, m, b.const(_SQRT_HALF))
    e = arith.subf(e, arith.select(low, b.const(1.0), b.const(0.0)))
    f = arith.subf(arith.select(low, b.add(m, m), m), b.const(1.0))
    z = b.mul(f, f)
    y = b.mul(b.mul(b.horner(f, _LOG_POLY), f), z)
    y = b.fma(e, b.const(_LN2_LO), y)
    y = b.fma(z, b.const(-0.5), y)
    y = b.fma(e, b.const(_LN2_HI), b.add(f, y))
    y = b.select("OEQ", x, b.const(math.inf), x, y)
    y = b.select("OEQ", x, b.const(0.0), b.const(-math.inf), y)
    return b.select("ULT", x, b.const(0.0), b.const(math.nan), y)  # x < 0 or NaN


def _log1p(b: _Builder, x: ir.Value) -> ir.Value:
    """log(1 + x) with the digits 1 + x rounds away put back: the exact lowering's form
    (`kope-expand-log1p-expm1`), its log the polynomial."""
    return log1p_from_log(x, lambda u: _log(b, u))


# Set on a `math.exp` whose argument is never positive (a score minus its row's maximum, as
# the attention kernels write it): the pass then drops the overflow handling.
NONPOSITIVE = "kope.nonpositive"

_REWRITES: dict[str, Callable[[_Builder, ir.Value], ir.Value]] = {
    "math.exp": _exp,
    "math.expm1": _expm1,
    "math.erf": _erf,
    "math.tanh": _tanh,
    "math.log": _log,
    "math.log1p": _log1p,
}
#: The math ops this pass rewrites: a kernel whose payload has one may opt in.
APPROXIMATED = frozenset(_REWRITES)


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


def _indexing_maps(generic: ir.Operation) -> list[ir.AffineMap]:
    return [ir.AffineMapAttr(a).value for a in generic.attributes["indexing_maps"]]


def _less_its_maximum(shift: ir.Operation, generic: ir.Operation) -> bool:
    x, m = (_input_of(value, generic) for value in shift.operands)
    reduce = defining_op(m) if m is not None else None
    if x is None or reduce is None or reduce.name != "linalg.generic" or len(reduce.operands) != 2:
        return False
    body = [op.name for op in reduce.regions[0].blocks[0].operations]
    if body != ["arith.maximumf", "linalg.yield"]:
        return False
    maps = _indexing_maps(generic)
    x_map, m_map = (maps[ir.BlockArgument(v).arg_number] for v in shift.operands)
    return reduce.operands[0] == x and [x_map, m_map] == _indexing_maps(reduce)


def _dims(expr: ir.AffineExpr) -> set[int]:
    """The loop dims an indexing map's result reads (d0 + d2 for a window: both)."""
    expr = expr.maybe_downcast()
    if isinstance(expr, ir.AffineDimExpr):
        return {expr.position}
    if isinstance(expr, ir.AffineBinaryExpr):
        return _dims(expr.lhs) | _dims(expr.rhs)
    return set()


def _same_along_rows(op: ir.Operation) -> bool:
    """Whether `op`, in a linalg.generic's body, computes on elements that do not change along
    the innermost loop (the row a vector covers): log-softmax's log of its row's sum, which
    fusion moved into the loop over every element. Vectorized, such an op takes a splat that
    LLVM computes with one scalar libm call; as a polynomial it would be computed across the
    whole vector at every step (log-softmax on 129x513 ran 12% slower)."""
    generic = op.parent
    if generic is None or generic.name != "linalg.generic":
        return False
    maps = _indexing_maps(generic)
    innermost = maps[0].n_dims - 1
    pending = list(op.operands)
    seen: dict[int, ir.Operation] = {}  # by id, each held: a freed wrapper's id is reused
    while pending:
        value = pending.pop()
        if isinstance(value, ir.BlockArgument):
            if value.owner.owner.operation != generic:
                return False  # defined outside the body: nothing known of it
            if any(innermost in _dims(e) for e in maps[value.arg_number].results):
                return False
            continue
        producer = defining_op(value)
        if producer is None or producer.name == "linalg.index":
            return False
        if id(producer) not in seen:
            seen[id(producer)] = producer
            pending.extend(producer.operands)
    return True


def _is_f32(t: ir.Type) -> bool:
    element = t.element_type if isinstance(t, ir.VectorType) else t
    return isinstance(element, ir.F32Type)


@dataclass
class ApproximateMath(ModulePass):
    """Replace f32 exp, expm1, erf, tanh, log and log1p by vectorizable polynomial
    approximations, and divisions by a constant by products."""

    name = "kope-approximate-math"
    summary = (
        "f32 exp/expm1/erf/tanh/log/log1p as polynomials in arith ops (vectorizable); "
        "x / c as x * (1/c)"
    )

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
            op
            for op in nested_ops(module)
            if op.name in _REWRITES and _is_f32(op.results[0].type) and not _same_along_rows(op)
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
