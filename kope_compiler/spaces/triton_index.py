"""Coordinates of tensor accesses as Triton integer expressions.

An `Index` is one coordinate: its code, the block axes and loop variables it varies along, and
the masks of the lanes where it is in range. Indexing maps become coordinates (`address`, any
affine expression, so windows such as `d2 * 2 + d4` too) and reshapes become row-major
`linearize`/`delinearize`. Constants fold as the expressions are built, and a coordinate that
is affine in simpler ones keeps that form, so that a loop can compute the part that does not
vary with it before the loop (`Lowering.split`).
"""

from __future__ import annotations

import math
import operator as operator_module
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch_mlir import ir

from kope.spaces.triton_ir import Unsupported

ATOM = re.compile(r"\w+(\[[^\]]*\])?")  # a name or literal, possibly subscripted


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


FOLD: dict[str, Callable[[int, int], int]] = {
    "+": operator_module.add,
    "*": operator_module.mul,
    "//": operator_module.floordiv,
    "%": operator_module.mod,
}


def combine(a: Index, operator: str, b: Index) -> Index:
    """`a <operator> b` as a coordinate: constants fold, and + 0, * 1, * 0 vanish."""
    ka, kb = constant_of(a), constant_of(b)
    if ka is not None and kb is not None:
        return number(FOLD[operator](ka, kb))  # only the operator asked for: b may be 0
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


def weighted_sum(terms: list[tuple[str, int]], constant: int) -> str:
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
