"""What the two halves of a Triton lowering share: values, a family's frame, and a scope.

A `Scope` is what a generic's loops (`triton_generic`) and a body's ops (`triton_ops`) need of
the `triton_lowering.Lowering` that evaluates them; the lowering calls them, so they know it
only by this protocol, and no arrow runs back up. A `Frame` is what a kernel family gives a
lowering beyond coordinates; a `Scalar`, a payload value at some coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from torch_mlir import ir

from kope.spaces.triton_index import Index


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


class Scope(Protocol):
    """A lowering's scope as a generic and a body use it (`triton_lowering.Lowering`)."""

    frame: Frame
    lines: list[str]  # the Triton statements emitted in this scope
    memo: dict[Any, Scalar]  # what this scope computed
    loop_vars: set[str]  # the loop variables of every scope of the kernel
    loop_axes: frozenset[str]  # the variables of the loop this scope is the body of

    def child(self, loop_axes: frozenset[str] = frozenset()) -> Scope:
        """A scope for a loop body over the variables `loop_axes`."""
        ...

    def scope_of(self, axes: frozenset[str]) -> Scope:
        """The outermost scope where a value varying along `axes` can be computed."""
        ...

    def fresh(self, prefix: str) -> str:
        """A new variable name."""
        ...

    def emit(self, code: str, kind: str, axes: frozenset[str]) -> Scalar:
        """`code` as a new variable of MLIR type `kind`, varying along `axes`."""
        ...

    def tensor_of(self, value: Scalar) -> str:
        """A literal as a 0-d Triton tensor."""
        ...

    def cast(self, value: Scalar, kind: str) -> Scalar:
        """`value` as MLIR type `kind`."""
        ...

    def element(self, value: ir.Value, idx: tuple[Index, ...], raw: bool = False) -> Scalar:
        """`value` (a tensor of the payload) at `idx`."""
        ...

    def block(self, value: Scalar, kind: str, looped: Looped) -> str:
        """`value` as a block of `looped`'s shape."""
        ...
