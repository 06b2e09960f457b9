"""The heuristic agent's learned cost model: it learns what timed attempts say, it is fitted
only on enough evidence, and with none the agent ranks as it did before it learned (the first
attempts on an empty store are the ones it proposed then)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.agents import cost_model
from kope.agents.base import Experience, Feedback, ProposalRequest, TaskView
from kope.agents.cost_model import CostModel, Row, Workload
from kope.agents.heuristic import HeuristicAgent, candidate_space
from kope.agents.search import WIDENED, MemoryAdvice, Scorer, Search, Space, evolve
from kope.frontend.partition import partition
from kope.memory.schema import AttemptRecord, TaskRecord
from kope.memory.store import ExperienceStore
from kope.passes.analysis import analyze, prepare_payload
from kope.spaces.cpu import renders, schedule_space
from kope.spaces.schedules import Config, config_key
from kope.targets.cpu import CpuTarget
from kope.tuner.experience import measured_evidence, retrieve_experience
from kope.tuner.optimize import task_view

# Fixed capabilities (AVX2: 8 lanes of f32; two OpenMP threads), so that the expected
# configurations below do not depend on the machine the tests run on; and a fixed key, since
# the agent's tie-breaking jitter is seeded by the task's key, which names the machine.
CAPABILITIES = {"vector_bits": 256, "threads": 2, "openmp": True}


def _view(fn: Any, *args: torch.Tensor) -> TaskView:
    tasks = partition(make_fx(fn, tracing_mode="fake")(*args), CpuTarget()).tasks
    assert len(tasks) == 1, [t.label for t in tasks]
    view = task_view(tasks[0], CpuTarget())
    key = hashlib.sha256(view.payload.encode()).hexdigest()
    return dataclasses.replace(view, capabilities=CAPABILITIES, key=key)


def _mm(m: int, k: int, n: int) -> TaskView:
    return _view(torch.mm, torch.randn(m, k), torch.randn(k, n))


def _matmul(threads: int, register: tuple[int, int, int] = (8, 16, 1)) -> Config:
    return {
        "family": "contraction",
        "threads": threads,
        "cache": [64, 128, 256],
        "register": list(register),
    }


SIX = (6, 16, 1)  # a register tile of 6 rows by two AVX2 vectors


def _packed(threads: int, register: tuple[int, int, int] = (4, 16, 1)) -> Config:
    return {**_matmul(threads, register), "cache": [64, 256, 256], "pack": True}


def _attempt(
    index: int,
    config: Config,
    speedup: float,
    loops: tuple[int, ...],
    similarity: float = 0.8,
    verdict: str = "verified",
) -> Experience:
    m, n, k = loops
    return Experience(
        f"a{index}",
        f"task{loops}",
        f"aten.mm({m}x{k}, {k}x{n})",
        "aten.mm.default",
        ((m, k), (k, n)),
        similarity,
        "d",
        config,
        verdict,
        speedup if verdict == "verified" else None,
        None,
        outputs=((m, n),),
        loop_ranges=loops,
        linalg_ops=2,
    )


def _workload(m: int, n: int, k: int) -> Workload:
    return Workload((m, n, k), 2, m * k + k * n, m * n)


# -- the model ----------------------------------------------------------------------------------


def test_the_model_learns_that_threads_pay_on_big_operators_only() -> None:
    """Planted: two threads run big matmuls 2x faster than eager and small ones 0.5x; one
    thread 1x everywhere. On shapes it never saw, it ranks threads by size as planted."""
    sizes = [16, 24, 32, 48, 192, 256, 320, 384]
    rows = [
        Row(_workload(s, s, s), _matmul(t), 1.0 if t == 1 else (2.0 if s >= 128 else 0.5), 1.0)
        for s in sizes
        for t in (1, 2)
    ]
    model = CostModel(rows)
    big = model.predict(_workload(288, 288, 288), [_matmul(2), _matmul(1)])
    small = model.predict(_workload(20, 20, 20), [_matmul(2), _matmul(1)])
    assert big[0] > big[1] + 0.3 and small[1] > small[0] + 0.3, (big, small)
    again = CostModel(rows).predict(_workload(288, 288, 288), [_matmul(2), _matmul(1)])
    assert again == big  # deterministic


def test_rows_come_from_timed_attempts_of_the_family_weighted_by_similarity() -> None:
    here = _workload(64, 64, 64)
    experience = [
        _attempt(0, _matmul(2), 1.5, (64, 64, 32), similarity=0.9),
        _attempt(1, _matmul(1), 0.0, (64, 64, 32), verdict="mismatch"),  # failed: not a row
        _attempt(2, {"family": "rows", "threads": 1, "rows": 1, "vector": 8}, 2.0, (8, 8, 8)),
        _attempt(3, _matmul(1), 1.2, (64, 64, 64)),  # this session's own attempt, retrieved
    ]
    history = [Feedback("a3", "d", _matmul(1), "verified", None, 8.0, 10.0, 1.25, 3.0)]
    rows = cost_model.training_rows(experience, history, here, "contraction")
    assert [(r.speedup, r.weight) for r in rows] == [(1.25, 1.0), (1.5, pytest.approx(0.81))]
    assert rows[0].workload == here and rows[1].workload.loops == (64, 64, 32)


def test_roofline_estimates_stand_in_where_no_device_timed_an_operator() -> None:
    """On a device nothing here can time (a Triton target), an attempt's roofline estimate is
    a row at half weight, as 1 / estimate; an operator with timings keeps only its timings."""
    here = _workload(64, 64, 64)

    def untimed(index: int, threads: int, loops: tuple[int, ...], estimate: float) -> Experience:
        item = _attempt(index, _matmul(threads), 1.0, loops, similarity=1.0)
        return replace(item, speedup_vs_eager=None, estimate_us=estimate)

    estimated = [
        untimed(0, 2, (64, 64, 32), 4.0),
        untimed(1, 1, (64, 64, 32), 8.0),
        replace(_attempt(2, _matmul(1), 1.5, (32, 32, 32), similarity=1.0), estimate_us=2.0),
        untimed(3, 2, (32, 32, 32), 1.0),
    ]
    history = [Feedback("h", "d", _matmul(2), "verified", None, None, None, None, None)]
    history.append(replace(history[0], attempt_id="h2", estimate_us=5.0))
    rows = cost_model.training_rows(estimated, history, here, "contraction")
    got = sorted((r.workload.loops, r.speedup, r.weight) for r in rows)
    assert got == [
        ((32, 32, 32), 1.5, 1.0),  # timed: its operator's estimate (attempt 3) is dropped
        ((64, 64, 32), 0.125, cost_model.ESTIMATE_WEIGHT),
        ((64, 64, 32), 0.25, cost_model.ESTIMATE_WEIGHT),
        ((64, 64, 64), 0.2, cost_model.ESTIMATE_WEIGHT),
    ]


def test_too_little_evidence_fits_no_model() -> None:
    # Attempts of three operators, one each: nothing compares two configurations.
    alone = [Row(_workload(s, s, s), _matmul(2), 2.0, 1.0) for s in (32, 64, 128)]
    assert cost_model.fit(alone + [Row(_workload(16, 16, 16), _matmul(1), 1.0, 1.0)]) is None
    unlike = [
        Row(_workload(s, s, s), _matmul(t), float(t), 0.2**2) for s in (32, 48, 64) for t in (1, 2)
    ]
    assert cost_model.fit(unlike) is None  # many rows of unlike operators weigh too little
    one = [Row(_workload(64, 64, 64), _matmul(t, r), t * r[0] / 8, 1.0) for t in (1, 2)
           for r in ((8, 16, 1), (4, 16, 1))]  # fmt: skip
    model = cost_model.fit(one)
    assert model is not None and model.blend == 0.0  # no other operator to check it on


def test_the_model_compares_configurations_of_one_operator_not_operators() -> None:
    """Planted: operators differ 100-fold in speedup over eager, and on every one two threads
    run 1.5x one. Fitted on the attempts' speedups relative to their operator's, the model
    predicts the 1.5x on an operator it never saw."""
    rows = [
        Row(_workload(s, s, s), _matmul(t), base * (1.5 if t == 2 else 1.0), 1.0)
        for s, base in ((32, 0.05), (48, 5.0), (64, 0.3), (96, 2.0), (128, 0.1), (160, 4.0))
        for t in (1, 2)
    ]
    model = cost_model.fit(rows)
    assert model is not None and model.trust > 0.5
    two, one = model.predict(_workload(80, 80, 80), [_matmul(2), _matmul(1)])
    assert two - one == pytest.approx(math.log(1.5), abs=0.1)


def _planted(sizes: list[int], speedup: Any) -> list[Row]:
    return [Row(_workload(s, s, s), _matmul(t), speedup(s, t), 1.0) for s in sizes for t in (1, 2)]


def test_the_model_is_trusted_as_far_as_it_ranks_unseen_operators_right() -> None:
    """Planted as above, a model fitted without an operator orders its two attempts as
    measured: trusted, its blend grows with the evidence. Planted at random (each operator's
    order a coin toss), it cannot: the static prior keeps the score."""
    sizes = [16, 24, 32, 48, 192, 256, 320, 384]
    learnable = CostModel(
        _planted(sizes, lambda s, t: 1.0 if t == 1 else (2.0 if s >= 128 else 0.5))
    )
    assert learnable.trust >= 0.5
    assert 0.0 < learnable.blend < cost_model.MAX_BLEND
    toss = random.Random(0)
    coins = {(s, t): toss.choice((0.5, 2.0)) for s in sizes for t in (1, 2)}
    coin = CostModel(_planted(sizes, lambda s, t: coins[s, t]))
    assert coin.trust < learnable.trust and coin.blend < learnable.blend


def test_trust_counts_the_pairs_that_differ_by_more_than_noise() -> None:
    """Planted: on every operator two threads run 2x one thread (learnable), and a register
    tile moves the speed by a random 3% (noise, as remeasuring one kernel moves it). Only the
    pairs farther apart than noise say whether the model ranks right: it does."""
    sizes = [16, 24, 32, 48, 192, 256, 320, 384]
    toss = random.Random(0)
    rows = [
        Row(_workload(s, s, s), _matmul(t, r), t * toss.uniform(0.97, 1.03), 1.0)
        for s in sizes
        for t in (1, 2)
        for r in ((8, 16, 1), (4, 16, 1))
    ]
    assert CostModel(rows).trust > 0.9


def test_a_search_fits_the_other_operators_folds_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A search adds one row of its own operator per attempt; the other operators' rows, on
    which the model's transfer is checked fold by fold, stay the same: their folds are fitted
    at the first attempt only, and later attempts fit the model alone. The searched
    operator's attempts are checked against a model of the others: ordered as the plant
    orders them they keep the trust, ordered against it they lower it."""
    sizes = [16, 24, 32, 48, 192, 256, 320, 384]
    others = _planted(sizes, lambda s, t: 1.0 if t == 1 else (2.0 if s >= 128 else 0.5))
    here = _workload(288, 288, 288)
    fits: list[int] = []
    regressor = cost_model._regressor
    monkeypatch.setattr(cost_model, "_regressor", lambda: fits.append(1) or regressor())
    monkeypatch.setattr(cost_model, "_FOLDS_CACHE", {})
    own = [Row(here, _matmul(1), 1.0, 1.0), Row(here, _matmul(2), 2.0, 1.0)]
    first = cost_model.fit(others + own, here)
    at_first = len(fits)
    second = cost_model.fit(others + own + [Row(here, _matmul(1, (4, 16, 1)), 1.0, 1.0)], here)
    assert at_first > 2 and len(fits) == at_first + 1
    assert first is not None and second is not None
    assert first.trust >= 0.5 and second.trust >= 0.5
    against = [Row(here, _matmul(1), 2.0, 1.0), Row(here, _matmul(2), 0.5, 1.0)]
    wrong = cost_model.fit(others + against, here)
    assert wrong is not None and wrong.trust < first.trust
    assert len(fits) == at_first + 2  # the same other operators: still no fold refitted


