"""The rows family: reductions along trailing loops, one program per row.

`triton-rows` suits ops that reduce rows of contiguous elements (softmax, norms,
sum/mean/amax/argmax): one program per row holds the row in one block, reduces it with
`tl.sum`/`tl.max`/`tl.min`, and finishes the ops that consume the reduced values.
"""

from __future__ import annotations

import math
from typing import Any

from kope.spaces.triton_family import (
    HEADER,
    ROWS,
    Config,
    Kernel,
    NoSpecials,
    indent,
    launch_source,
    launches,
    pow2,
)
from kope.spaces.triton_index import Index, delinearize
from kope.spaces.triton_ir import Payload, Unsupported
from kope.targets.triton_rules import TritonRules
from kope.vocabulary.specs import TensorSpec

MAX_ROW = 16384  # longest row held in one block; longer ones would need a looped reduction


class _RowFrame(NoSpecials):
    """Reductions over the block `cols`: every reduced loop nest is flattened into it."""

    def __init__(self) -> None:
        self.extents: set[int] = set()

    def mask(self, extent: int) -> str:
        self.extents.add(extent)
        return f"cmask{extent}"

    def reduction(self, extents: list[int]) -> tuple[list[Index], str]:
        total = math.prod(extents)
        if total > MAX_ROW:
            raise Unsupported(f"a reduction over {total} elements (longer than {MAX_ROW})")
        mask = self.mask(total)
        cols = Index("cols", frozenset({"c"}), frozenset({mask}))
        return delinearize(cols, extents), mask


class Rows(Kernel):
    """One program per row: each output's leading dims are the row, the rest the block."""

    family = ROWS

    def __init__(
        self, payload: Payload, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]
    ) -> None:
        super().__init__(payload, inputs, outputs)
        failure = Unsupported("outputs with no common number of rows")
        # The split of each output into row and block dims is the one with the widest block
        # whose values can be computed: a reduction's own rows may not lie along the block.
        # The last split tried (one element per row) fails only for a reason of its own.
        for split in _splits(outputs):
            try:
                self._build(split)
                return
            except Unsupported as err:
                failure = err
        raise failure

    def _build(self, split: list[int]) -> None:
        frame = _RowFrame()
        low = self.lowering(frame)
        self.stores: list[str] = []
        self.rows = math.prod(self.outputs[0].shape[: split[0]])
        for j, spec in enumerate(self.outputs):
            dims = tuple(spec.shape)
            row_dims, col_dims = dims[: split[j]], dims[split[j] :]
            width = math.prod(col_dims)
            if width > MAX_ROW:
                raise Unsupported(f"rows of {width} elements (longer than {MAX_ROW})")
            masks = frozenset({frame.mask(width)}) if width > 1 else frozenset()
            cols = Index("cols", frozenset({"c"}) if width > 1 else frozenset(), masks)
            idx = (*delinearize(Index("row"), row_dims), *delinearize(cols, col_dims))
            if width == 1 and self.rows > 1:
                low.flat[(idx, dims)] = "row"
            elif width > 1:
                low.flat[(idx, dims)] = "cols" if self.rows == 1 else f"row * {width} + cols"
            self.stores.append(self.store(low, j, idx, next(iter(masks), None)))
        self.body = low.lines
        self.block = max(16, pow2(max(frame.extents, default=1)))
        self.masks = [f"cmask{e} = cols < {e}" for e in sorted(frame.extents)]
        self.tiles = low.vector_loads[0] + len(self.outputs) + 2

    def space(self, rules: TritonRules) -> list[tuple[Config, float]]:
        wanted = rules.nearest_warps(4 if self.block <= 2048 else 8) if rules.num_warps else 0
        nbytes = self.block * 4 * self.tiles
        return [
            ({"family": ROWS, "BLOCK": self.block, **options}, bonus)
            for options, bonus in launches(rules, nbytes, wanted, 1.0)
        ]

    def smallest_footprint(self, rules: TritonRules) -> int:
        return self.block * 4 * self.tiles

    def source(self, config: Config, rules: TritonRules) -> str:
        block = int(config["BLOCK"])
        if block < self.block:
            raise ValueError(f"BLOCK {block} is shorter than the rows ({self.block})")
        params = ", ".join([*self.names, *self.outs, "BLOCK: tl.constexpr"])
        text = HEADER + f"\n\n@triton.jit\ndef _kope_rows({params}):\n"
        text += indent(["cols = tl.arange(0, BLOCK)", *self.masks], 1)
        body = [*self.body, *self.stores]
        kwargs: dict[str, Any] = {"BLOCK": block}
        if rules.programs is not None:
            programs = min(self.rows, rules.programs)
            text += f"    for tile in range(tl.program_id(0), {self.rows}, {programs}):\n"
            text += indent([f"row = tile{self.wide}", *body], 2)
            grid = str(programs)
        else:
            text += indent([f"row = tl.program_id(0){self.wide}", *body], 1)
            grid = str(self.rows)
        if rules.num_warps:
            kwargs["num_warps"] = int(config.get("num_warps", 4))
        return text + launch_source("_kope_rows", grid, [*self.names, *self.outs], kwargs)


def _splits(outputs: tuple[TensorSpec, ...]) -> list[list[int]]:
    """Per output, how many leading dims are the row: widest blocks first, and all outputs
    with the same number of rows (one program computes a row of each)."""
    first = outputs[0].shape
    found = []
    for cut in range(len(first) + 1):
        rows = math.prod(first[:cut])
        split = [cut]
        for spec in outputs[1:]:
            cuts = [c for c in range(len(spec.shape) + 1) if math.prod(spec.shape[:c]) == rows]
            if not cuts:
                break
            split.append(cuts[0])
        else:
            found.append(split)
    return found
