"""What the Triton kernel families share: the `Kernel` each family implements (a payload
checked against the operator's tensors, its configurations under a target's rules, its source),
the families' names, and the helpers they write the module text and choose launches with.

A family's kernel is lowered once, in its constructor; a configuration only chooses how it is
launched (block sizes, and the launch options the target's rules offer: warps and stages on a
GPU, multibuffering on Ascend). Each family has one space, which reads the rules
(`kope.targets.triton_rules`) and never the target's name.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

from torch_mlir import ir

from kope.spaces.triton_index import ZERO, Index
from kope.spaces.triton_ir import Payload, Unsupported, shape
from kope.spaces.triton_lowering import Lowering
from kope.spaces.triton_scope import Looped, Scalar
from kope.targets.triton_rules import TritonRules
from kope.vocabulary.specs import TensorSpec

Config = dict[str, Any]
POINTWISE, ROWS, MATMUL = "triton-pointwise", "triton-rows", "triton-matmul"
LOOPS = "triton-loops"
HEADER = "import triton\nimport triton.language as tl\n"


def pow2(n: int) -> int:
    """The smallest power of two no less than `n` (1 for any `n` up to 1)."""
    return 1 << max(0, n - 1).bit_length()


def _signature(count_in: int, count_out: int) -> tuple[list[str], list[str]]:
    return [f"x{i}" for i in range(count_in)], [f"out{i}" for i in range(count_out)]


def launch_source(kernel: str, grid: str, args: list[str], kwargs: dict[str, Any]) -> str:
    """The module's `launch` function: `kernel` on `grid`, given `kwargs` as its options."""
    options = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    names = ", ".join(args)
    return f"\n\ndef launch({names}):\n    {kernel}[({grid},)]({names}, {options})\n"


def indent(lines: list[str], depth: int) -> str:
    """`lines` as source text `depth` levels deep."""
    return "".join(" " * (4 * depth) + line + "\n" for line in lines)


def launches(
    rules: TritonRules, nbytes: int, warps: int, warp_bonus: float
) -> list[tuple[Config, float]]:
    """The launch options of a block of `nbytes` (each with its bonus to the prior): the warp
    counts the target launches with (`warp_bonus` for `warps`), by the multibuffer settings it
    tries (0.5 for multibuffering) where the block fits its buffer."""
    found: list[tuple[Config, float]] = []
    counts: list[int | None] = [*sorted(set(rules.num_warps))] or [None]
    for count in counts:
        for buffered in rules.multibuffer or (None,):
            if not rules.fits(nbytes, buffered):
                continue
            options: Config = {}
            bonus = 0.0
            if count is not None:
                options["num_warps"] = count
                bonus += warp_bonus if count == warps else 0.0
            if buffered is not None:
                options["multibuffer"] = buffered
                bonus += 0.5 if buffered else 0.0
            found.append((options, bonus))
    return found


class NoSpecials:
    """A frame with neither reductions nor a contraction (pointwise kernels); the other
    families' frames override what they have."""

    def reduction(self, extents: list[int]) -> tuple[list[Index], str]:
        raise Unsupported("a reduction in a pointwise kernel")

    def looped(self, extents: list[int]) -> Looped | None:
        return None

    def contraction(self, op: ir.Operation, idx: tuple[Index, ...]) -> Scalar | None:
        return None


class Kernel(ABC):
    """A payload lowered for one family; configurations only choose its launch."""

    family = ""

    def __init__(
        self, payload: Payload, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]
    ) -> None:
        self.payload = payload
        self.inputs = inputs
        self.outputs = outputs
        self.names, self.outs = _signature(len(inputs), len(outputs))
        self.float64 = any(s.dtype == "float64" for s in (*inputs, *outputs))
        # Offsets past int32 (with a block's overhang) need 64-bit program coordinates.
        self.large = max(math.prod(s.shape) for s in (*inputs, *outputs)) >= 2**30
        self.wide = ".to(tl.int64)" if self.large else ""
        values = (*payload.arguments, *payload.results)
        for spec, value in zip((*inputs, *outputs), values, strict=True):
            if tuple(spec.shape) != shape(value):
                raise Unsupported(f"a tensor of shape {spec.shape} typed {value.type}")

    def lowering(self, frame: Any) -> Lowering:
        dtypes = [s.dtype for s in self.inputs]
        return Lowering(self.payload, frame, self.names, dtypes, self.float64)

    def store(self, low: Lowering, j: int, idx: tuple[Index, ...], masks: str | None) -> str:
        """The statement storing output `j` evaluated at `idx` (its own coordinates)."""
        value = low.element(self.payload.results[j], idx)
        where = low.offset(idx, tuple(self.outputs[j].shape))
        pointer = self.outs[j] if where == ZERO else f"{self.outs[j]} + {where.code}"
        stored = low.store_value(value, self.outputs[j].dtype)
        return f"tl.store({pointer}, {stored}" + (f", mask={masks})" if masks else ")")

    @abstractmethod
    def space(self, rules: TritonRules) -> list[tuple[Config, float]]:
        """Configurations for a target of these rules, with prior scores."""

    @abstractmethod
    def source(self, config: Config, rules: TritonRules) -> str:
        """The kernel module text for `config`."""

    @abstractmethod
    def smallest_footprint(self, rules: TritonRules) -> int:
        """Bytes of the on-chip buffer the smallest block holds, single-buffered."""