# -- cold start: the prior alone, as before ------------------------------------------------------


def test_without_evidence_the_score_is_the_static_prior() -> None:
    view = _mm(48, 40, 64)
    info = analyze(prepare_payload(view.payload))
    space, widened = schedule_space(info, CAPABILITIES)
    scorer = Scorer(MemoryAdvice({}, {}, set(), {}), None, _workload(48, 64, 40), 1.0, widened)
    assert scorer.scores(space) == [prior for _, prior in candidate_space(info, CAPABILITIES)]
    core = [prior for config, prior in space if config_key(config) not in widened]
    wide = [prior - WIDENED for config, prior in space if config_key(config) in widened]
    assert wide and max(wide) + HeuristicAgent().jitter < min(core)


def _fake_speedup(config: Config) -> float:
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).digest()
    return 0.3 + int.from_bytes(digest[:4], "little") % 1000 / 400


def _proposals(view: TaskView, budget: int, experience: list[Experience] | None = None) -> list:
    """The agent's configurations over `budget` attempts, each timed by a fixed fake figure."""
    agent = HeuristicAgent(seed=0)
    history: list[Feedback] = []
    for index in range(budget):
        proposal = agent.propose(ProposalRequest(view, list(experience or []), history=history))
        if proposal is None:
            break
        speedup = _fake_speedup(proposal.config or {})
        history.append(
            Feedback(f"h{index}", proposal.decision, proposal.config, "verified", None,
                     10.0 / speedup, 10.0, speedup, 1.0)
        )  # fmt: skip
    return [f.config for f in history]


