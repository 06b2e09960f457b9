"""A `linalg.generic` body as Triton statements, and the values they compute.

A `Scalar` is a payload value at some coordinates: a Triton expression, or a literal. `Body`
evaluates a body with its loops bound to coordinates, one Triton statement per op: its block
arguments are its operands read through the lowering's `Scope` at the coordinates its indexing maps
give, and each `arith` or `math` op is filled into its template from the tables here (casts,
`linalg.index` and powers by a constant are written out instead). Anything else in a body is
`Unsupported`.
"""

from __future__ import annotations

import math

from torch_mlir import ir

from kope.spaces.triton_index import ZERO, Index, address, paren
from kope.spaces.triton_ir import Unsupported, element_type, maps, owner
from kope.spaces.triton_scope import Scalar, Scope

FLOATS = {"f16", "bf16", "f32", "f64"}


TL_TYPES = {
    "f32": "tl.float32",
    "f64": "tl.float64",
    "i1": "tl.int1",
    "i8": "tl.int8",
    "i16": "tl.int16",
    "i32": "tl.int32",
    "i64": "tl.int64",
}


def storage_type(dtype: str) -> str:
    """The Triton type of a tensor of torch dtype `dtype` ("bool" -> tl.int1)."""
    return "tl.int1" if dtype == "bool" else f"tl.{dtype}"


def literal(value: float | int | bool, kind: str) -> Scalar:
    if isinstance(value, bool) or kind == "i1":
        return Scalar(str(bool(value)), kind, value=bool(value))
    if isinstance(value, float) and not math.isfinite(value):
        return Scalar(f'float("{value}")', kind, value=value)
    return Scalar(repr(value), kind, value=value)


# -- body ops ----------------------------------------------------------------------------------

BINARY = {
    "arith.addf": "({0} + {1})",
    "arith.subf": "({0} - {1})",
    "arith.mulf": "({0} * {1})",
    "arith.divf": "({0} / {1})",
    "arith.addi": "({0} + {1})",
    "arith.subi": "({0} - {1})",
    "arith.muli": "({0} * {1})",
    "arith.andi": "({0} & {1})",
    "arith.ori": "({0} | {1})",
    "arith.xori": "({0} ^ {1})",
    "arith.maximumf": "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
    "arith.minimumf": "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
    "arith.maxnumf": "tl.maximum({0}, {1})",
    "arith.minnumf": "tl.minimum({0}, {1})",
    "arith.maxsi": "tl.maximum({0}, {1})",
    "arith.minsi": "tl.minimum({0}, {1})",
    "math.fma": "tl.fma({0}, {1}, {2})",
    "arith.select": "tl.where({0}, {1}, {2})",
}
UNARY = {
    "arith.negf": "(-{0})",
    "math.exp": "tl.exp({0})",
    "math.exp2": "tl.exp2({0})",
    # expm1 and log1p with the corrections that keep their digits near 0 (Kahan's, Goldberg's;
    # see kope.passes.small_arguments): exp(x) - 1 and log(1 + x) lose them all.
    # (the denominators where the other branch is taken are 1: no 0/0 computed and discarded)
    "math.expm1": "tl.where({0} > 80.0, tl.exp({0}), tl.where({0} < -20.0, tl.exp({0}) - 1.0, "
    "tl.where(tl.exp({0}) == 1.0, {0}, (tl.exp({0}) - 1.0) * "
    "({0} / tl.where(tl.exp({0}) == 1.0, 1.0, tl.log(tl.exp({0})))))))",
    "math.log": "tl.log({0})",
    "math.log2": "tl.log2({0})",
    "math.log1p": "tl.where({0} > 1e30, tl.log({0}), tl.where((1.0 + {0}) == 1.0, {0}, "
    "tl.log(1.0 + {0}) * ({0} / tl.where((1.0 + {0}) == 1.0, 1.0, (1.0 + {0}) - 1.0))))",
    "math.sqrt": "tl.sqrt({0})",
    "math.rsqrt": "tl.rsqrt({0})",
    "math.erf": "tl.erf({0})",
    "math.sin": "tl.sin({0})",
    "math.cos": "tl.cos({0})",
    "math.floor": "tl.floor({0})",
    "math.ceil": "tl.ceil({0})",
    "math.absf": "tl.abs({0})",
    "math.absi": "tl.abs({0})",
    # tl has no tanh outside libdevice; this form saturates to +-1 instead of overflowing.
    "math.tanh": "(2.0 * tl.sigmoid(2.0 * {0}) - 1.0)",
}
_NAN = "({0} != {0}) | ({1} != {1})"
CMPF = {  # arith.cmpf predicates by their enum value; unordered ones are true on NaN
    1: "({0} == {1})",
    2: "({0} > {1})",
    3: "({0} >= {1})",
    4: "({0} < {1})",
    5: "({0} <= {1})",
    6: "(({0} != {1}) & ({0} == {0}) & ({1} == {1}))",
    7: "(({0} == {0}) & ({1} == {1}))",
    8: "(({0} == {1}) | " + _NAN + ")",
    9: "(({0} > {1}) | " + _NAN + ")",
    10: "(({0} >= {1}) | " + _NAN + ")",
    11: "(({0} < {1}) | " + _NAN + ")",
    12: "(({0} <= {1}) | " + _NAN + ")",
    13: "({0} != {1})",
    14: "(" + _NAN + ")",
}
CMPI = {0: "({0} == {1})", 1: "({0} != {1})", 2: "({0} < {1})", 3: "({0} <= {1})"}
CMPI |= {4: "({0} > {1})", 5: "({0} >= {1})"}
CASTS = {
    "arith.extf",
    "arith.truncf",
    "arith.sitofp",
    "arith.fptosi",
    "arith.extsi",
    "arith.trunci",
    "arith.index_cast",
}


