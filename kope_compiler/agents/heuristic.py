"""The heuristic agent: the embedded default, offline and deterministic under a seed.

For MLIR targets (CPU) it writes transform-dialect schedules (`kope.agents.schedules`) for
the operator's linalg payload; for Triton targets (CUDA, Ascend) it writes Triton kernels
translated from that payload (`kope.agents.triton_kernels`). It searches either space with
this policy:

1. Candidates: a grid per kernel family (threads, cache and register tiles, k-unroll, rows per
   step, vector length, polynomial math), ordered by a static prior (a crude cost model: use
   every core on big work, keep 16 accumulators in vector registers, vectorize math). A core
   grid is widened by more tile, unroll, row and vector choices; until a cost model is fitted
   a widened point ranks below every core point (`WIDENED`), so with no experience the search
   is the core grid's, in the prior's order, and the widened points follow it; once a cost
   model is fitted, they compete, losing only ties to core points (`UNPROVEN`) except on
   exploring attempts.
2. Memory: experience from similar operators reorders the candidates. Once at least
   `cost_model.MIN_ROWS` timed attempts of operators at least half alike are known (this
   session's own attempts count), a learned cost model (`kope.agents.cost_model`, gradient-
   boosted trees fitted on their measured speedups, refitted every attempt) predicts each
   candidate's log speedup, and the score blends prior and prediction with a weight that
   grows with the evidence and with how well the model, fitted without some operators,
   ranks their attempts (`CostModel.trust`). With less, a decision value (e.g. `threads=2`,
   `register=8x32x1`) that sped up similar operators gains, in proportion to the similarity
   and the log of the speedup. Either way, a decision value that failed on a similar
   operator loses, a whole configuration that failed on a very similar operator is not tried
   again, and a configuration proven on a very similar operator earns a bonus by its gain, so
   the first attempt reuses it when the evidence outweighs the prior.
3. Search: after the first verified kernel, it climbs: the next attempt changes one decision
   of the best kernel so far (the highest-scoring such neighbour; of kernels whose figures tie
   within noise, the first found); every third attempt explores the best untried
   configuration instead.
4. Stopping: when the space is exhausted; when, after four verified attempts, the best kernel
   is still under 0.3x eager and the last three did not improve it, or after six it is still
   under 0.5x (eager is already best); or when eight attempts in, the last five improved
   nothing by 2% (converged). Where nothing is timed (Triton's interpreter, no device), after
   `UNTIMED_KERNELS` verified kernels: the device ranks them (`kope export`).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kope.agents import cost_model
from kope.agents.base import (
    Agent,
    Experience,
    Feedback,
    Proposal,
    ProposalRequest,
    TaskView,
)
from kope.agents.schedules import (
    CONVOLUTIONS,
    DEPTHWISE,
    Config,
    config_key,
    conv_dims,
    describe,
    fits,
    k_unroll,
    kernel_source,
    packable,
    ragged_rows,
    transposed_dims,
    transposing,
    work,
)
from kope.agents.triton_kernels import describe_config as describe_triton
from kope.agents.triton_kernels import render_triton, triton_space, unsupported_reason
from kope.memory.store import first_of_the_fastest
from kope.passes.analysis import CONTRACTIONS, PayloadInfo, analyze, prepare_payload
from kope.vocabulary.kernels import FORM_MLIR, FORM_TRITON

log = logging.getLogger("kope.agents.heuristic")

APPROXIMABLE = {"math.exp", "math.erf", "math.tanh"}
BIG_WORK = 1 << 16  # iterations above which threads are expected to pay off
# Rows operators from half of that on go either way (a 64x768 layer norm: 22.6 us on one
# thread, 19.2 on two, eager 26.3), so both counts rank alike and both are tried early.
EITHER_ROWS = BIG_WORK // 2
FEW_ROWS = 4  # a product of fewer rows than the shortest usual register tile
# Prior points a widened grid point gives up while nothing is learned: more than the prior's
# whole span plus the seeded jitter, so that with no experience the core grid is searched
# first, in its own order. Under a fitted cost model it gives up only UNPROVEN, more than the
# jitter: where the model cannot tell a widened point from its core twin (a decision no
# similar operator varied), the core point goes first, except on an exploring attempt.
WIDENED = 5.0
UNPROVEN = 0.5
# Verified Triton kernels per operator where nothing is timed (under Triton's interpreter):
# more would only verify more variants that no figure ranks.
UNTIMED_KERNELS = 3


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


def candidate_space(info: PayloadInfo, capabilities: dict[str, Any]) -> list[tuple[Config, float]]:
    """Every configuration worth trying for this payload, with its prior score (a widened
    point's less WIDENED: what the agent ranks by while it has learned nothing)."""
    space, widened = schedule_space(info, capabilities)
    return [
        (config, prior - (WIDENED if config_key(config) in widened else 0.0))
        for config, prior in space
    ]


def _fewest_zero_rows(m: int, threads: int, heights: tuple[int, ...]) -> int:
    """The tallest register tile of `heights` whose zero rows (m padded to whole tiles for
    each thread) are at most an eighth of m, else the one with the fewest."""
    padded = {h: math.ceil(m / (threads * h)) * threads * h for h in heights}
    fine = [h for h in heights if 8 * padded[h] <= 9 * m]
    return max(fine) if fine else min(heights, key=lambda h: (padded[h], -h))


def _packed_points(
    info: PayloadInfo, threads: list[int], big: bool, lanes: int
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
    # Register tiles of 12 accumulators (6 rows of two vectors: with two vectors of B and a
    # broadcast of A, 15 of AVX2's 16 registers) and of 8. The 12 hide the FMA's latency
    # better: 6x16 ran 1.05-1.25x faster than 4x16 at 255x129x193, 256^3 and 512^3 on AVX2,
    # unless padding a few rows to sixes computes many zeros (8x256x1024: 0.85x).
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
    favoured = {t: _fewest_zero_rows(plain.m, t, heights) for t in threads}
    for (t, (mr, nr, kr), cache), wide in _grid(
        [threads, registers, caches], [[], more_registers, more_caches]
    ):
        if not packable(info, mr, nr):
            continue
        if k_unroll(plain, kr) != kr:
            continue  # it would render as the point that does not unroll k
        score = 1.0 + (2.0 if (t > 1) == big else 0.0)
        if mr in heights and (nr == 2 * lanes or plain.m < FEW_ROWS):
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
        found += _packed_points(info, threads, big, lanes)
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
            # Thread chunks hold whole channel tiles, and input-channel tiles divide the
            # input channels (a partial one makes the 1-D conv dynamic).
            if f > channels or ow > columns or inputs % c or channels % (t * f):
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
    elif info.kind == "convolution" and info.find(DEPTHWISE):
        conv = info.find(DEPTHWISE)
        assert conv is not None
        columns, channels = conv.ranges[2], conv.ranges[3]
        # Whole vectors along the output row, or the whole row when it is shorter.
        widths = sorted({w for w in (2 * lanes, lanes) if w <= columns} | {min(columns, lanes)})
        wider = [w for w in (4 * lanes,) if w <= columns and w not in widths]
        for (t, f, ow), wide in _grid([threads, [8, 4, 1], widths], [[], [16, 2], wider]):
            if f > channels or channels % (t * f):
                continue
            score = (2.0 if (t > 1) == big else 0.0) + (1.0 if f == 8 else 0.5 if f == 4 else 0)
            score += 0.5 if columns % ow == 0 else 0.0
            score += 0.25 if ow == max(widths) else 0.0
            found.append(
                (
                    {"family": "depthwise", "threads": t, "channels": f, "columns": ow},
                    score,
                    wide,
                )
            )
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
    elif info.kind in ("reduction", "elementwise"):
        approximate = [True, False] if info.math & APPROXIMABLE else [False]
        row_options = [1, 4, 8] if info.kind == "reduction" else [1, 4]
        more_rows = [2, 16] if info.kind == "reduction" else [2, 8]
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


def decisions(config: Config) -> list[tuple[str, str]]:
    """The decision values of a configuration, e.g. ("threads", "2")."""
    return [
        (k, config_key(v) if isinstance(v, list) else str(v))
        for k, v in sorted(config.items())
        if k != "family"
    ]


# -- memory ------------------------------------------------------------------------------------


@dataclass
class MemoryAdvice:
    value: dict[tuple[str, str], float]  # decision value -> score learned from timed attempts
    penalty: dict[tuple[str, str], float]  # decision value -> score lost to failed attempts
    banned: set[str]  # configurations that failed on a very similar operator
    bonus: dict[str, tuple[float, str]]  # config key -> (score bonus, attempt it was proven by)


MIN_TRANSFER = 0.85  # similarity below which a configuration is not reused as is
VALUE_SCALE = 3.0  # weight of learned log speedups against the prior's units


def learn(experience: Iterable[Experience], family: str, big: bool | None = None) -> MemoryAdvice:
    """What experience says about each decision value and each configuration.

    A decision value's learned worth is how much better than average (in log speedup over
    eager) the attempts that used it did, weighted by the square of their operator's
    similarity, and scaled by the confidence that weight gives (evidence from unlike
    operators moves nothing). A configuration proven on an operator at least MIN_TRANSFER
    similar earns a bonus in proportion to similarity and gain; one that failed on an
    operator at least 0.8 similar is banned; failures count against their decision values.

    Whether threads pay depends on the work (`BIG_WORK`), so where this operator's work
    (`big`) is on the other side of it from an attempt's operator, that attempt says nothing
    of threads and its configuration is not reused as is: one proven on a 128x256 GELU ran
    on one thread, and reused on a 257x513 one it ran at 0.6x the prior's two-thread pick.
    """
    verified: list[tuple[float, float, list[tuple[str, str]]]] = []
    value: dict[tuple[str, str], float] = {}
    penalty: dict[tuple[str, str], float] = {}
    banned: set[str] = set()
    bonus: dict[str, tuple[float, str]] = {}
    for item in experience:
        config = item.config
        if not config or config.get("family") != family:
            continue
        weight = max(0.0, min(1.0, item.similarity)) ** 2
        if item.verdict == "verified" and not item.speedup_vs_eager:
            continue  # verified, never timed (interpreted): says nothing of speed, nor failure
        if item.verdict == "verified" and item.speedup_vs_eager:
            gain = math.log(max(item.speedup_vs_eager, 1e-3))
            crossing = big is not None and item.work and (item.work >= BIG_WORK) != big
            used = [d for d in decisions(config) if not (crossing and d[0] == "threads")]
            verified.append((weight, gain, used))
            if item.similarity >= MIN_TRANSFER and gain > 0 and not crossing:
                key = config_key(config)
                score = VALUE_SCALE * item.similarity * gain
                if score > bonus.get(key, (0.0, ""))[0]:
                    bonus[key] = (score, item.attempt_id)
        else:
            for decision in decisions(config):
                penalty[decision] = penalty.get(decision, 0.0) - 0.5 * weight
            if item.similarity >= 0.8:
                banned.add(config_key(config))
    total = sum(w for w, _, _ in verified)
    if total > 0:
        baseline = sum(w * g for w, g, _ in verified) / total
        sums: dict[tuple[str, str], list[float]] = {}
        for weight, gain, used in verified:
            for decision in used:
                entry = sums.setdefault(decision, [0.0, 0.0])
                entry[0] += weight * (gain - baseline)
                entry[1] += weight
        for decision, (weighted, weights) in sums.items():
            confidence = weights / (weights + 1.0)
            value[decision] = VALUE_SCALE * confidence * weighted / weights
    return MemoryAdvice(value, penalty, banned, bonus)


class Scorer:
    """A candidate's score: its prior and what memory says of it.

    With a fitted cost model, `(1 - b) * prior + b * VALUE_SCALE * predicted log speedup`
    (b: the model's blend, growing with the evidence), a widened point's less UNPROVEN unless
    `exploring`; without one, the prior (a widened point's less WIDENED) plus the learned
    decision values. Failed decision values and the proven-transfer bonus apply to both."""

    def __init__(
        self,
        advice: MemoryAdvice,
        model: cost_model.CostModel | None,
        here: cost_model.Workload,
        prior_weight: float,
        widened: set[str],
        exploring: bool = False,
    ):
        self.advice = advice
        self.model = model
        self.here = here
        self.prior_weight = prior_weight
        self.widened = widened
        self.exploring = exploring

    def scores(self, candidates: Sequence[tuple[Config, float]]) -> list[float]:
        advice = self.advice
        learned: list[float]
        if self.model is None:
            blend = 0.0
            learned = [
                sum(advice.value.get(d, 0.0) for d in decisions(config))
                - (WIDENED if config_key(config) in self.widened else 0.0)
                for config, _ in candidates
            ]
        else:
            blend = self.model.blend
            predicted = self.model.predict(self.here, [config for config, _ in candidates])
            handicap = 0.0 if self.exploring else UNPROVEN
            learned = [
                blend * VALUE_SCALE * p - (handicap if config_key(config) in self.widened else 0.0)
                for p, (config, _) in zip(predicted, candidates, strict=True)
            ]
        scores = []
        for (config, prior), gained in zip(candidates, learned, strict=True):
            score = (1.0 - blend) * self.prior_weight * prior + gained
            score += sum(advice.penalty.get(d, 0.0) for d in decisions(config))
            scores.append(score + advice.bonus.get(config_key(config), (0.0, ""))[0])
        return scores


# -- the agent ---------------------------------------------------------------------------------


class HeuristicAgent(Agent):
    """Schedules from a searched grid, ordered by a prior and by experience."""

    name = "heuristic"
    has_prior = True

    def __init__(self, seed: int = 0, jitter: float = 0.3, prior: str = "static", **_: Any):
        from kope.options import PRIORS

        if prior not in PRIORS:
            raise ValueError(f"prior={prior!r} is not one of {', '.join(PRIORS)}")
        self.seed = seed
        self.jitter = jitter  # seeded noise on the prior: different seeds explore differently
        self.prior = prior
        # flat: no hand-written ranking at all (what experience finds on its own)
        self.prior_weight = 1.0 if prior == "static" else 0.0
        self._prepared: dict[tuple[str, bool, bool], str] = {}
        self._transferred: str | None = None  # the attempt the last choice reuses

    def _payload(self, request: ProposalRequest, config: Config | None = None) -> str:
        """The task's payload prepared as `config` asks (polynomial math, f64 narrowed)."""
        approximate = bool(config and config.get("approximate_math"))
        narrow = bool(config and config.get("narrow_f64"))
        key = (request.task.key, approximate, narrow)
        if key not in self._prepared:
            self._prepared[key] = prepare_payload(
                request.task.payload, approximate_math=approximate, narrow_f64=narrow
            )
        return self._prepared[key]

    def propose(self, request: ProposalRequest) -> Proposal | None:
        forms = request.task.kernel_forms
        if FORM_MLIR in forms:
            return self._propose_schedule(request)
        if FORM_TRITON in forms:
            return self._propose_triton(request)
        return None  # it writes MLIR schedules and Triton kernels; this target builds neither

    def _propose_schedule(self, request: ProposalRequest) -> Proposal | None:
        info = analyze(self._payload(request))
        space, widened = schedule_space(info, request.task.capabilities)
        found = self._search(space, request, info, widened)
        if found is None:
            return None
        choice, parent, why = found
        payload = self._payload(request, choice)
        source = kernel_source(payload, analyze(payload), choice)
        return Proposal(
            source=source,
            decision=f"{describe(choice)} ({why})",
            config=choice,
            parent=parent,
            transferred_from=self._transferred,
        )

    def _propose_triton(self, request: ProposalRequest) -> Proposal | None:
        task = request.task
        if task.capabilities.get("interpreter") and _verified(request.history) >= UNTIMED_KERNELS:
            return None  # nothing is timed here: a few verified variants are the device's to rank
        try:
            space = triton_space(task.payload, task.inputs, task.outputs, task.capabilities)
        except Exception:  # a generator defect must cost this operator its kernel, not the run
            log.exception("%s: the Triton kernel generator failed; no Triton kernel", task.label)
            return None
        if not space:
            log.info("%s: no Triton kernel: %s", task.label, triton_unsupported(task))
            return None
        try:
            info: PayloadInfo | None = analyze(self._payload(request))
        except Exception:  # its loops only sharpen the cost model's features
            log.warning("%s: the payload's loops are unknown to the cost model", task.label)
            info = None
        found = self._search(space, request, info)
        if found is None:
            return None
        choice, parent, why = found
        try:
            source = render_triton(
                task.payload, task.inputs, task.outputs, choice, task.capabilities
            )
        except Exception:
            log.exception("%s: the Triton kernel generator failed on %s", task.label, choice)
            return None
        return Proposal(
            source=source,
            decision=f"{describe_triton(choice)} ({why})",
            form=FORM_TRITON,
            config=choice,
            parent=parent,
            transferred_from=self._transferred,
        )

    def _search(
        self,
        space: list[tuple[Config, float]],
        request: ProposalRequest,
        info: PayloadInfo | None = None,
        widened: set[str] | None = None,
    ) -> tuple[Config, str | None, str] | None:
        """The next configuration of `space` by prior, memory and the session's history: the
        configuration, the attempt it refines, and why it was chosen; None to stop."""
        self._transferred = None
        if not space or _should_stop(request.history):
            return None
        family = space[0][0]["family"]
        big = work(info) >= BIG_WORK if info is not None else None
        advice = learn(request.experience, family, big)
        here = cost_model.task_workload(request.task, info)
        model = cost_model.fit(
            cost_model.training_rows(request.experience, request.history, here, family)
        )
        exploring = _exploring(request.history)
        scorer = Scorer(advice, model, here, self.prior_weight, widened or set(), exploring)
        tried = {config_key(f.config) for f in request.history if f.config}
        rng = random.Random(f"{self.seed}:{request.task.key}")
        candidates = [
            (config, prior)
            for config, prior in space
            if config_key(config) not in tried and config_key(config) not in advice.banned
        ]
        on_grid = {config_key(config) for config, _ in candidates}
        for key in advice.bonus:  # proven configurations off this grid, with no prior
            if key not in tried and key not in advice.banned and key not in on_grid:
                config = json.loads(key)
                if info is None or fits(info, config):
                    candidates.append((config, 0.0))
        scored = [
            (score + rng.uniform(0.0, self.jitter), config)
            for score, (config, _) in zip(scorer.scores(candidates), candidates, strict=True)
        ]
        choice, parent = self._choose(scored, request)
        if choice is None:
            return None
        self._transferred = advice.bonus.get(config_key(choice), (0.0, None))[1]
        why = self._why(choice, parent, self._transferred, request, model is not None)
        return choice, parent, why

    def _choose(
        self, scored: list[tuple[float, Config]], request: ProposalRequest
    ) -> tuple[Config | None, str | None]:
        """The next configuration, and the attempt it refines (if it changes the best one)."""
        if not scored:
            return None, None
        scored.sort(key=lambda s: -s[0])
        history = request.history
        if not history:
            return scored[0][1], None
        best = _best(history)
        if best is not None and best.config and not _exploring(history):
            neighbours = [(s, c) for s, c in scored if _distance(c, best.config) == 1]
            if neighbours:
                return neighbours[0][1], best.attempt_id
        failed = [f for f in history if f.verdict != "verified" and f.config]
        if failed and best is None:
            bad = {d for f in failed for d in decisions(f.config or {})}
            clean = [(s, c) for s, c in scored if not (set(decisions(c)) & bad)]
            if clean:
                return clean[0][1], None
        return scored[0][1], None

    @staticmethod
    def _why(
        config: Config,
        parent: str | None,
        transferred: str | None,
        request: ProposalRequest,
        learned: bool,
    ) -> str:
        if transferred:
            source = next((e for e in request.experience if e.attempt_id == transferred), None)
            where = source.task_label if source else "a similar operator"
            return f"best schedule of {where}"
        if parent:
            best = next((f for f in request.history if f.attempt_id == parent), None)
            changed = [
                k
                for k, _ in decisions(config)
                if best and best.config and config.get(k) != best.config.get(k)
            ]
            return f"changes {', '.join(changed) or 'nothing'} of the best so far"
        if request.history:
            return "exploring"
        return "highest score by the cost model" if learned else "highest prior"


def _exploring(history: list[Feedback]) -> bool:
    """Whether the next attempt explores (every third) instead of refining the best."""
    return len(history) % 3 == 2


def _verified(history: list[Feedback]) -> int:
    return sum(1 for f in history if f.verdict == "verified")


def triton_unsupported(task: TaskView) -> str:
    reason = unsupported_reason(task.payload, task.inputs, task.outputs, task.capabilities)
    return reason or "no configuration fits"


def _best(history: list[Feedback]) -> Feedback | None:
    """The attempt the climb refines: the first of those within noise (WIN_MARGIN) of the
    fastest, so that a tie, which the machine decides, does not send two runs of the same seed
    down different paths."""
    verified = [f for f in history if f.verdict == "verified" and f.speedup_vs_eager]
    return first_of_the_fastest(verified, lambda f: f.speedup_vs_eager or 0.0)


def _distance(a: Config, b: Config) -> int:
    keys = set(a) | set(b)
    return sum(1 for k in keys if a.get(k) != b.get(k))


def _best_speedup(history: list[Feedback]) -> float:
    return max((f.speedup_vs_eager or 0.0 for f in history if f.verdict == "verified"), default=0.0)


def _should_stop(history: list[Feedback]) -> bool:
    verified = [f for f in history if f.verdict == "verified" and f.speedup_vs_eager]
    best_now = _best_speedup(history)
    if len(verified) >= 4 and best_now < 0.3 and best_now <= _best_speedup(history[:-3]) * 1.05:
        return True
    if len(verified) >= 6 and best_now < 0.5:
        return True
    return len(history) >= 8 and best_now <= _best_speedup(history[:-5]) * 1.02