def _rows(threads: int, rows: int, vector: int, approximate: bool = False) -> Config:
    config: Config = {"family": "rows", "threads": threads, "rows": rows, "vector": vector}
    if approximate:
        config["approximate_math"] = True
    return config


def _conv(threads: int, channels: int, columns: int, inputs: int) -> Config:
    family = {"family": "conv", "threads": threads}
    return {**family, "channels": channels, "columns": columns, "inputs": inputs}


def _im2col(threads: int, mr: int, nr: int) -> Config:
    family = {"family": "conv", "algorithm": "im2col", "threads": threads}
    return {**family, "cache": [64, 128, 256], "register": [mr, nr, 1]}


# What the agent proposed on an empty store before it learned (recorded from that version,
# with the fake figures of `_fake_speedup`; the matmuls' lists since packed points joined;
# the ties among the others' later attempts since `_view` fixed the key that seeds them).
BEFORE: dict[str, tuple[Any, list[Config]]] = {
    # Plain matmuls start with B packed in panels (since packing was added), in register
    # tiles of 6 rows where padding to them adds few zero rows, else 4 (since 6 joined).
    "mm": (
        lambda: _mm(48, 40, 64),
        [_packed(2, SIX), _packed(2), _matmul(2), _packed(1)],
    ),
    # 37 rows pad to 42 in sixes (5 zero rows) and to 40 in fours.
    "mm_odd": (
        lambda: _mm(37, 29, 53),
        [_packed(1), _packed(1, SIX), _matmul(1), _packed(2)],
    ),
    "mm_big": (
        lambda: _mm(256, 256, 256),
        [_packed(2, SIX), _packed(2), _matmul(2), _packed(1)],
    ),
    "softmax": (
        lambda: _view(lambda x: torch.softmax(x, -1), torch.randn(24, 80)),
        [_rows(1, 1, 32, True), _rows(1, 8, 32, True), _rows(1, 1, 16, True), _rows(1, 1, 8, True)],
    ),
    "softmax_big": (
        lambda: _view(lambda x: torch.softmax(x, -1), torch.randn(256, 512)),
        [_rows(2, 1, 32, True), _rows(2, 1, 8, True), _rows(2, 8, 32, True), _rows(2, 4, 32, True)],
    ),
    "row_sum": (
        lambda: _view(lambda x: x.sum(-1), torch.randn(24, 80)),
        # 4 and 8 rows a step tie; their order moved when partial row steps left the space
        [_rows(1, 1, 32), _rows(1, 8, 32), _rows(1, 4, 32), _rows(1, 1, 16)],
    ),
    # Two configurations fit this convolution's core grid; the widened points follow them.
    # Since im2col joined, its first point on each thread count comes first (the 17-column
    # rows in panels of 8, the only width that wastes under a third of its columns).
    "conv": (
        lambda: _view(
            lambda x, w, b: torch.nn.functional.conv2d(x, w, b, padding=1),
            torch.randn(2, 3, 17, 17),
            torch.randn(8, 3, 3, 3),
            torch.randn(8),
        ),
        [_im2col(2, 8, 8), _im2col(1, 8, 8), _conv(1, 8, 8, 1), _conv(1, 8, 16, 1)],
    ),
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_on_an_empty_store_the_first_attempts_are_unchanged(name: str) -> None:
    build, expected = BEFORE[name]
    proposed = _proposals(build(), 4)
    assert proposed[: len(expected)] == expected


def test_rows_of_middling_work_try_both_thread_counts_first() -> None:
    """A 64x768 layer norm (49k elements) ran 22.6 us on one thread and 19.2 on two: between
    half of BIG_WORK and BIG_WORK the first two attempts are the best point on each count,
    where the prior's one-thread rank kept two threads out of eight attempts."""
    view = _view(lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]), torch.randn(64, 768))
    first, second = _proposals(view, 2)
    assert {first["threads"], second["threads"]} == {1, 2}
    assert {**first, "threads": 0} == {**second, "threads": 0}


