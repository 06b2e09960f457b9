"""The space of CPU kernels: transform-dialect schedules of an operator's linalg payload.

A grid per kernel family (threads, cache and register tiles, k-unroll, rows per step, vector
length, polynomial math), each point with a static prior's score (a crude cost model: use every
core on big work, keep 16 accumulators in vector registers, vectorize math), the core grid
widened by more tile, unroll, row and vector choices, and `renders`, which configurations off
the grid (proven elsewhere, or mutated) a payload can take. It reads the CPU target's
capabilities (vector width, threads, OpenMP) and knows no search: the heuristic agent hands
the space to `kope.agents.search`. The schedules themselves are `kope.spaces.schedules`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

from kope.passes.analysis import CONTRACTIONS, OpInfo, PayloadInfo, PlainMatmul
from kope.passes.approximate_math import APPROXIMATED
from kope.spaces import attention, depthwise, im2col
from kope.spaces.schedules import (
    COLLAPSE,
    CONVOLUTIONS,
    DEPTHWISE,
    REGROUP,
    Config,
    config_key,
    conv_dims,
    k_unroll,
    largest_op,
    packable,
    ragged_rows,
    transposed_dims,
    transposing,
    work,
)

# Iterations above which threads are expected to pay off (the search's `learn` reads it too:
# an attempt on the other side of it from an operator says nothing of its `threads` decision).
BIG_WORK = 1 << 16
APPROXIMABLE = APPROXIMATED  # a payload with one of these math ops may opt in to polynomials
# Rows operators from half of that on go either way (a 64x768 layer norm: 22.6 us on one
# thread, 19.2 on two, eager 26.3), so both counts rank alike and both are tried early.
EITHER_ROWS = BIG_WORK // 2
FEW_ROWS = 4  # a product of fewer rows than the shortest usual register tile
# The decisions that change a kernel's structure rather than a number on it (the search's
# sketches, `kope.agents.search.Space.structural`): the algorithm (im2col or direct, row
# blocks), an operand packed in panels, the loop order, how a transpose is lowered, whether
# regrouping reshapes are refined, whether inner loops are collapsed.
STRUCTURAL = ("algorithm", "pack", "columns_inner", "lowering", REGROUP, COLLAPSE)


def _lanes(capabilities: dict[str, Any], element_type: str) -> int:
    bits = int(capabilities.get("vector_bits", 256))
    width = 64 if element_type in ("f64", "i64") else 16 if element_type in ("f16", "bf16") else 32
    return max(4, bits // width)


def _threads(capabilities: dict[str, Any]) -> list[int]:
    threads = int(capabilities.get("threads", 1))
    return [threads, 1] if capabilities.get("openmp") and threads > 1 else [1]


# -- the space ----------------------------------------------------------------------------------


def _grid(core: list[list[Any]], wider: list[list[Any]]) -> Iterator[tuple[tuple[Any, ...], bool]]:
    """The core grid's points in order, then the points the wider values add (flagged)."""
    yield from ((point, False) for point in itertools.product(*core))
    for point in itertools.product(*(c + w for c, w in zip(core, wider, strict=True))):
        if any(value not in c for value, c in zip(point, core, strict=True)):
            yield point, True


def _fewest_zero_rows(m: int, threads: int, heights: tuple[int, ...]) -> int:
    """The tallest register tile of `heights` whose zero rows (m padded to whole tiles for
    each thread) are at most an eighth of m, else the one with the fewest."""
    padded = {h: math.ceil(m / (threads * h)) * threads * h for h in heights}
    fine = [h for h in heights if 8 * padded[h] <= 9 * m]
    return max(fine) if fine else min(heights, key=lambda h: (padded[h], -h))


