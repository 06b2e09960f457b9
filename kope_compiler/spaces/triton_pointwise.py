"""The pointwise and loops families: a flat block of output offsets per program.

`triton-pointwise`: every op is parallel; the whole payload fuses into one kernel over a flat
block of output offsets (broadcasts, permutations and reshapes become index maths).
`triton-loops` blocks over the output offsets the same way and runs each reduction's body
over the reduced loops inside the program, a block of accumulators at a time, so any body
reduces: windows (pooling, convolution), and reductions over leading or middle dims.
"""

from __future__ import annotations

import math
from typing import Any

from kope.spaces.triton_family import (
    HEADER,
    LOOPS,
    POINTWISE,
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
from kope.spaces.triton_scope import Looped
from kope.targets.triton_rules import TritonRules
from kope.vocabulary.specs import TensorSpec

MAX_LOOP = 16384  # most iterations of a reduction looped in one program (few outputs, slow)


class Pointwise(Kernel):
    """All outputs over one flat block of offsets `offs` (every output has the same size)."""

    family = POINTWISE

    def __init__(
        self, payload: Payload, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]
    ) -> None:
        super().__init__(payload, inputs, outputs)
        sizes = {math.prod(s.shape) for s in outputs}
        if len(sizes) != 1:
            raise Unsupported(f"outputs of different sizes in one {self.family} kernel")
        self.numel = sizes.pop()
        low = self.lowering(self.frame())
        flat = Index("offs", frozenset({"x"}), frozenset({"mask"}))
        self.stores = []
        for j, spec in enumerate(outputs):
            dims = tuple(spec.shape)
            idx = tuple(delinearize(flat, dims))
            low.flat[(idx, dims)] = "offs"
            self.stores.append(self.store(low, j, idx, "mask"))
        self.body = low.lines
        self.tiles = low.vector_loads[0] + len(outputs) + 1  # blocks live at once, roughly

    def frame(self) -> NoSpecials:
        return NoSpecials()

    def smallest_footprint(self, rules: TritonRules) -> int:
        cap = max(64, pow2(self.numel))
        return min(min(b, cap) for b in rules.pointwise_blocks) * 4 * self.tiles

    def space(self, rules: TritonRules) -> list[tuple[Config, float]]:
        # Blocks near the work of one program: all of it where the grid is as large as the
        # work, a share of it where a few programs loop over the tiles.
        cap = max(64, pow2(self.numel))
        share = max(64, pow2(math.ceil(self.numel / (rules.programs or 1))))
        target = min(rules.pointwise_largest, share)
        found = []
        for block in sorted({min(b, cap) for b in rules.pointwise_blocks}):
            score = -abs(math.log2(block / target))
            wanted = 4 if block <= 1024 else 8
            for options, bonus in launches(rules, block * 4 * self.tiles, wanted, 0.5):
                found.append(({"family": self.family, "BLOCK": block, **options}, score + bonus))
        return found

    def source(self, config: Config, rules: TritonRules) -> str:
        block = int(config["BLOCK"])
        tiles = math.ceil(self.numel / block)
        wide = self.wide
        params = ", ".join([*self.names, *self.outs, "BLOCK: tl.constexpr"])
        body = [f"mask = offs < {self.numel}", *self.body, *self.stores]
        kernel = "_kope_" + self.family.removeprefix("triton-")
        text = HEADER + f"\n\n@triton.jit\ndef {kernel}({params}):\n"
        kwargs: dict[str, Any] = {"BLOCK": block}
        if rules.programs is not None:
            programs = min(tiles, rules.programs)
            text += f"    for tile in range(tl.program_id(0), {tiles}, {programs}):\n"
            text += indent([f"offs = tile{wide} * BLOCK + tl.arange(0, BLOCK)", *body], 2)
            grid = str(programs)
        else:
            text += indent([f"offs = tl.program_id(0){wide} * BLOCK + tl.arange(0, BLOCK)"], 1)
            text += indent(body, 1)
            grid = f"triton.cdiv({self.numel}, {block})"
        if rules.num_warps:
            kwargs["num_warps"] = int(config.get("num_warps", 4))
        return text + launch_source(kernel, grid, [*self.names, *self.outs], kwargs)


class _LoopFrame(NoSpecials):
    """Reductions as loops inside each program, accumulating a block of outputs."""

    def looped(self, extents: list[int]) -> Looped | None:
        total = math.prod(extents)
        if total > MAX_LOOP:
            raise Unsupported(f"a looped reduction over {total} elements (longer than {MAX_LOOP})")
        return Looped("[BLOCK]", frozenset({"x"}))


class Loops(Pointwise):
    """A block of output offsets per program, as the pointwise family; each reduction is its
    body run over the reduced loops inside the program, a block of accumulators at a time."""

    family = LOOPS
    BLOCKS = (128, 256, 512, 1024)  # from one element per thread of 4 warps

    def frame(self) -> NoSpecials:
        return _LoopFrame()

    def smallest_footprint(self, rules: TritonRules) -> int:
        return self.blocks()[0] * 4 * self.tiles

    def blocks(self) -> list[int]:
        cap = max(16, pow2(self.numel))
        return sorted({min(b, cap) for b in self.BLOCKS})

    def space(self, rules: TritonRules) -> list[tuple[Config, float]]:
        # Each program loops over the reduction: blocks that leave the programs the target
        # aims to fill, within the range of blocks it aims for.
        least, most = rules.loops_target
        share = pow2(math.ceil(self.numel / rules.loops_programs))
        target = min(most, max(least, share))
        found = []
        for block in self.blocks():
            score = -abs(math.log2(block / target))
            wanted = 4 if block <= 512 else 8
            for options, bonus in launches(rules, block * 4 * self.tiles, wanted, 0.5):
                found.append(({"family": LOOPS, "BLOCK": block, **options}, score + bonus))
        return found