# -- with experience ----------------------------------------------------------------------------


def test_planted_experience_steers_the_first_attempt() -> None:
    """Similar matmuls (too unlike to reuse a configuration as is) ran the unpacked 8x8
    register tile 2.5x faster than eager and every other configuration, packed ones included,
    at 0.8x: the agent starts from 8x8 unpacked (the k unroll, never varied there, is the
    model's to guess), where the prior alone starts from 6x16 with B packed."""
    view = _mm(192, 192, 192)
    assert _proposals(view, 1)[0] == _packed(2, SIX)
    registers = [(8, 16, 1), (4, 16, 1), (6, 16, 1), (16, 8, 1), (4, 32, 1), (8, 8, 1)]
    packed = [_packed(2), _packed(2, SIX), _packed(2, (4, 16, 4))]
    configs = [_matmul(2, r) for r in registers] + packed
    experience = [
        _attempt(
            len(configs) * i + j,
            config,
            2.5 if config == _matmul(2, (8, 8, 1)) else 0.8,
            (size, size, size),
            similarity=0.8,
        )
        for i, size in enumerate((128, 160, 256))
        for j, config in enumerate(configs)
    ]
    first = _proposals(view, 1, experience)[0]
    assert first is not None and first["register"][:2] == [8, 8], first
    assert not first.get("pack"), first