def _packed_points(
    info: PayloadInfo, capabilities: dict[str, Any], threads: list[int], big: bool, lanes: int
) -> list[tuple[Config, float, bool]]:
    """Contraction points that take B in panels, for a plain matmul at least a tile large.

    Ranked above the unpacked grid: timed alone, on inputs that stay in cache, the two tie,
    but inside a model B arrives cold (the other operators ran in between), and unpacked B
    columns a row apart then cost a cache line and a TLB entry per k (a 64x1024x256 addmm
    lost 91 us that way between two eager operators; the packed kernel did not)."""
    found: list[tuple[Config, float, bool]] = []
    plain = info.plain_matmul
    if plain is None:
        return found
    # Register tiles sized by the machine's vector registers. 16 (AVX2): 12 accumulators (6
    # rows of two vectors: with two vectors of B and a broadcast of A, 15 registers) and 8.
    # The 12 hide the FMA's latency better: 6x16 ran 1.05-1.25x faster than 4x16 at
    # 255x129x193, 256^3 and 512^3, unless padding a few rows to sixes computes many zeros
    # (8x256x1024: 0.85x). 32 (AVX-512): 16 accumulators, 8 rows of two vectors or 4 of
    # four: 1.15-1.49x the 6x32 tile at 128x384x2048, 128x1024x384, 256^3, 512^3 and
    # 64x1024x256 (B packed once, 2 threads); 24 accumulators (12x32, 6x64) fell between.
    if _registers(capabilities) >= 32:
        registers = [(8, 2 * lanes, 1), (4, 4 * lanes, 1)]
        more_registers = [
            (6, 2 * lanes, 1),
            (12, 2 * lanes, 1),
            (6, 4 * lanes, 1),
            (8, 2 * lanes, 4),
            (4, 2 * lanes, 1),
        ]
    else:
        registers = [(6, 2 * lanes, 1), (4, 2 * lanes, 1)]
        more_registers = [(8, lanes, 1), (6, 2 * lanes, 4), (4, 2 * lanes, 4), (2, 4 * lanes, 1)]
    if plain.m < FEW_ROWS:
        # Tiles of exactly its rows, as for the unpacked points: a 1x256x1024 product, bound
        # by reading B, ran 1.17x torch.mm on 1 thread and 1.45x on 2 with 1x32, 0.88x and
        # 1.35x with 1x16 (AVX2).
        registers = [(plain.m, 4 * lanes, 1), (plain.m, 2 * lanes, 1)]
        more_registers = [(plain.m, 8 * lanes, 1), (plain.m, 4 * lanes, 4)]
    caches = [(64, 256, 256)]
    # (256, 256, 256): a thread's whole rows of a small product as one cache tile (255x129x193
    # on 2 threads: 0.76-0.78x -> 0.81-0.87x torch.mm; 1024^3 loses with it: not the default).
    more_caches = [(32, 128, 512), (64, 128, 128), (256, 256, 256)]
    heights = tuple(mr for mr, _, _ in registers)
    core = {(mr, nr) for mr, nr, _ in registers}
    favoured = {t: _fewest_zero_rows(plain.m, t, heights) for t in threads}
    for (t, (mr, nr, kr), cache), wide in _grid(
        [threads, registers, caches], [[], more_registers, more_caches]
    ):
        if not _packed_fits(info, plain, mr, nr, kr):
            continue
        score = 1.0 + (2.0 if (t > 1) == big else 0.0)
        if mr in heights and (plain.m < FEW_ROWS or (mr, nr) in core):
            score += 1.0 if mr == favoured[t] else 0.5
        score += 0.5 if cache == (64, 256, 256) else 0.0
        config = {
            "family": "contraction",
            "threads": t,
            "cache": list(cache),
            "register": [mr, nr, kr],
            "pack": True,
        }
        found.append((config, score, wide))
    return found


