"""A Triton target's rules for the kernels written for it, as data the target supplies.

The Triton kernel spaces (`kope.spaces.triton`) have one space per kernel family; what a
device allows and prefers is read from these rules, never from the device's name: the grid
(as large as the work, or a few programs that loop over the tiles: Ascend's cores), the launch
options a configuration may tune (warps and pipeline stages on a GPU, multibuffering on
Ascend), the on-chip buffer blocks must fit (Ascend's unified buffer), the blocks each family
tries and the matmul tiles with their prior scores.

This module is plain data (no torch, no triton), so the spaces read it without loading a target.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MatmulTile:
    """A `tl.dot` tile and its prior score; warps and stages where the target launches them."""

    m: int
    n: int
    k: int
    prior: float
    warps: int = 4
    stages: int = 3


@dataclass(frozen=True)
class TritonRules:
    """What a Triton device allows and prefers, for the kernel spaces."""

    grid_dims: int  # dimensions of a launch grid
    # Most programs of a vector kernel's grid, each looping over its share of the tiles; None:
    # one program per tile (a grid as large as the work).
    programs: int | None = None
    dot_programs: int | None = None  # the same for kernels that use `tl.dot`
    num_warps: tuple[int, ...] = ()  # the warp counts a configuration may launch with
    num_stages: tuple[int, ...] = ()  # the software pipeline depths a matmul may launch with
    group_m: int | None = None  # row tiles grouped to share B's column tiles in L2
    multibuffer: tuple[bool, ...] = ()  # the multibuffer settings to try, preferred first
    ub_bytes: int | None = None  # the buffer every live block must fit (doubled: multibuffer)
    allow_tf32: bool = False  # whether float32 dots may round through TF32
    # The pointwise family: the blocks it tries, and the largest it aims for.
    pointwise_blocks: tuple[int, ...] = (256, 512, 1024, 2048)
    pointwise_largest: int = 1024
    # The loops family (reductions looped inside programs): the programs it aims to fill and
    # the range of blocks it aims for.
    loops_programs: int = 200
    loops_target: tuple[int, int] = (32, 256)
    matmul_tiles: tuple[MatmulTile, ...] = ()

    def fits(self, nbytes: int, buffered: bool | None) -> bool:
        """Whether blocks of `nbytes` (twice as many, multibuffered) fit the on-chip buffer."""
        if self.ub_bytes is None:
            return True
        return nbytes * (2 if buffered else 1) <= self.ub_bytes

    def nearest_warps(self, wanted: int) -> int:
        """The warp count the target allows nearest to `wanted` (the smaller on a tie)."""
        return min(sorted(set(self.num_warps)), key=lambda w: (abs(w - wanted), w))

    def nearest_stages(self, wanted: int) -> int:
        """The pipeline depth the target allows nearest to `wanted` (the smaller on a tie)."""
        return min(self.num_stages, key=lambda s: (abs(s - wanted), s))