def test_planted_experience_promotes_a_widened_point() -> None:
    """The k loop unrolled in registers ran similar matmuls 2x faster: the agent proposes an
    unrolled point, which the static prior alone ranks behind the whole core grid."""
    view = _mm(192, 192, 192)
    experience = [
        _attempt(2 * i + u, _matmul(2, (8, 16, unroll)), 2.0 if unroll == 2 else 1.0, (s, s, s))
        for i, s in enumerate((128, 160, 224, 256))
        for u, unroll in enumerate((1, 2))
    ]
    first = _proposals(view, 1, experience)[0]
    assert first is not None and first["register"][2] > 1, first


def test_retrieved_attempts_carry_their_operators_loops(tmp_path: Path) -> None:
    """Experience read from a store knows the loops of its operator's stored payload, and the
    current operator's workload is read from its own payload the same way."""
    store = ExperienceStore(tmp_path)
    views = {"seen": _mm(48, 40, 64), "new": _mm(64, 40, 64)}
    for name, view in views.items():
        store.add_task(
            TaskRecord(
                view.key,
                view.op,
                view.label,
                name,
                [[list(s.shape), s.dtype] for s in view.inputs],
                [[list(s.shape), s.dtype] for s in view.outputs],
                "cpu",
                "cpu|test",
                payload=store.put_artifact(view.payload),
            )
        )
    store.add_attempt(
        AttemptRecord(
            views["seen"].key, "agent", "verified", config=_matmul(2), speedup_vs_eager=1.5
        )
    )
    items, _ = retrieve_experience(store, views["new"].key, 4000)
    assert [(i.loop_ranges, i.outputs, i.linalg_ops) for i in items] == [
        ((48, 64, 40), ((48, 64),), 2)
    ]
    here = views["new"]
    workload = cost_model.task_workload(here, analyze(prepare_payload(here.payload)))
    assert workload == Workload((64, 64, 40), 2, 64 * 40 + 40 * 64, 64 * 64)
    assert cost_model.experience_workload(items[0]).loops == (48, 64, 40)


