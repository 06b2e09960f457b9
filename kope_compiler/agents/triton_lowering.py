"""Linalg payloads as Triton expressions: the half of `kope.agents.triton_kernels` that reads IR.

A kernel family (`triton_kernels`) lays out its block coordinates; a `Lowering` then evaluates
any tensor of the payload at a tuple of coordinates by walking back from the value: through
reshapes (re-linearizing the index), through a `linalg.generic` (its output map binds the
loops, its input maps address its operands, its body becomes one Triton statement per op)
and down to the function's arguments, which are masked loads. Nothing is keyed on what the
operator is called: whatever payload is built from these pieces is translated, and whatever
is not raises `Unsupported` with the reason.

Indexing maps may be compound (`d2 * 2 + d4`: a window of a pooling or a convolution); the
coordinates are evaluated as Triton integer expressions. A `tensor.pad` is a virtual tensor:
in bounds it is its source moved by the low padding, elsewhere the padding constant (a masked
load with that constant as `other`). A reduction either lies along a block of the family
(`Frame.reduction`: one `tl.sum`/`tl.max`/`tl.argmax`) or, when the family loops
(`Frame.looped`), runs the op's body itself over the reduced loops with its accumulators
carried in variables: any body, in the sequential order linalg defines. What a loop's body
reads that does not vary with its variable is computed once, before the loop.

Floating values are computed in float32 (float16 and bfloat16 loads are widened; float64
intermediates of a payload whose tensors are all narrower are kept in float32, since torch-mlir
widens only its scalar arithmetic and Ascend has no float64 vector unit) and cast at the store.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from kope.passes.analysis import _loops, _main, prepare_payload

RESHAPES = {"tensor.expand_shape", "tensor.collapse_shape"}
FUNC_LEVEL = RESHAPES | {
    "arith.constant",
    "tensor.empty",
    "tensor.pad",
    "linalg.generic",
    "func.return",
}
FLOATS = {"f16", "bf16", "f32", "f64"}
ATOM = re.compile(r"\w+(\[[^\]]*\])?")  # a name or literal, possibly subscripted


class Unsupported(Exception):
    """The payload needs something these kernel templates do not do; the message says what."""


@dataclass(frozen=True)
class Index:
    """One coordinate of a tensor access: an integer Triton expression, the block axes and
    loop variables it varies along, and the conditions under which it is in range.

    A coordinate that is affine in simpler ones (atoms: a name, a div or a mod) also keeps
    that form, `terms` (atom code, atom axes, coefficient) and `constant`, so that a loop can
    compute the part that does not vary with it before the loop (`Lowering.split`)."""

    code: str
    axes: frozenset[str] = frozenset()
    masks: frozenset[str] = frozenset()
    terms: tuple[tuple[str, frozenset[str], int], ...] = ()
    constant: int = 0


ZERO = Index("0")


@dataclass(frozen=True)
class Scalar:
    """A payload value at some coordinates: a Triton expression, or a literal when `value` is
    set. `type` is the MLIR element type the payload gives it (f16, i1, index, ...)."""

    code: str
    type: str
    axes: frozenset[str] = frozenset()
    value: float | int | bool | None = None

    @property
    def literal(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class Looped:
    """How a family that reduces by looping holds an accumulator: its block shape (a Triton
    shape list, "[BLOCK]") and the block axes a value of that shape varies along."""

    shape: str
    axes: frozenset[str]


class Frame(Protocol):
    """What a kernel family provides to a lowering beyond coordinates."""

    def reduction(self, extents: list[int]) -> tuple[list[Index], str]:
        """Coordinates for reduced loops of these extents and the mask of the lanes in range."""
        ...

    def looped(self, extents: list[int]) -> Looped | None:
        """The accumulators' block when the family reduces loops of these extents by looping
        over them inside the kernel; None when it reduces along its block (`reduction`)."""
        ...

    def contraction(self, op: ir.Operation, idx: tuple[Index, ...]) -> Scalar | None:
        """The family's own value for `op`'s result at `idx` (a matmul's accumulator)."""
        ...


# -- the payload --------------------------------------------------------------------------------


@dataclass
class Payload:
    """A payload cleaned by `prepare_payload` and generalized, with its function's values."""

    context: ir.Context
    module: ir.Module
    func: ir.Operation
    arguments: list[ir.Value]
    results: list[ir.Value]
    ops: list[ir.Operation]  # the function's ops in program order

    @classmethod
    def parse(cls, text: str) -> Payload:
        try:
            prepared = prepare_payload(text)
        except Exception as err:  # a pipeline failure is a reason, not a crash
            raise Unsupported(f"the payload does not clean up: {err}") from err
        context = ir.Context()
        context.enable_multithreading(False)
        module = ir.Module.parse(prepared, context)
        with context:
            PassManager.parse("builtin.module(func.func(linalg-generalize-named-ops))").run(
                module.operation
            )
        func = _main(module)
        block = func.regions[0].blocks[0]
        ops = [op.operation for op in block.operations]
        return cls(context, module, func, list(block.arguments), list(ops[-1].operands), ops)

    def generics(self) -> list[ir.Operation]:
        return [op for op in self.ops if op.name == "linalg.generic"]

    def is_argument(self, value: ir.Value) -> bool:
        return isinstance(value, ir.BlockArgument) and value.owner == self.func_block

    @property
    def func_block(self) -> ir.Block:
        return self.func.regions[0].blocks[0]


def maps(op: ir.Operation) -> list[ir.AffineMap]:
    return [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]


def iterators(op: ir.Operation) -> list[str]:
    return _loops(op)[0]


def ranges(op: ir.Operation) -> list[int]:
    return _loops(op)[1]


def dim_positions(amap: ir.AffineMap) -> list[int | None]:
    """The loop each result of a map reads (None for a constant)."""
    found: list[int | None] = []
    for expr in amap.results:
        if isinstance(expr, ir.AffineDimExpr):
            found.append(expr.position)
        elif isinstance(expr, ir.AffineConstantExpr):
            found.append(None)
        else:
            raise Unsupported(f"an indexing map with a compound expression ({amap})")
    return found


def shape(value: ir.Value) -> tuple[int, ...]:
    shaped = ir.ShapedType(value.type)
    if not shaped.has_static_shape:
        raise Unsupported(f"a dynamic shape ({value.type})")
    return tuple(shaped.shape)


def element_type(value: ir.Value) -> str:
    kind = value.type
    return str(ir.ShapedType(kind).element_type if isinstance(kind, ir.ShapedType) else kind)


def owner(value: ir.Value) -> ir.Operation | None:
    if isinstance(value, ir.BlockArgument):
        return None
    op = value.owner
    return op.operation if hasattr(op, "operation") else op


def strip_reshapes(value: ir.Value) -> ir.Value:
    """The value a chain of reshapes starts from (row-major order is the same memory)."""
    while (op := owner(value)) is not None and op.name in RESHAPES:
        value = op.operands[0]
    return value


def reassociation(op: ir.Operation) -> list[list[int]]:
    groups = ir.ArrayAttr(op.attributes["reassociation"])
    return [[ir.IntegerAttr(i).value for i in ir.ArrayAttr(group)] for group in groups]


# -- index arithmetic --------------------------------------------------------------------------


def plain(amap: ir.AffineMap) -> bool:
    """Whether every result of a map is a loop or a constant (no window arithmetic)."""
    return all(isinstance(e, ir.AffineDimExpr | ir.AffineConstantExpr) for e in amap.results)


def address(amap: ir.AffineMap, loops: Sequence[Index]) -> tuple[Index, ...]:
    """The coordinates an indexing map reads with its loops at `loops`."""
    return tuple(affine(expr, loops) for expr in amap.results)


def affine(expr: ir.AffineExpr, loops: Sequence[Index]) -> Index:
    """An affine expression of the loops as an integer coordinate (constants folded)."""
    if isinstance(expr, ir.AffineDimExpr):
        return loops[expr.position]
    if isinstance(expr, ir.AffineConstantExpr):
        return number(expr.value)
    if isinstance(expr, ir.AffineAddExpr):
        return combine(affine(expr.lhs, loops), "+", affine(expr.rhs, loops))
    if isinstance(expr, ir.AffineMulExpr):
        return combine(affine(expr.lhs, loops), "*", affine(expr.rhs, loops))
    if isinstance(expr, ir.AffineFloorDivExpr | ir.AffineModExpr):
        # Coordinates of the lanes in range are never negative, where // and % agree with
        # floordiv and mod; the lanes out of range are masked whatever they compute.
        operator = "//" if isinstance(expr, ir.AffineFloorDivExpr) else "%"
        return combine(affine(expr.lhs, loops), operator, affine(expr.rhs, loops))
    raise Unsupported(f"the affine expression {expr} in an indexing map")


def number(value: int) -> Index:
    return ZERO if value == 0 else Index(str(value))


def constant_of(index: Index) -> int | None:
    """The value of a constant coordinate, None for a varying one."""
    try:
        return int(index.code)
    except ValueError:
        return None


Form = tuple[dict[tuple[str, frozenset[str]], int], int]  # coefficient per atom, constant


def form(index: Index) -> Form:
    """The affine form of a coordinate (an atom is its own single term)."""
    if index.terms:
        return {(code, axes): k for code, axes, k in index.terms}, index.constant
    known = constant_of(index)
    if known is not None:
        return {}, known
    return {(index.code, index.axes): 1}, 0


def affine_index(parts: list[tuple[Index, int]], code: str) -> Index:
    """The coordinate sum(coefficient * index), written `code`, with its affine form."""
    coefficients: dict[tuple[str, frozenset[str]], int] = {}
    constant = 0
    for index, scale in parts:
        atoms, offset = form(index)
        for atom, k in atoms.items():
            coefficients[atom] = coefficients.get(atom, 0) + scale * k
        constant += scale * offset
    return Index(
        code,
        frozenset().union(*(i.axes for i, _ in parts)),
        frozenset().union(*(i.masks for i, _ in parts)),
        tuple((atom, axes, k) for (atom, axes), k in coefficients.items() if k),
        constant,
    )


def combine(a: Index, operator: str, b: Index) -> Index:
    """`a <operator> b` as a coordinate: constants fold, and + 0, * 1, * 0 vanish."""
    ka, kb = constant_of(a), constant_of(b)
    if ka is not None and kb is not None:
        folded = {"+": ka + kb, "*": ka * kb, "//": ka // kb, "%": ka % kb}[operator]
        return number(folded)
    if operator == "+" and (ka == 0 or kb == 0):
        return b if ka == 0 else a
    if operator == "*" and (ka == 0 or kb == 0):
        return ZERO
    if operator in ("*", "//") and kb == 1:
        return a
    if operator == "*" and ka == 1:
        return b
    if operator == "+" and kb is not None and kb < 0:
        code = f"{paren(a.code)} - {-kb}"
    else:
        code = f"{paren(a.code)} {operator} {paren(b.code)}"
    if operator == "+":
        return affine_index([(a, 1), (b, 1)], f"({code})")
    if operator == "*" and (ka is not None or kb is not None):
        return affine_index([(b, ka) if ka is not None else (a, kb or 0)], f"({code})")
    return Index(f"({code})", a.axes | b.axes, a.masks | b.masks)


def strides(dims: Sequence[int]) -> list[int]:
    return [math.prod(dims[i + 1 :]) for i in range(len(dims))]


def linearize(idx: Sequence[Index], dims: Sequence[int]) -> Index:
    """The row-major offset of `idx` in a tensor of `dims` (unit dims are always at 0)."""
    terms = [(i, s) for i, s, d in zip(idx, strides(dims), dims, strict=True) if d != 1]
    terms = [(i, s) for i, s in terms if i != ZERO]
    if not terms:
        return ZERO
    if len(terms) == 1 and terms[0][1] == 1:
        return terms[0][0]
    code = " + ".join(i.code if s == 1 else f"{paren(i.code)} * {s}" for i, s in terms)
    return affine_index(terms, f"({code})")


def _sum(terms: list[tuple[str, int]], constant: int) -> str:
    """sum(coefficient * code) + constant as an expression ("0" when empty)."""
    parts = [(k, paren(code) if abs(k) == 1 else f"{paren(code)} * {abs(k)}") for code, k in terms]
    if constant:
        parts.append((constant, str(abs(constant))))
    if not parts:
        return "0"
    text = ("-" if parts[0][0] < 0 else "") + parts[0][1]
    for k, magnitude in parts[1:]:
        text += f" {'-' if k < 0 else '+'} {magnitude}"
    return text


def delinearize(index: Index, dims: Sequence[int]) -> list[Index]:
    """The row-major coordinates in `dims` of the offset `index`."""
    live = [k for k, d in enumerate(dims) if d != 1]
    found = [ZERO] * len(dims)
    for k in live:
        stride = math.prod(dims[k + 1 :])
        code = paren(index.code)
        if k != live[0]:  # the leading coordinate needs no modulus: the offset is in range
            code = f"({code} // {stride}) % {dims[k]}" if stride > 1 else f"{code} % {dims[k]}"
        elif stride > 1:
            code = f"{code} // {stride}"
        found[k] = index if len(live) == 1 else Index(code, index.axes, index.masks)
    return found


def paren(code: str) -> str:
    """`code` safe to follow with an operator or an attribute."""
    return code if ATOM.fullmatch(code) or _enclosed(code) else f"({code})"


def _enclosed(code: str) -> bool:
    """Whether the first parenthesis of `code` closes at its end."""
    depth = 0
    for position, char in enumerate(code):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return position == len(code) - 1 and char == ")"
    return False


# -- types ---------------------------------------------------------------------------------------

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
    "math.expm1": "(tl.exp({0}) - 1.0)",
    "math.log": "tl.log({0})",
    "math.log2": "tl.log2({0})",
    "math.log1p": "tl.log(1.0 + {0})",
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
UNROLL = 64  # most iterations of a looped reduction's static (unrolled) inner loops
# Reductions by their combining op: the tl reduction, its identity, and how to fold an init.
COMBINERS: dict[str, tuple[str, float, str]] = {
    "arith.addf": ("tl.sum", 0.0, "({0} + {1})"),
    "arith.addi": ("tl.sum", 0, "({0} + {1})"),
    "arith.maximumf": ("tl.max", -math.inf, BINARY["arith.maximumf"]),
    "arith.maxnumf": ("tl.max", -math.inf, "tl.maximum({0}, {1})"),
    "arith.minimumf": ("tl.min", math.inf, BINARY["arith.minimumf"]),
    "arith.minnumf": ("tl.min", math.inf, "tl.minimum({0}, {1})"),
}
# Combiners whose result is NaN when a term is, which tl.max and tl.min (maxnum) are not.
NAN_PROPAGATING = {"arith.maximumf", "arith.minimumf"}


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


# -- the lowering ------------------------------------------------------------------------------


class Lowering:
    """Evaluates payload tensors at coordinates, emitting Triton statements into `lines`."""

    def __init__(
        self,
        payload: Payload,
        frame: Frame,
        names: Sequence[str],
        dtypes: Sequence[str],
        float64: bool = False,
        parent: Lowering | None = None,
        loop_axes: frozenset[str] = frozenset(),
    ) -> None:
        self.payload = payload
        self.frame = frame
        self.names = list(names)  # the kernel's pointer per function argument
        self.dtypes = list(dtypes)  # torch dtype per function argument
        self.lines: list[str] = []
        self.parent = parent
        self.memo: dict[Any, Scalar] = {}  # what this scope computed; its parents' count too
        # The variables of the loop this scope is the body of: a value that varies along none
        # of them is computed in the enclosing scope. Empty: nothing leaves this scope.
        self.loop_axes = loop_axes
        # Offsets a family already has as a variable: (coordinates, dims) -> code.
        self.flat: dict[tuple[tuple[Index, ...], tuple[int, ...]], str] = (
            parent.flat if parent else {}
        )
        # Shared with child scopes: variable names, block loads and the loop variables.
        self.counter: list[int] = parent.counter if parent else [0]
        self.vector_loads: list[int] = parent.vector_loads if parent else [0]
        self.loop_vars: set[str] = parent.loop_vars if parent else set()
        self.f64 = "f64" if float64 else "f32"  # float64 tensors: keep its precision

    def child(self, loop_axes: frozenset[str] = frozenset()) -> Lowering:
        """A scope for a loop body: it reuses what was computed before the loop, and what it
        computes stays inside. With `loop_axes` (the loop's variables), values that do not
        vary along them are computed before the loop instead."""
        return Lowering(
            self.payload, self.frame, self.names, self.dtypes, self.f64 == "f64", self, loop_axes
        )

    def find(self, key: Any) -> Scalar | None:
        scope: Lowering | None = self
        while scope is not None:
            if key in scope.memo:
                return scope.memo[key]
            scope = scope.parent
        return None

    def scope_of(self, axes: frozenset[str]) -> Lowering:
        """The outermost scope where a value varying along `axes` can be computed."""
        scope = self
        while scope.parent is not None and scope.loop_axes and not scope.loop_axes & axes:
            scope = scope.parent
        return scope

    def split(self, index: Index) -> tuple[str | None, str]:
        """`index` as the part that varies along no loop this scope is inside (computed once,
        before the loops, each loop adding its own terms), or None, and the rest."""
        if not index.terms:
            return None, index.code
        chain: list[Lowering] = []
        scope: Lowering | None = self
        while scope is not None:
            chain.append(scope)
            scope = scope.parent
        levels: dict[int, list[tuple[str, int]]] = {}
        for code, axes, k in index.terms:
            levels.setdefault(chain.index(self.scope_of(axes)), []).append((code, k))
        hoisted: str | None = None
        for level in sorted((n for n in levels if n > 0), reverse=True):
            terms = ([(hoisted, 1)] if hoisted else []) + levels[level]
            hoisted = chain[level].named(_sum(terms, 0))
        return hoisted, _sum(levels.get(0, []), index.constant)

    def render(self, index: Index) -> str:
        """`index` as an expression in this scope, its loop-invariant part computed before."""
        hoisted, rest = self.split(index)
        if hoisted is None:
            return index.code
        return hoisted if rest == "0" else f"{hoisted} + {paren(rest)}"

    def compare(self, index: Index, operator: str, bound: int) -> str:
        """`index <operator> bound` with what varies in this scope moved to the bound."""
        hoisted, rest = self.split(index)
        if hoisted is None:
            return f"({paren(index.code)} {operator} {bound})"
        known = constant_of(Index(rest))
        if known is not None:
            limit = str(bound - known)
        else:
            limit = f"-({rest})" if bound == 0 else f"{bound} - ({rest})"
        return f"({hoisted} {operator} {limit})"

    def named(self, code: str) -> str:
        """A variable of this scope holding the integer expression `code` (one per code)."""
        if ATOM.fullmatch(code):
            return code
        key = ("index", code)
        found = self.find(key)
        if found is None:
            found = self.emit(code, "index", frozenset())
            self.memo[key] = found
        return found.code

    def fresh(self, prefix: str) -> str:
        name = f"{prefix}{self.counter[0]}"
        self.counter[0] += 1
        return name

    # -- emission helpers

    def compute(self, kind: str) -> str:
        """The type a value of MLIR type `kind` is computed in."""
        if kind in ("f16", "bf16", "f32"):
            return "f32"
        if kind == "f64":
            return self.f64
        if kind == "index":
            return "i32"
        if kind in TL_TYPES:
            return kind
        raise Unsupported(f"values of type {kind}")

    def emit(self, code: str, kind: str, axes: frozenset[str]) -> Scalar:
        name = self.fresh("v")
        self.lines.append(f"{name} = {code}")
        return Scalar(name, kind, axes)

    def tensor_of(self, value: Scalar) -> str:
        """A literal as a 0-d Triton tensor (tl functions take tensors only)."""
        if not value.literal:
            return value.code
        return f"tl.full([], {value.code}, {TL_TYPES[self.compute(value.type)]})"

    def cast(self, value: Scalar, kind: str) -> Scalar:
        if value.literal:
            assert value.value is not None
            number: float | int | bool = value.value
            if kind in FLOATS:
                number = float(number)
            elif kind == "i1":
                number = bool(number)
            else:
                number = int(number)
            return literal(number, kind)
        if self.compute(value.type) == self.compute(kind):
            return Scalar(value.code, kind, value.axes)
        code = f"{paren(value.code)}.to({TL_TYPES[self.compute(kind)]})"
        return self.emit(code, kind, value.axes)

    def store_value(self, value: Scalar, dtype: str) -> str:
        """`value` as the stored type of a tensor of torch dtype `dtype`."""
        target = storage_type(dtype)
        if value.literal:
            return f"tl.full([], {value.code}, {target})"
        if TL_TYPES.get(self.compute(value.type)) == target:
            return value.code
        return f"{paren(value.code)}.to({target})"

    # -- tensors

    def element(self, value: ir.Value, idx: tuple[Index, ...], raw: bool = False) -> Scalar:
        """`value` (a tensor of the payload) at `idx`; `raw` keeps a load in its stored type."""
        key = (value, idx, raw)
        found = self.find(key)
        if found is None:
            scope = self.scope_of(frozenset().union(*(i.axes for i in idx)))
            found = scope._element(value, idx, raw)
            scope.memo[key] = found
        return found

    def _element(self, value: ir.Value, idx: tuple[Index, ...], raw: bool) -> Scalar:
        if self.payload.is_argument(value):
            return self.load(value.arg_number, idx, raw)
        op = owner(value)
        if op is None:
            raise Unsupported("a block argument outside the function")
        if op.name == "tensor.expand_shape":
            dims = shape(value)
            source = tuple(
                linearize([idx[k] for k in group], [dims[k] for k in group])
                for group in reassociation(op)
            )
            return self.element(op.operands[0], source, raw)
        if op.name == "tensor.collapse_shape":
            dims = shape(op.operands[0])
            found: list[Index] = []
            for group, index in zip(reassociation(op), idx, strict=True):
                found += delinearize(index, [dims[k] for k in group])
            return self.element(op.operands[0], tuple(found), raw)
        if op.name == "arith.constant":
            return constant(op)
        if op.name == "tensor.pad":
            return self.pad(op, idx, raw)
        if op.name == "linalg.generic":
            return self.generic(op, ir.OpResult(value).result_number, idx)
        if op.name == "tensor.empty":
            raise Unsupported("a read of an uninitialized tensor.empty")
        raise Unsupported(f"{op.name} producing a tensor")

    def offset(self, idx: tuple[Index, ...], dims: tuple[int, ...]) -> Index:
        known = self.flat.get((idx, dims))
        if known is not None:
            index = linearize(idx, dims)
            return Index(known, index.axes, index.masks)
        return linearize(idx, dims)

    def load(self, argument: int, idx: tuple[Index, ...], raw: bool, other: str = "0") -> Scalar:
        """Argument `argument` at `idx`; a masked lane reads `other`."""
        value = self.payload.arguments[argument]
        dims = shape(value)
        where = self.offset(idx, dims)
        pointer = self.names[argument]
        address = pointer if where == ZERO else f"{pointer} + {self.render(where)}"
        if where.masks:
            code = f"tl.load({address}, mask={' & '.join(sorted(where.masks))}, other={other})"
        else:
            code = f"tl.load({address})"
        if where.axes - self.loop_vars:
            self.vector_loads[0] += 1
        kind = element_type(value)
        stored = self.dtypes[argument]
        if not raw and stored in ("float16", "bfloat16"):
            code += ".to(tl.float32)"
        return self.emit(code, kind, where.axes)

    def pad(self, op: ir.Operation, idx: tuple[Index, ...], raw: bool) -> Scalar:
        """A `tensor.pad` at `idx`: its source at `idx` less the low padding where that is in
        bounds, else the padding constant."""
        source = op.operands[0]
        if len(op.operands) > 1:
            raise Unsupported("a tensor.pad with dynamic padding")
        low = list(ir.DenseI64ArrayAttr(op.attributes["static_low"]))
        high = list(ir.DenseI64ArrayAttr(op.attributes["static_high"]))
        if min(low + high) < 0:
            raise Unsupported("a tensor.pad with negative padding")
        yielded = owner(list(op.regions[0].blocks[0].operations)[-1].operands[0])
        if yielded is None or yielded.name != "arith.constant":
            raise Unsupported("a tensor.pad whose padding is not a constant")
        fill = self.cast(constant(yielded), element_type(source))
        inside: list[str] = []
        moved: list[Index] = []
        for index, before, after, size in zip(idx, low, high, shape(source), strict=True):
            at = combine(index, "+", number(-before))
            known = constant_of(at)
            if known is not None:  # a coordinate fixed by the consumer: decided here
                if not 0 <= known < size:
                    return fill
                moved.append(at)
                continue
            # Lanes in range are never past the high end when there is no high padding, nor
            # before the start when there is no low padding.
            scope = self.scope_of(at.axes)
            checks = ([scope.compare(at, ">=", 0)] if before else []) + (
                [scope.compare(at, "<", size)] if after else []
            )
            if not checks:
                moved.append(at)
                continue
            bounds = scope.emit(" & ".join(checks), "i1", at.axes)
            inside.append(bounds.code)
            moved.append(replace(at, masks=at.masks | {bounds.code}))
        if not inside:
            return self.element(source, tuple(moved), raw)
        if self.payload.is_argument(source):
            return self.load(source.arg_number, tuple(moved), raw, other=fill.code)
        value = self.element(source, tuple(moved), raw)
        axes = frozenset().union(*(i.axes for i in moved))
        code = f"tl.where({' & '.join(inside)}, {self.tensor_of(value)}, {fill.code})"
        return self.emit(code, value.type, axes)

    def block(self, value: Scalar, kind: str, looped: Looped) -> str:
        """`value` as a block of `looped`'s shape in the type `kind` is computed in (a loop
        carries a variable of one type and shape)."""
        value = self.cast(value, kind)
        if value.literal:
            return f"tl.full({looped.shape}, {value.code}, {TL_TYPES[self.compute(kind)]})"
        if looped.axes and looped.axes <= value.axes:
            return value.code
        return f"tl.broadcast_to({value.code}, {looped.shape})"

    # -- linalg.generic

    def generic(self, op: ir.Operation, result: int, idx: tuple[Index, ...]) -> Scalar:
        special = self.frame.contraction(op, idx)
        if special is not None:
            return special
        kinds = iterators(op)
        loops: list[Index | None] = [None] * len(kinds)
        inputs = len(op.operands) - len(op.results)
        for position, index in zip(dim_positions(maps(op)[inputs + result]), idx, strict=True):
            if position is not None:
                loops[position] = index
        reduced = [d for d, kind in enumerate(kinds) if kind == "reduction"]
        if any(loops[d] is None for d, kind in enumerate(kinds) if kind == "parallel"):
            raise Unsupported("a parallel loop that the op's result does not address")
        body = op.regions[0].blocks[0]
        yielded = list(body.operations)[-1].operands[result]
        if not reduced:
            return Body(self, op, [i or ZERO for i in loops]).scalar(yielded)
        looped = self.frame.looped([ranges(op)[d] for d in reduced])
        if looped is not None:
            self.loop_reduce(op, loops, reduced, idx, looped)
            return self.memo[(op.results[result], idx, False)]
        return self.reduce(op, result, loops, reduced, yielded, idx)

    def loop_reduce(
        self,
        op: ir.Operation,
        loops: list[Index | None],
        reduced: list[int],
        idx: tuple[Index, ...],
        looped: Looped,
    ) -> None:
        """Every result of the reduction `op` at `idx`, by running its body over the reduced
        loops (outermost first, unit ones skipped) with the accumulators carried in variables;
        inner loops whose iterations multiply to at most UNROLL are static (unrolled)."""
        inputs = len(op.operands) - len(op.results)
        body = op.regions[0].blocks[0]
        extents = ranges(op)
        accumulators: list[Scalar] = []
        for k, result in enumerate(op.results):
            kind = element_type(result)
            init = self.element(op.operands[inputs + k], idx)
            name = self.fresh("acc")
            self.lines.append(f"{name} = {self.block(init, kind, looped)}")
            accumulators.append(Scalar(name, kind, looped.axes | init.axes))
        static: dict[int, bool] = {}
        unrolled = 1
        for d in reversed([d for d in reduced if extents[d] != 1]):
            static[d] = unrolled * extents[d] <= UNROLL and all(static.values())
            unrolled *= extents[d] if static[d] else 1
        headers: list[str] = []
        scopes: list[Lowering] = []
        scope = self
        for d in reduced:
            if extents[d] == 1:
                loops[d] = ZERO
                continue
            var = self.fresh("r")
            self.loop_vars.add(var)
            loops[d] = Index(var, frozenset({var}))
            loop = "tl.static_range" if static[d] else "range"
            headers.append(f"for {var} in {loop}({extents[d]}):")
            scope = scope.child(frozenset({var}))
            scopes.append(scope)
        # In the loop an accumulator varies along its variables: nothing that reads it leaves.
        carried = frozenset().union(*(s.loop_axes for s in scopes))
        bound = {
            argument: replace(accumulator, axes=accumulator.axes | carried)
            for argument, accumulator in zip(
                list(body.arguments)[inputs:], accumulators, strict=True
            )
        }
        step = Body(scope, op, [i or ZERO for i in loops], bound)
        values = [step.scalar(v) for v in list(body.operations)[-1].operands]
        names = {a.code for a in accumulators}
        updates = []
        for accumulator, value in zip(accumulators, values, strict=True):
            code = scope.block(value, accumulator.type, looped)
            if code in names and code != accumulator.code:  # all read before any is written
                code = scope.emit(code, value.type, value.axes).code
            updates.append(f"{accumulator.code} = {code}")
        nested = [*scope.lines, *updates]
        for k in reversed(range(len(headers))):
            nested = [headers[k], *("    " + line for line in nested)]
            if k:
                nested = [*scopes[k - 1].lines, *nested]
        if headers:
            self.lines += nested
        else:
            self.lines += updates
        for result, accumulator in zip(op.results, accumulators, strict=True):
            self.memo[(result, idx, False)] = accumulator

    def reduce(
        self,
        op: ir.Operation,
        result: int,
        loops: list[Index | None],
        reduced: list[int],
        yielded: ir.Value,
        idx: tuple[Index, ...],
    ) -> Scalar:
        combine = owner(yielded)
        body = op.regions[0].blocks[0]
        inputs = len(op.operands) - len(op.results)
        accumulator = body.arguments[inputs + result]
        if combine is not None and combine.name == "arith.select":
            return self.arg_reduce(op, result, loops, reduced, combine, idx)
        if combine is None or combine.name not in COMBINERS:
            raise Unsupported(f"a reduction combined by {combine.name if combine else 'nothing'}")
        operands = list(combine.operands)
        if accumulator not in operands:
            raise Unsupported("a reduction that does not accumulate into its result")
        term = operands[1 - operands.index(accumulator)]
        outs = list(body.arguments)[inputs:]
        if _depends(term, outs):
            raise Unsupported("a reduction whose term reads an accumulator (an argmax?)")
        bound, mask = self.along_block(op, loops, reduced)
        value = Body(self, op, bound).scalar(term)
        reduction, identity, fold = COMBINERS[combine.name]
        kind = element_type(op.results[result])
        neutral = literal(float(identity) if kind in FLOATS else int(identity), kind)
        masked = f"tl.where({mask}, {value.code}, {neutral.code})"
        if combine.name in NAN_PROPAGATING:
            lanes = self.emit(masked, kind, value.axes).code
            found = self.emit(f"{reduction}({lanes}, axis=0)", kind, frozenset())
            nan = f"tl.max(tl.where({lanes} != {lanes}, 1, 0), axis=0) > 0"
            code = f'tl.where({nan}, float("nan"), {found.code})'
            reduced_value = self.emit(code, kind, frozenset())
        else:
            reduced_value = self.emit(f"{reduction}({masked}, axis=0)", kind, frozenset())
        init = self.element(op.operands[inputs + result], idx)
        if init.literal and init.value == neutral.value:
            return reduced_value
        code = fold.format(self.tensor_of(init), reduced_value.code)
        return self.emit(code, kind, init.axes)

    def along_block(
        self, op: ir.Operation, loops: list[Index | None], reduced: list[int]
    ) -> tuple[list[Index], str]:
        """The loops with the reduced ones along the family's block, and the lanes' mask."""
        block, mask = self.frame.reduction([ranges(op)[d] for d in reduced])
        axes = frozenset().union(*(i.axes for i in block))
        if any(index is not None and index.axes & axes for index in loops):
            raise Unsupported("a reduction whose rows lie along the block")
        bound = [i or ZERO for i in loops]
        for d, index in zip(reduced, block, strict=True):
            bound[d] = index
        return bound, mask

    def arg_reduce(
        self,
        op: ir.Operation,
        result: int,
        loops: list[Index | None],
        reduced: list[int],
        select: ir.Operation,
        idx: tuple[Index, ...],
    ) -> Scalar:
        """The index result of an argmax or argmin body along the block: `select(term > best,
        new, index)`, where another result keeps `best`, the running max (min) of the term.
        The strict comparison keeps the first position of the extreme, as tl.argmax's left
        tie break does; an extreme that does not beat the initial best keeps the initial
        index. NaN terms are ordered as the sequential body orders them."""
        body = op.regions[0].blocks[0]
        inputs = len(op.operands) - len(op.results)
        outs = list(body.arguments)[inputs:]
        refused = Unsupported("a reduction combined by arith.select other than an arg-max/min")
        cond, new, old = select.operands
        compare = owner(cond)
        if old != outs[result] or compare is None or compare.name != "arith.cmpf":
            raise refused
        predicate = ir.IntegerAttr(compare.attributes["predicate"]).value
        a, b = compare.operands
        if predicate not in (2, 4) or (a in outs) == (b in outs):  # ogt, olt
            raise refused
        term, best = (a, b) if b in outs else (b, a)
        larger = (predicate == 2) == (best == b)  # term > best: an argmax
        j = outs.index(best)
        keeper = owner(list(body.operations)[-1].operands[j])  # what result j yields
        if keeper is None or keeper.name not in COMBINERS:
            raise refused
        if COMBINERS[keeper.name][0] != ("tl.max" if larger else "tl.min"):
            raise refused
        if set(keeper.operands) != {term, best} or _depends(term, outs) or _depends(new, outs):
            raise refused
        kind = element_type(op.results[j])
        if kind not in FLOATS:
            raise refused
        bound, mask = self.along_block(op, loops, reduced)
        value = Body(self, op, bound).scalar(term)
        neutral = literal(-math.inf if larger else math.inf, kind)
        extents = [ranges(op)[d] for d in reduced]
        lanes = linearize([bound[d] for d in reduced], extents).code
        nan = f"({value.code} != {value.code})"
        if keeper.name in NAN_PROPAGATING:
            # From the first NaN on, the best is NaN and no term beats it: the lanes after
            # it do not count (nor does it, a NaN being greater than nothing).
            first = f"tl.min(tl.where({mask} & {nan}, {lanes}, {math.prod(extents)}), axis=0)"
            counted = f"{mask} & ({lanes} < {self.emit(first, 'index', frozenset()).code})"
        else:  # maxnum/minnum: a NaN term changes nothing
            counted = f"{mask} & ({value.code} == {value.code})"
        masked = self.emit(f"tl.where({counted}, {value.code}, {neutral.code})", kind, value.axes)
        which = "max" if larger else "min"
        extreme = self.emit(f"tl.{which}({masked.code}, axis=0)", kind, frozenset())
        position = self.emit(
            f"tl.arg{which}({masked.code}, axis=0, tie_break_left=True)", "index", frozenset()
        )
        at = list(bound)
        for d, index in zip(reduced, delinearize(Index(position.code), extents), strict=True):
            at[d] = index
        chosen = Body(self, op, at).scalar(new)
        first_best = self.tensor_of(self.element(op.operands[inputs + j], idx))
        first_index = self.element(op.operands[inputs + result], idx)
        beats = f"{extreme.code} {'>' if larger else '<'} {first_best}"
        code = f"tl.where({beats}, {self.tensor_of(chosen)}, {self.tensor_of(first_index)})"
        return self.emit(code, element_type(op.results[result]), first_index.axes)


def _depends(value: ir.Value, on: list[ir.Value]) -> bool:
    if value in on:
        return True
    op = owner(value)
    return op is not None and any(_depends(v, on) for v in op.operands)


class Body:
    """One evaluation of a `linalg.generic` body with its loops bound to coordinates."""

    def __init__(
        self,
        lowering: Lowering,
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

    def power(self, low: Lowering, args: list[Scalar]) -> Scalar:
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
