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

from kope.agents.triton_family import (
    HEADER,
    LOOPS,
    POINTWISE,
    Config,
    Kernel,
    NoSpecials,
    buffering,
    indent,
    launch_source,
    pow2,
    ub_fits,
    warp_counts,
)
from kope.agents.triton_index import Index, delinearize
from kope.agents.triton_ir import Payload, Unsupported
from kope.agents.triton_scope import Looped
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

    def smallest_footprint(self) -> int:
        return min(256, max(64, pow2(self.numel))) * 4 * self.tiles

    def cuda_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        cap = max(64, pow2(self.numel))
        target = min(1024, cap)
        found = []
        for block in sorted({min(b, cap) for b in (256, 512, 1024, 2048)}):
            for warps in warp_counts(capabilities):
                score = -abs(math.log2(block / target))
                score += 0.5 if warps == (4 if block <= 1024 else 8) else 0.0
                found.append(({"family": POINTWISE, "BLOCK": block, "num_warps": warps}, score))
        return found

    def ascend_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        programs = int(capabilities.get("max_programs", 40))
        cap = max(64, pow2(self.numel))
        target = max(64, pow2(math.ceil(self.numel / programs)))
        found = []
        for block in sorted({min(b, cap) for b in (256, 512, 1024, 2048, 4096, 8192, 16384)}):
            for buffered in buffering(capabilities):
                if not ub_fits(capabilities, block * 4 * self.tiles, buffered):
                    continue
                score = -abs(math.log2(block / min(target, 8192))) + (0.5 if buffered else 0.0)
                config = {"family": POINTWISE, "BLOCK": block, "multibuffer": buffered}
                found.append((config, score))
        return found

    def source(self, config: Config, capabilities: dict[str, Any]) -> str:
        block = int(config["BLOCK"])
        tiles = math.ceil(self.numel / block)
        wide = self.wide
        params = ", ".join([*self.names, *self.outs, "BLOCK: tl.constexpr"])
        body = [f"mask = offs < {self.numel}", *self.body, *self.stores]
        kernel = "_kope_" + self.family.removeprefix("triton-")
        text = HEADER + f"\n\n@triton.jit\ndef {kernel}({params}):\n"
        if capabilities.get("flavour", "cuda") == "ascend":
            programs = min(tiles, int(capabilities.get("max_programs", 40)))
            text += f"    for tile in range(tl.program_id(0), {tiles}, {programs}):\n"
            text += indent([f"offs = tile{wide} * BLOCK + tl.arange(0, BLOCK)", *body], 2)
            grid, kwargs = str(programs), {"BLOCK": block}
        else:
            text += indent([f"offs = tl.program_id(0){wide} * BLOCK + tl.arange(0, BLOCK)"], 1)
            text += indent(body, 1)
            grid, kwargs = f"triton.cdiv({self.numel}, {block})", {"BLOCK": block}
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

    def smallest_footprint(self) -> int:
        return self.blocks()[0] * 4 * self.tiles

    def blocks(self) -> list[int]:
        cap = max(16, pow2(self.numel))
        return sorted({min(b, cap) for b in self.BLOCKS})

    def cuda_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        # Each program loops over the reduction: blocks of 128-256 outputs keep enough programs
        # for the multiprocessors on small feature maps and coalesce the loads along the rows.
        machines = int(capabilities.get("multiprocessors", 100))
        target = min(256, max(32, pow2(math.ceil(self.numel / (2 * machines)))))
        found = []
        for block in self.blocks():
            for warps in warp_counts(capabilities):
                score = -abs(math.log2(block / target))
                score += 0.5 if warps == (4 if block <= 512 else 8) else 0.0
                found.append(({"family": LOOPS, "BLOCK": block, "num_warps": warps}, score))
        return found

    def ascend_space(self, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
        programs = int(capabilities.get("max_programs", 40))
        target = max(16, pow2(math.ceil(self.numel / programs)))
        found = []
        for block in self.blocks():
            for buffered in buffering(capabilities):
                if not ub_fits(capabilities, block * 4 * self.tiles, buffered):
                    continue
                score = -abs(math.log2(block / min(target, 1024))) + (0.5 if buffered else 0.0)
                config = {"family": LOOPS, "BLOCK": block, "multibuffer": buffered}
                found.append((config, score))
        return found
