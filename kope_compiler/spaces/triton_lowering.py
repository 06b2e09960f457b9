"""Linalg payloads as Triton expressions: the half of `kope.spaces.triton_kernels` that reads IR.

A kernel family (`triton_kernels`) lays out its block coordinates; a `Lowering` then evaluates
any tensor of the payload at a tuple of coordinates by walking back from the value: through
reshapes (re-linearizing the index), through a `linalg.generic` (`triton_generic`: its output
map binds the loops, its input maps address its operands, its body becomes one Triton
statement per op) and down to the function's arguments, which are masked loads. Nothing is
keyed on what the operator is called: whatever payload is built from these pieces is
translated, and whatever is not raises `Unsupported` with the reason.

A `tensor.pad` is a virtual tensor: in bounds it is its source moved by the low padding,
elsewhere the padding constant (a masked load with that constant as `other`). A lowering is a
scope: a loop's body is a child scope, and what it reads that does not vary with the loop's
variable is computed once, in the enclosing scope, before the loop.

Floating values are computed in float32 (float16 and bfloat16 loads are widened; float64
intermediates of a payload whose tensors are all narrower are kept in float32, since torch-mlir
widens only its scalar arithmetic and Ascend has no float64 vector unit) and cast at the store.

The IR half in modules: `triton_ir` (the payload), `triton_index` (coordinates), `triton_scope`
(values, frames, and the scope the others see of a lowering), `triton_ops` (a generic's body op
by op), `triton_generic` (a generic's loops and reductions) and this one (tensors).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from torch_mlir import ir

from kope.spaces.triton_generic import generic
from kope.spaces.triton_index import (
    ATOM,
    ZERO,
    Index,
    combine,
    constant_of,
    delinearize,
    linearize,
    number,
    paren,
    weighted_sum,
)
from kope.spaces.triton_ir import Payload, Unsupported, element_type, owner, reassociation, shape
from kope.spaces.triton_ops import FLOATS, TL_TYPES, constant, literal, storage_type
from kope.spaces.triton_scope import Frame, Looped, Scalar


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
            hoisted = chain[level].named(weighted_sum(terms, 0))
        return hoisted, weighted_sum(levels.get(0, []), index.constant)

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
            return generic(self, op, ir.OpResult(value).result_number, idx)
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