def schedule_space(
    info: PayloadInfo, capabilities: dict[str, Any]
) -> tuple[list[tuple[Config, float]], set[str]]:
    """Every configuration worth trying for this payload with its prior score, the core grid
    first, and the keys of the widened points."""
    if not any(op.is_root for op in info.ops):
        return [], set()  # no linalg op computes the result (a copy or reshape): nothing to do
    lanes = _lanes(capabilities, info.element_type)
    threads = _threads(capabilities)
    big = work(info) >= BIG_WORK
    found: list[tuple[Config, float, bool]] = []
    if info.kind == "contraction":
        contraction = info.find(CONTRACTIONS)
        if contraction is None or len(contraction.ranges) < 3:
            # A matrix-vector or vector-matrix product (m x k, no n): the contraction
            # schedules tile m, n and k and would fail to render it.
            return [], set()
        registers = [
            (8, 2 * lanes),
            (4, 2 * lanes),
            (6, 2 * lanes),
            (8, lanes),
            (4, 4 * lanes),
            (16, lanes),
        ]
        caches = [(64, 128, 256), (32, 256, 128), (128, 128, 64), (64, 64, 64), (256, 64, 128)]
        # Wider: register tiles of 12 and 24 accumulators (16 vector registers hold 12 and a
        # row of B; 32 hold 24), more cache tiles, and the k loop unrolled in registers.
        more_registers = [
            (6, 4 * lanes),
            (8, 3 * lanes),
            (4, 3 * lanes),
            (12, lanes),
            (2, 4 * lanes),
        ]
        more_caches = [(32, 128, 128), (64, 256, 256), (128, 64, 256), (16, 256, 512)]
        rows = contraction.ranges[-3]
        if 0 < rows < FEW_ROWS:
            # A few rows (a matrix-vector product): tiles of exactly those rows, no zero rows
            # (a 1x256x1024 linear took 4-row tiles, 3 of them zeros: 0.5x torch.mm).
            registers = [(rows, 4 * lanes), (rows, 8 * lanes)] + registers
        for (t, (mr, nr), cache, kr), wide in _grid(
            [threads, registers, caches, [1]], [[], more_registers, more_caches, [2, 4]]
        ):
            score = 0.0
            score += 2.0 if (t > 1) == big else 0.0
            if 0 < rows < FEW_ROWS:
                score += 1.5 if mr == rows else 0.0
            elif (mr, nr) == (8, 2 * lanes):
                score += 1.0
            elif mr * nr // lanes >= 8:
                score += 0.5
            score += 0.5 if cache == (64, 128, 256) else 0.0
            # Tiles are recorded as chosen, not clipped to this shape, so that a configuration
            # means the same on every operator it is transferred to (render clips).
            found.append(
                (
                    {
                        "family": "contraction",
                        "threads": t,
                        "cache": list(cache),
                        "register": [mr, nr, kr],
                    },
                    score,
                    wide,
                )
            )
        found += _packed_points(info, capabilities, threads, big, lanes)
        if info.math & APPROXIMABLE:
            # An epilogue's tanh, erf or exp (GELU, SiLU after a matmul): exact, each is a
            # scalar libm call per element, which cost a 64x256x1024 linear + GELU more than
            # its product; as polynomials they vectorize with the rest (verified like any).
            for point, _, _ in found:
                point["approximate_math"] = True
    elif info.kind == "convolution" and info.find(CONVOLUTIONS):
        conv = info.find(CONVOLUTIONS)
        assert conv is not None
        f_dim, ow_dim, c_dim = conv_dims(conv)
        channels, columns, inputs = conv.ranges[f_dim], conv.ranges[ow_dim], conv.ranges[c_dim]
        # Column tiles are whole vectors (a conv row of another width has been seen to
        # vectorize wrongly); a row shorter than a vector (8 columns under AVX-512's 16
        # lanes) takes the widest power of two that fits, a part of one vector.
        widths = [w for w in (2 * lanes, lanes) if w <= columns] or [
            w for w in (lanes // 2, lanes // 4) if 4 <= w <= columns
        ][:1]
        # Channel tiles divide the output channels: 16 or 8, else (33 of them) the largest
        # divisor up to 16.
        tiles = [f for f in (16, 8) if channels % f == 0] or [
            max(d for d in range(1, 17) if channels % d == 0)
        ]
        for (t, f, ow, c), wide in _grid(
            [threads, tiles, widths, [1, 4]], [[], [32, 4], [4 * lanes], [2, 8]]
        ):
            if not _conv_tiles_fit(channels, columns, inputs, t, f, ow, c):
                continue
            score = (2.0 if (t > 1) == big else 0.0) + (1.0 if f == 16 else 0.0)
            score += 0.5 if columns % ow == 0 else 0.0
            found.append(
                (
                    {"family": "conv", "threads": t, "channels": f, "columns": ow, "inputs": c},
                    score,
                    wide,
                )
            )
        found += _im2col_points(info, capabilities, threads, lanes, big)
    elif info.kind == "convolution" and info.find(DEPTHWISE):
        conv = info.find(DEPTHWISE)
        assert conv is not None
        columns, channels = conv.ranges[2], conv.ranges[3]
        # Whole vectors along the output row, or the whole row when it is shorter; and tiles
        # that divide the row (a partial tile has a dynamic size and stays scalar): the whole
        # row up to two vectors, and its largest divisor up to a vector (above 3).
        # (A strided row is read column by column: those tiles do not vectorize.)
        row_widths = {w for w in (2 * lanes, lanes) if w <= columns} | {min(columns, lanes)}
        orders = [False]
        if _row_contiguous(conv):
            orders = [True, False]
            if columns <= 2 * lanes:
                row_widths.add(columns)
            row_widths |= {max(d for d in range(1, lanes + 1) if columns % d == 0)} - {1, 2, 3}
        wider = [w for w in (4 * lanes,) if w <= columns and w not in row_widths]
        for (t, f, ow, inner), wide in _grid(
            [threads, [8, 4, 1], sorted(row_widths), orders], [[], [16, 2], wider, []]
        ):
            if not _depthwise_fits(channels, t, f) or (inner and f < 2):
                continue
            whole = columns % ow == 0
            score = 2.0 if (t > 1) == big else 0.0
            if inner:
                # Vectors along the row, in static tiles: 1.2-3.7x the channel-inner order at
                # 1x192x28x28, 1x32x112x112, 1x96x28x28 (7x7) and 1x384x14x14 (AVX-512). A
                # tile of more than eight vectors spills.
                score += 1.0 if whole else -0.5
                score += 1.0 if f * math.ceil(ow / lanes) <= 8 else 0.5
            else:
                score += 1.0 if f == 8 else 0.5 if f == 4 else 0
                score += 0.5 if whole else 0.0
            score += 0.25 if ow == max(row_widths) else 0.0
            direct: Config = {"family": "depthwise", "threads": t, "channels": f, "columns": ow}
            if inner:
                direct["columns_inner"] = True
            found.append((direct, score, wide))
        found += _row_block_points(info, capabilities, threads, lanes, big)
    elif info.kind == "elementwise" and transposing(info):
        # A layout copy (NCHW <-> NHWC around convolutions computed channels-last), maybe of
        # elementwise ops' result: tiles of whole input rows by whole output rows, transposed
        # in registers.
        reads, writes = transposed_dims(info.root)
        # An elementwise producer's tanh, erf or exp vectorizes only as a polynomial.
        approximate = [True] if info.math & APPROXIMABLE else [False]
        for (t, tile, lowering, approx), wide in _grid(
            [threads, [(4, lanes), (8, lanes)], ["eltwise", "shuffle_1d"], approximate],
            [[], [(4, 2 * lanes), (8, 2 * lanes), (2, lanes), (16, lanes)], [], []],
        ):
            score = (2.0 if (t > 1) == big else 0.0) + (1.0 if tile == (4, lanes) else 0.0)
            score += 0.5 if lowering == "eltwise" else 0.0
            if reads == writes:  # the innermost dim stays: rows are copied whole
                tile = (1, tile[1])
            transpose: Config = {
                "family": "transpose",
                "threads": t,
                "tile": list(tile),
                "lowering": lowering,
            }
            if approx:
                transpose["approximate_math"] = True
            found.append((transpose, score, wide))
    elif info.kind == "attention":
        found += _attention_points(info, capabilities, threads, lanes, big)
    elif info.kind in ("reduction", "elementwise"):
        approximate = [True, False] if info.math & APPROXIMABLE else [False]
        row_options = [1, 4, 8] if info.kind == "reduction" else [1, 4]
        more_rows = [2, 16] if info.kind == "reduction" else [2, 8]
        if all(len(op.ranges) <= 1 for op in info.ops):
            row_options, more_rows = [1], []  # one row (a payload collapsed whole): no choice
        # Longer vectors where they still tile the row (a whole-row vector of exact math has
        # failed to build; the core grid's vectors already cover rows this short).
        row = info.root.ranges[-1] if info.root.ranges else 0
        more_vectors = [8 * lanes] if row > 8 * lanes else []
        # A full reduction (a loss) has no parallel rows to share: threads would only repeat
        # the single-threaded kernel under another name.
        row_threads = threads if info.root.ranges else [1]
        either = EITHER_ROWS <= work(info) < BIG_WORK
        for (t, rows, vector, approx), wide in _grid(
            [row_threads, row_options, [4 * lanes, 2 * lanes, lanes], approximate],
            [[], more_rows, more_vectors, []],
        ):
            if ragged_rows(info, t, rows):
                continue
            score = 0.0
            score += 2.0 if either or (t > 1) == big else 0.0
            score += 1.5 if approx else 0.0
            score += 0.5 if rows == 1 else 0.0
            score += 0.5 if vector == 4 * lanes else 0.0
            config: Config = {"family": "rows", "threads": t, "rows": rows, "vector": vector}
            if approx:
                config["approximate_math"] = True
            found.append((config, score, wide))
            if info.wide_f64:
                # The same in f32 where torch-mlir widened a variance to f64 (group norm,
                # var, std): twice the lanes, no conversions; as eager computes it.
                found.append(({**config, "narrow_f64": True}, score + 1.0, wide))
    unique: dict[str, tuple[Config, float, bool]] = {}
    for config, score, wide in found:
        unique.setdefault(config_key(config), (config, score, wide))
    space = [(config, score) for config, score, _ in unique.values()]
    return space, {key for key, (_, _, wide) in unique.items() if wide}


def prepared_space(
    info: PayloadInfo, base: PayloadInfo, capabilities: dict[str, Any], marks: Config
) -> tuple[list[tuple[Config, float]], set[str]]:
    """The rows points of a payload prepared further than `base` (`info`: with its
    regrouping reshapes refined, `REGROUP`, or its innermost loops collapsed, `COLLAPSE`, or
    both, as `marks` says; `base`: the plain payload, or the regrouped one under both), each
    marked so, and the keys of the widened ones.

    Both decisions change what a rows schedule vectorizes along, the last loop. Regrouping
    also saves the passes over memory between the ops it lets one row loop fuse. Collapsing
    lengthens the rows, and is offered where `base`'s rows are not whole vectors, and on
    regrouped payloads. On an AVX2 machine, one configuration each
    (`benchmarks/collapse_dims.py`), collapsed against plain: a SiLU over 8x64x7x7 0.7x the
    time, a mean over 7x7 0.65x, a per-channel scale and shift at 14x14 0.89x; group norm +
    SiLU regrouped and collapsed 0.91x, 0.74x and 0.93x the best other preparation at 28,
    15 and 32 positions a row. Over rows that are already whole vectors the evidence was
    mixed (a SiLU at 56 wide 0.92x, a mean over 16x16 slower): not offered there.

    Ranks: rows that are whole vectors where `base`'s are not, well above the plain points;
    regrouped rows as whole as the plain ones, a little above them (a 4x32x32x32 group norm
    + SiLU refined to 32 floats a row: 0.93x the plain kernel's time), and collapsed as well,
    a little above that; rows that are not whole vectors, well below (a 4x36x15x15 group
    norm regrouped to rows of 15: 1.4x the plain kernel's time)."""
    lanes = _lanes(capabilities, info.element_type)
    whole, was_whole = _whole(_largest_row(info), lanes), _whole(_largest_row(base), lanes)
    if marks.get(COLLAPSE) and was_whole and not marks.get(REGROUP):
        return [], set()
    fused = 0.25 if marks.get(REGROUP) else 0.0
    if not whole:
        shift = -3.0
    elif not was_whole:
        shift = 0.75 + fused
    elif marks.get(COLLAPSE):
        shift = 0.25 + fused
    else:
        shift = fused
    points, widened = schedule_space(info, capabilities)
    marked: list[tuple[Config, float]] = []
    marked_wide: set[str] = set()
    for config, score in points:
        if config.get("family") != "rows":
            continue
        variant = {**config, **marks}
        marked.append((variant, score + shift))
        if config_key(config) in widened:
            marked_wide.add(config_key(variant))
    return marked, marked_wide


def _largest_row(info: PayloadInfo) -> int:
    """The last loop of the payload's largest op (the root, or the reduction feeding it)."""
    largest = largest_op(info) if info.ops else None
    return largest.ranges[-1] if largest is not None and largest.ranges else 0


def _whole(row: int, lanes: int) -> bool:
    """Whether nearly all (95%) of a row falls in whole vectors of `lanes`."""
    return row >= lanes and (row // lanes * lanes) / row >= 0.95


def _im2col_points(
    info: PayloadInfo, capabilities: dict[str, Any], threads: list[int], lanes: int, big: bool
) -> list[tuple[Config, float, bool]]:
    """A 2-D convolution as its windows' columns times the filters (`kope.spaces.im2col`):
    register tiles of whole panels of the output plane by rows of output channels, as many
    accumulators as the machine's vector registers hold beside a row of B (16 registers
    under AVX2, 32 under AVX-512); `im2col.fits` keeps those that render."""
    conv = im2col.conv_of(info)
    if conv is None:
        return []
    registers = _registers(capabilities)
    row = conv.ranges[3]

    def padding(nr: int) -> int:
        return im2col.panel_row(conv, nr) - row

    # Panels of one, two or half a vector, and the widest up to a vector that divides the row
    # exactly (a 14-column row: panels of 14); fewest zero columns first (up to an eighth of
    # the row counts as none), then whole vectors, then the widest. (Panels of 28 columns
    # under 16 lanes, one vector and a part, ran a 64-channel 56x56 convolution 10x slower
    # than panels of 32.)
    exact = [d for d in range(max(4, lanes // 2), lanes + 1) if row % d == 0]
    widths = sorted(
        {2 * lanes, lanes, max(4, lanes // 2), *exact[-1:]},
        key=lambda nr: (8 * padding(nr) > row, nr % lanes != 0, -nr),
    )
    tiles = [
        (mr, nr)
        for nr in widths
        for mr in (8, 6, 4, 2)
        if mr * math.ceil(nr / lanes) <= registers - 2 * math.ceil(nr / lanes)
        and conv.ranges[1] % mr == 0
    ]
    points: list[tuple[Config, float, bool]] = []
    for (t, (mr, nr), cache), wide in _grid(
        [threads, tiles[:3], [(64, 128, 256)]], [[], tiles[3:], [(32, 256, 128)]]
    ):
        config: Config = {
            "family": "conv",
            "algorithm": "im2col",
            "threads": t,
            "cache": list(cache),
            "register": [mr, nr, 1],
        }
        if not im2col.fits(info, config):
            continue
        # A 3x3 convolution of 16 to 32 channels on a 32x32 plane ran 216 us at the direct
        # schedules' best and 64 us so on two threads, 96 on one (eager 100; AVX-512): the
        # most accumulators first, threads by the work as everywhere.
        score = 2.0 if (t > 1) == big else 0.0
        score += 1.75 if (mr, nr) == tiles[0] else 0.5
        points.append((config, score, wide))
    return points


def _registers(capabilities: dict[str, Any]) -> int:
    """The vector registers a register tile may use: 32 under AVX-512, 16 under AVX2."""
    return 32 if int(capabilities.get("vector_bits", 256)) >= 512 else 16


def _row_block_points(
    info: PayloadInfo, capabilities: dict[str, Any], threads: list[int], lanes: int, big: bool
) -> list[tuple[Config, float, bool]]:
    """A depthwise convolution by blocks of output rows x columns in registers
    (`kope.spaces.depthwise`): blocks of 4 or 8 rows (6 and 2 widen) by one to four vectors,
    within the machine's vector registers (an accumulator each, beside an input vector and a
    filter tap)."""
    if depthwise.conv_of(info) is None:
        return []
    points: list[tuple[Config, float, bool]] = []
    for (t, rows, vectors), wide in _grid([threads, [4, 8], [2, 1]], [[], [6, 2], [4]]):
        config: Config = {
            "family": "depthwise",
            "algorithm": "rows",
            "threads": t,
            "rows": rows,
            "columns": vectors * lanes,
            "vector": lanes,
        }
        if not _row_blocks_fit(info, capabilities, config):
            continue
        # Every shape tried on AVX-512 (3x3 over 14-112 wide planes, 5x5, 7x7) ran 1.1-3x
        # eager this way and 0.5-1.25x with the row-at-a-time schedules: blocks first.
        score = 2.0 if (t > 1) == big else 0.0
        score += 2.5 if (rows, vectors) == (4, 2) else 2.3
        points.append((config, score, wide))
    return points


def _attention_points(
    info: PayloadInfo, capabilities: dict[str, Any], threads: list[int], lanes: int, big: bool
) -> list[tuple[Config, float, bool]]:
    """Attention by blocks of query rows (`kope.spaces.attention`): 4, 6 or 8 rows (2 and 12
    widen) by 2-4 vectors of keys a chunk of scores, V's vectors in the largest group whose
    sums fit beside them, within the machine's vector registers."""
    found = info.attention
    if found is None or found.value_depth % lanes:
        return []
    value_vectors = found.value_depth // lanes
    sums = _registers(capabilities) * 3 // 4  # the rest for loads of K or V and a broadcast
    points: list[tuple[Config, float, bool]] = []
    for (t, rows, keys), wide in _grid([threads, [6, 4, 8], [4, 2, 3]], [[], [2, 12], []]):
        config: Config = {
            "family": "attention",
            "threads": t,
            "rows": rows,
            "keys": keys,
            "values": attention.value_group(rows, value_vectors, sums),
            "vector": lanes,
        }
        if not _attention_fits(info, capabilities, config):
            continue
        score = 2.0 if (t > 1) == big else 0.0
        score += 1.0 if rows * keys == sums else 0.5 if rows >= 4 else 0.0
        points.append((config, score, wide))
    return points


def _attention_fits(info: PayloadInfo, capabilities: dict[str, Any], config: Config) -> bool:
    """Blocks of the machine's vectors that render (`attention.fits`), their sums within
    its vector registers beside the loads of K or V and a broadcast."""
    return (
        info.attention is not None
        and int(config.get("vector", 0)) == _lanes(capabilities, info.element_type)
        and attention.fits(info.attention, config)
        and attention.sums(config) + max(int(config["keys"]), int(config["values"])) + 1
        <= _registers(capabilities)
    )


def _row_blocks_fit(info: PayloadInfo, capabilities: dict[str, Any], config: Config) -> bool:
    """Row blocks of the machine's vectors that render (`depthwise.fits`), their sums in
    its vector registers beside an input vector and a filter tap."""
    return (
        int(config.get("vector", 0)) == _lanes(capabilities, info.element_type)
        and depthwise.fits(info, config)
        and depthwise.accumulators(config) + 2 <= _registers(capabilities)
    )


def _packed_fits(info: PayloadInfo, plain: PlainMatmul, mr: int, nr: int, kr: int) -> bool:
    """B packs in panels of this register tile, and k takes its unroll (else it would render
    as the point that does not unroll k)."""
    return packable(info, mr, nr) and k_unroll(plain, kr) == kr


def _conv_tiles_fit(
    channels: int, columns: int, inputs: int, threads: int, f: int, ow: int, c: int
) -> bool:
    """Thread chunks hold whole channel tiles, and input-channel tiles divide the input
    channels (a partial one makes the 1-D conv dynamic)."""
    return (
        0 < f <= channels
        and 0 < ow <= columns
        and c > 0
        and not inputs % c
        and (not channels % (threads * f))
    )


def _row_contiguous(conv: OpInfo) -> bool:
    """Whether a convolution reads each input row's columns one after another (stride 1
    along the row): vectors along the row are plain loads then, not gathers."""
    return not conv.strides or conv.strides[-1] == 1


def _depthwise_fits(channels: int, threads: int, f: int) -> bool:
    return 0 < f <= channels and not channels % (threads * f)


def renders(info: PayloadInfo, capabilities: dict[str, Any], config: Config) -> bool:
    """Whether `config`, off this payload's grid (proven on another operator, or a mutation
    of one), renders for it under the rules its family's grid keeps (the same predicates):
    a packable panel with a k unroll k takes (packed contraction), whole row steps (rows),
    channel and column tiles the convolution holds (conv, depthwise)."""
    family = config.get("family")
    threads = int(config.get("threads", 1))
    if threads not in _threads(capabilities):
        return False
    if config.get("approximate_math") and not info.math & APPROXIMABLE:
        return False  # no tanh, erf or exp to approximate: the exact kernel under another name
    if config.get("narrow_f64") and not info.wide_f64:
        return False
    if family == "contraction":
        if info.kind != "contraction":
            return False
        if not config.get("pack"):
            return True
        plain = info.plain_matmul
        mr, nr, kr = config["register"]
        return plain is not None and _packed_fits(info, plain, mr, nr, kr)
    if family == "rows":
        rows = int(config.get("rows", 1))
        return info.kind in ("reduction", "elementwise") and not ragged_rows(info, threads, rows)
    if family == "conv" and config.get("algorithm") == "im2col":
        return im2col.fits(info, config)
    if family == "conv":
        conv = info.find(CONVOLUTIONS)
        if conv is None:
            return False
        f_dim, ow_dim, c_dim = conv_dims(conv)
        f, ow, c = (int(config.get(k, 0)) for k in ("channels", "columns", "inputs"))
        extents = conv.ranges[f_dim], conv.ranges[ow_dim], conv.ranges[c_dim]
        return _conv_tiles_fit(*extents, threads, f, ow, c)
    if family == "attention":
        return _attention_fits(info, capabilities, config)
    if family == "depthwise" and config.get("algorithm") == "rows":
        return _row_blocks_fit(info, capabilities, config)
    if family == "depthwise":
        conv = info.find(DEPTHWISE)
        f = int(config.get("channels", 0))
        if conv is None:
            return False
        if config.get("columns_inner") and (f < 2 or not _row_contiguous(conv)):
            return False  # a one-channel tile folds to 1-D: no loops to interchange
        return _depthwise_fits(conv.ranges[3], threads, f)
    return family == "transpose" and transposing(info)