# -- the search that learns ---------------------------------------------------------------------


def _toy_view() -> TaskView:
    """An operator of no target's: the search must not care which."""
    return TaskView("toy-key", "toy.op", "toy", "", (), (), "nowhere", {})


def _toy(a: int, b: int = 1) -> Config:
    return {"family": "toy", "a": a, "b": b}


def _toy_record(index: int, config: Config, speedup: float, size: int) -> Experience:
    """An attempt of a toy operator of loops (size, size) and similarity 0.3: too unlike to
    reuse a configuration as is, or for its decision values to count."""
    return Experience(
        f"r{index}", f"toy{size}", f"toy({size})", "toy.op", ((size, size),), 0.3, "d",
        config, "verified", speedup, None, outputs=((size, size),), loop_ranges=(size, size),
    )  # fmt: skip


def _planted_toy_evidence() -> list[Experience]:
    """On four toy operators, `a` decides the speed (1 + a / 4) and `b` does not."""
    return [
        _toy_record(16 * i + 2 * a + b, _toy(a, b), 1.0 + a / 4, size)
        for i, size in enumerate((32, 64, 128, 256))
        for a in range(1, 9)
        for b in (1, 2)
    ]


def _toy_space() -> Space:
    # The static prior prefers small `a`: the opposite of what the evidence shows.
    return Space([(_toy(a, b), 10.0 - a) for a in range(1, 9) for b in (1, 2)])


def _feedback(index: int, config: Config, speedup: float) -> Feedback:
    return Feedback(f"h{index}", "d", config, "verified", None, 10 / speedup, 10.0, speedup, 1.0)


def test_the_search_learns_from_the_stores_evidence_and_knows_no_target() -> None:
    """With no evidence the static prior decides; with the measured records of similar
    operators, a flat prior's first attempt is what the evidence shows best, and so is the
    static prior's: the model decides, the prior breaks ties."""
    here = Workload((96, 96), 1, 96 * 96, 96 * 96)
    cold = Search(seed=0).next(_toy_space(), ProposalRequest(_toy_view()), here)
    assert cold is not None and cold.config["a"] == 1 and cold.why == "highest prior"
    request = ProposalRequest(_toy_view(), evidence=_planted_toy_evidence())
    for prior_weight in (0.0, 1.0):
        warm = Search(seed=0, prior_weight=prior_weight).next(_toy_space(), request, here)
        assert warm is not None and warm.config["a"] == 8, (prior_weight, warm)
        assert warm.why == "highest score by the cost model"