def constant(op: ir.Operation) -> Scalar:
    """An `arith.constant` (a scalar or a splat tensor) as a literal."""
    attr = op.attributes["value"]
    kind = element_type(op.results[0])
    if isinstance(attr, ir.DenseElementsAttr):
        if not attr.is_splat:
            raise Unsupported("a non-splat constant tensor")
        attr = attr.get_splat_value()
    if isinstance(attr, ir.BoolAttr):
        return literal(bool(attr.value), kind)
    if isinstance(attr, ir.FloatAttr):
        return literal(float(attr.value), kind)
    if isinstance(attr, ir.IntegerAttr):
        return literal(int(attr.value), kind)
    raise Unsupported(f"a constant {attr}")


class Body:
    """One evaluation of a `linalg.generic` body with its loops bound to coordinates."""

    def __init__(
        self,
        lowering: Scope,
        op: ir.Operation,
        loops: list[Index],
        bound: dict[ir.Value, Scalar] | None = None,
    ) -> None:
        self.lowering = lowering
        self.op = op
        self.loops = loops
        self.block = op.regions[0].blocks[0]
        self.maps = maps(op)
        self.memo: dict[ir.Value, Scalar] = dict(bound or {})  # block arguments given values

    def scalar(self, value: ir.Value) -> Scalar:
        if value not in self.memo:
            self.memo[value] = self._scalar(value)
        return self.memo[value]

    def _scalar(self, value: ir.Value) -> Scalar:
        low = self.lowering
        if isinstance(value, ir.BlockArgument) and value.owner == self.block:
            operand = self.op.operands[value.arg_number]
            if not isinstance(operand.type, ir.ShapedType):
                return self.outside(operand)
            return low.element(operand, address(self.maps[value.arg_number], self.loops))
        op = owner(value)
        if op is None or op.block != self.block:
            return self.outside(value)
        name = op.name
        kind = element_type(value)
        if name == "arith.constant":
            return constant(op)
        if name == "linalg.index":
            index = self.loops[ir.IntegerAttr(op.attributes["dim"]).value]
            if index == ZERO:
                return literal(0, "index")
            if index.axes and index.axes <= low.loop_vars:  # a Python int under a static loop
                return low.emit(
                    f"tl.zeros([], tl.int32) + {paren(index.code)}", "index", index.axes
                )
            return Scalar(paren(index.code), "index", index.axes)
        args = [self.scalar(v) for v in op.operands]
        axes = frozenset().union(*(a.axes for a in args))
        low = low.scope_of(axes)  # what does not vary in a loop is computed before it
        if name in CASTS:
            return low.cast(args[0], kind)
        if name == "arith.uitofp" and args[0].type == "i1":
            return low.cast(args[0], kind)
        if name == "arith.extui" and args[0].type == "i1":
            return low.cast(args[0], kind)
        if name in ("math.powf", "math.fpowi"):
            return self.power(low, args)
        template = self.template(op, args)
        if all(a.literal for a in args):  # keep the result a tensor, whatever tl takes
            args[0] = Scalar(low.tensor_of(args[0]), args[0].type)
        elif template.startswith("tl."):
            args = [Scalar(low.tensor_of(a), a.type, a.axes) for a in args]
        return low.emit(template.format(*(a.code for a in args)), kind, axes)

    def template(self, op: ir.Operation, args: list[Scalar]) -> str:
        name = op.name
        if name == "arith.cmpf":
            predicate = ir.IntegerAttr(op.attributes["predicate"]).value
            if predicate in CMPF:
                return CMPF[predicate]
        elif name == "arith.cmpi":
            predicate = ir.IntegerAttr(op.attributes["predicate"]).value
            if predicate in CMPI:
                return CMPI[predicate]
        elif name in BINARY:
            return BINARY[name]
        elif name in UNARY:
            return UNARY[name]
        raise Unsupported(f"{name} in an op body")

    def power(self, low: Scope, args: list[Scalar]) -> Scalar:
        """x ** y for a constant y: a small integer multiplies; a fraction goes through
        exp2/log2, right for any base since a negative one has no real power. A variable y
        could be an integer at run time, which exp2/log2 gets wrong for a negative base."""
        base, exponent = args
        if not exponent.literal:
            raise Unsupported("a power with a variable exponent")
        assert exponent.value is not None
        n = float(exponent.value)
        x = low.tensor_of(base)
        if n == 0.5:
            return low.emit(f"tl.sqrt({x})", base.type, base.axes)
        if n == -0.5:
            return low.emit(f"tl.rsqrt({x})", base.type, base.axes)
        if n != int(n):
            return low.emit(f"tl.exp2({n!r} * tl.log2({x}))", base.type, base.axes)
        if abs(n) > 16:
            raise Unsupported(f"a power by the large integer {n:g}")
        product = " * ".join([x] * int(abs(n))) or "1.0"
        code = f"(1.0 / ({product}))" if n < 0 else f"({product})"
        return low.emit(code, base.type, base.axes)

    def outside(self, value: ir.Value) -> Scalar:
        """A scalar defined outside the body: only constants are."""
        op = owner(value)
        if op is not None and op.name == "arith.constant":
            return constant(op)
        raise Unsupported("a scalar operand that is not a constant")
