"""`kope-expand-powers`: integer powers as multiplications, so that they vectorize and lower.

`x.pow(2)` lowers to `math.fpowi %x, %c2_i64`. Scalar, it becomes `llvm.intr.powi`, whose
exponent must be a scalar integer; vectorized, the exponent is a `vector<32xi64>` and the
lowering produces invalid IR (`'llvm.intr.powi' op operand #1 must be signless integer`),
so every schedule of every integer power failed to compile. `math.ipowi` has no LLVM
lowering at all. This pass rewrites, on scalars and vectors alike:

- `fpowi` and `ipowi` by a constant exponent n (a scalar or splat constant, possibly
  broadcast) into a chain of multiplications by repeated squaring — the order LLVM's own
  expansion of `powi` uses (lowest bit first), so a scalar result is bit for bit what the
  reference lowering computes; a negative n takes the reciprocal (`fpowi` only: integer
  powers by negative exponents are left as they are);
- a vector `fpowi` by a non-constant exponent into `math.powf(x, sitofp(n))`, which lowers
  lane by lane; scalar ones keep `llvm.intr.powi`.

Run it before vectorization (a constant exponent then never becomes a vector operand) and in
the lowering (for kernels written by hand or by a language model).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import arith
from torch_mlir.dialects import math as math_d

from kope.passes.base import ModulePass, nested_ops

MAX_MULTIPLIES = 64  # beyond this (|n| >= 2^32) the chain is longer than a libcall is slow


def _constant_exponent(value: ir.Value) -> int | None:
    """The integer `value` always holds (scalar, splat or broadcast constant), if known."""
    owner = value.owner
    op = owner.operation if hasattr(owner, "operation") else owner
    if not isinstance(op, ir.Operation):
        return None
    if op.name == "vector.broadcast":
        return _constant_exponent(op.operands[0])
    if op.name != "arith.constant":
        return None
    attr = op.attributes["value"]
    if isinstance(attr, ir.IntegerAttr):
        return ir.IntegerAttr(attr).value
    if isinstance(attr, ir.DenseIntElementsAttr) and ir.DenseElementsAttr(attr).is_splat:
        splat = ir.DenseElementsAttr(attr).get_splat_value()
        return ir.IntegerAttr(splat).value
    return None


def _one(like: ir.Type) -> ir.Value:
    element = like.element_type if isinstance(like, ir.VectorType) else like
    scalar = (
        ir.FloatAttr.get(element, 1.0)
        if isinstance(element, ir.FloatType)
        else ir.IntegerAttr.get(element, 1)
    )
    if isinstance(like, ir.VectorType):
        return arith.constant(like, ir.DenseElementsAttr.get_splat(like, scalar))
    return arith.constant(like, scalar)


def _power(base: ir.Value, exponent: int, floating: bool) -> ir.Value:
    """base^|exponent| by repeated squaring, lowest bit first (as LLVM expands powi)."""
    multiply = arith.mulf if floating else arith.muli
    result: ir.Value | None = None
    square = base
    n = abs(exponent)
    while n:
        if n & 1:
            result = square if result is None else multiply(result, square)
        n >>= 1
        if n:
            square = multiply(square, square)
    return result if result is not None else _one(base.type)


@dataclass
class ExpandPowers(ModulePass):
    """Rewrite math.fpowi / math.ipowi into multiplications (constant exponents) or powf."""

    name = "kope-expand-powers"
    summary = "Integer powers as multiplication chains (constant exponents) or powf (vectors)"

    def run(self, module: ir.Operation) -> None:
        for op in [op for op in nested_ops(module) if op.name in ("math.fpowi", "math.ipowi")]:
            with ir.InsertionPoint(op), op.location:
                value = self._rewrite(op)
            if value is not None:
                op.results[0].replace_all_uses_with(value)
                op.erase()

    @staticmethod
    def _rewrite(op: ir.Operation) -> ir.Value | None:
        base, exponent = op.operands[0], op.operands[1]
        floating = op.name == "math.fpowi"
        n = _constant_exponent(exponent)
        if n is not None and abs(n).bit_length() * 2 <= MAX_MULTIPLIES:
            if n < 0 and not floating:
                return None  # 1/x^n in integers: left to whoever lowers ipowi
            power = _power(base, n, floating)
            return arith.divf(_one(base.type), power) if n < 0 else power
        if floating and isinstance(base.type, ir.VectorType):
            return math_d.powf(base, arith.sitofp(base.type, exponent))
        return None