def test_evolution_mutates_the_elites_where_the_space_renders_them() -> None:
    """An elite proven elsewhere, off this space's grid, is mutated one decision at a time
    into the values the space uses; only what the space's generator can render is kept."""
    space = Space([(_toy(1, 1), 1.0), (_toy(2, 2), 0.0)])
    elite = [_toy_record(0, _toy(3, 1), 2.0, 64)]
    excluded = {config_key(c) for c, _ in space.points}
    assert evolve(space, elite, [], excluded) == []  # renders nothing off its grid
    space.renders = lambda config: config["a"] != 2
    mutants = evolve(space, elite, [], excluded)
    assert sorted(map(config_key, mutants)) == sorted(map(config_key, [_toy(3, 1), _toy(3, 2)]))


def test_a_trusted_model_stops_the_search_when_nothing_better_is_expected() -> None:
    here = Workload((96, 96), 1, 96 * 96, 96 * 96)
    history = [_feedback(i, _toy(a), 1.0 + a / 4) for i, a in enumerate((8, 7, 6))]
    search = Search(seed=0, prior_weight=0.0)
    request = ProposalRequest(_toy_view(), history=history, evidence=_planted_toy_evidence())
    assert search.next(_toy_space(), request, here) is None
    assert "expects no remaining candidate" in search.stop_reason
    # Two verified kernels are not yet enough to stop on.
    request = ProposalRequest(_toy_view(), history=history[:2], evidence=_planted_toy_evidence())
    assert search.next(_toy_space(), request, here) is not None and not search.stop_reason


def test_measured_evidence_is_every_attempt_of_the_nearest_operators(tmp_path: Path) -> None:
    """The cost model's rows come from the store's records, not only what ACMI packs under a
    token budget: every attempt of the nearest operators with a configuration, less figures
    the machine's load disturbed and re-measures, and never the operator's own."""
    store = ExperienceStore(tmp_path)
    views = {"seen": _mm(48, 40, 64), "new": _mm(64, 40, 64)}
    for name, view in views.items():
        store.add_task(
            TaskRecord(
                view.key, view.op, view.label, name,
                [[list(s.shape), s.dtype] for s in view.inputs],
                [[list(s.shape), s.dtype] for s in view.outputs],
                "cpu", "cpu|test", payload=store.put_artifact(view.payload),
            )
        )  # fmt: skip
    for i in range(30):
        config = _matmul(1 + i % 2, (8, 16, 1 + i % 3))
        store.add_attempt(
            AttemptRecord(
                views["seen"].key, "agent", "verified", config={**config, "n": i},
                speedup_vs_eager=1.0 + i / 10, timing_quality="clean",
            )
        )  # fmt: skip
    seen = views["seen"].key
    store.add_attempt(
        AttemptRecord(seen, "agent", "verified", config=_matmul(2), speedup_vs_eager=9.0,
                      timing_quality="contaminated")
    )  # fmt: skip
    store.add_attempt(AttemptRecord(views["new"].key, "agent", "verified", config=_matmul(1)))
    packed, _ = retrieve_experience(store, views["new"].key, 300)
    evidence = measured_evidence(store, views["new"].key)
    assert len(packed) < 30 and len(evidence) == 30
    assert {e.task_key for e in evidence} == {seen} and all(e.same_target for e in evidence)
    assert all(e.loop_ranges == (48, 64, 40) for e in evidence)


def test_a_configuration_off_the_grid_renders_only_where_its_familys_rules_hold() -> None:
    softmax = _view(lambda x: torch.softmax(x, -1), torch.randn(129, 80))
    info = analyze(prepare_payload(softmax.payload))
    assert renders(info, CAPABILITIES, _rows(1, 1, 24, True))  # a vector of 3 AVX2 lanes' 8
    assert not renders(info, CAPABILITIES, _rows(1, 4, 32, True))  # 129 rows in steps of 4
    assert not renders(info, CAPABILITIES, _rows(3, 1, 32, True))  # 3 threads: the machine has 2
    row_sum = _view(lambda x: x.sum(-1), torch.randn(24, 80))
    plain = analyze(prepare_payload(row_sum.payload))
    assert not renders(plain, CAPABILITIES, _rows(1, 1, 32, True))  # no exp to approximate
    assert not renders(plain, CAPABILITIES, _matmul(1))  # another family's
