"""The reference lowering as an oracle: too large to time (issue 8, defect 11), or wrong.

A reference lowering is an oracle first: it runs once per verification trial, within a time
limit scaled to the operator's work, and when one call is too slow to time it is recorded as
verified but untimed. The agent goes on (its candidates verified against the reference, timed
against eager), and selection keeps eager unless a timed kernel beats it.

An oracle must agree with eager, NaN included: torch-mlir's argmax, argmin, max.dim and min.dim
never pick a NaN, so their reference lowering is imported from KOPE's decomposition
(`kope.core.decompositions.REFERENCE_DECOMPOSITIONS`), else the operator has nothing to verify its
candidates against.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.agents import make_agent
from kope.core.decompositions import REFERENCE_DECOMPOSITIONS
from kope.core.task import Task
from kope.frontend.partition import partition
from kope.memory.schema import AttemptRecord
from kope.memory.standing import winner
from kope.memory.store import ExperienceStore
from kope.targets.cpu import CpuTarget
from kope.targets.evaluation import cannot_win
from kope.targets.measure import MeasureConfig, Work, estimate_work, evaluation_limit_s
from kope.tuner.optimize import Budget, optimize_task
from kope.tuner.selection import choose, known_reference
from kope.vocabulary.evidence import SOURCE_AGENT, SOURCE_EAGER, SOURCE_REFERENCE, VERIFIED


def _task(fn, *args: torch.Tensor) -> Task:
    (task,) = partition(make_fx(fn, tracing_mode="fake")(*args), CpuTarget()).tasks
    return task


@pytest.fixture(scope="module")
def untimed_target():
    """A real CPU target whose timing refuses every candidate slower than 0 s per call."""
    cpu = CpuTarget(workers=1, timeout_s=120)
    cpu.measure_config = MeasureConfig(max_call_s=0.0)
    yield cpu
    cpu.close()


def test_work_is_read_from_the_loops_of_the_reference() -> None:
    mm = _task(torch.mm, torch.randn(64, 96), torch.randn(96, 32))
    work = estimate_work(mm.spec, mm.payload)
    assert work.reduction == 96
    assert work.iterations >= 64 * 96 * 32  # the matmul's loops (plus its fill)
    rows = _task(lambda x: x.sum(-1), torch.randn(8, 300))
    assert estimate_work(rows.spec, rows.payload).reduction == 300
    assert estimate_work(rows.spec, None).reduction == 300  # from the shapes alone


def test_time_limit_scales_with_the_work() -> None:
    config = MeasureConfig()
    small = Work(iterations=10**4, bytes=10**5, reduction=1)
    big = Work(iterations=2048 * 8192 * 4096, bytes=4 * (2048 * 8192 + 8192 * 4096), reduction=8192)
    assert evaluation_limit_s(small, 4, True, config) < 1.0
    # The 2048x8192x4096 matmul's naive loops need far more than the fixed 60 s to verify.
    assert evaluation_limit_s(big, 4, False, config) > 8 * big.iterations / 1e9 > 60


def test_a_reference_far_behind_eager_is_verified_but_not_timed(tmp_path: Path) -> None:
    """A reference slower per call than `hopeless_s` and more than `hopeless_factor` times
    eager's call cannot win, and timing it would cost seconds of a first compile: it stays
    verified and untimed, and says why. (The limits are lowered to nothing here, so that the
    reference meets them whatever the machine's load does to the two calls' figures: the
    comparison itself is `test_what_cannot_win_is_decided_by_both_limits`.)"""
    cpu = CpuTarget(workers=1, timeout_s=120)
    cpu.measure_config = MeasureConfig(hopeless_s=0.0, hopeless_factor=0.0)
    try:
        task = _task(torch.mm, torch.randn(128, 128), torch.randn(128, 128))
        reference = known_reference(task, cpu, ExperienceStore(tmp_path / "store"))
    finally:
        cpu.close()
    assert reference.verdict == "verified", reference.error
    assert reference.latency_us is None and "it cannot win" in reference.decision
    assert reference.eager_us is not None  # eager is the baseline, always timed


def test_a_reference_too_slow_for_a_first_call_is_deferred_to_precompile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a first call, verification is bounded (`FIRST_CALL_LIMIT_S`, lowered here so that
    any operator meets it); one that needs longer runs on ATen, recorded as deferred, and the
    next first call does not wait for it again; outside a first call (`kope precompile`) it is
    measured without the bound, and its deferral counts for none of the timeout tries."""
    from kope.tuner import measuring

    monkeypatch.setattr(measuring, "FIRST_CALL_LIMIT_S", 1e-3)
    cpu = CpuTarget(workers=1, timeout_s=120)
    store = ExperienceStore(tmp_path / "store")
    task = _task(lambda x: torch.tanh(x) * 2, torch.randn(8, 33))
    try:
        choice = choose(task, cpu, store, "auto")
        assert choice.kernel == SOURCE_EAGER
        assert "`kope precompile` verifies it" in choice.reason, choice.reason
        (deferred,) = store.attempts(task.key)
        assert deferred.config == {measuring.DEFERRED: True} and "deferred" in deferred.decision

        def not_again(*_: object, **__: object) -> None:
            raise AssertionError("a first call waited for the deferred operator again")

        monkeypatch.setattr(cpu, "evaluate", not_again)
        assert choose(task, cpu, store, "auto").kernel == SOURCE_EAGER
        monkeypatch.undo()
        reference = known_reference(task, cpu, store)  # as the precompile's loop asks
        assert reference.verdict == VERIFIED, reference.error
    finally:
        cpu.close()


def test_what_cannot_win_is_decided_by_both_limits() -> None:
    config = MeasureConfig(hopeless_s=0.5, hopeless_factor=20.0)
    assert cannot_win(2.0, 0.01, config)  # over 0.5 s and 200x eager
    assert not cannot_win(0.4, 0.001, config)  # 400x eager, but under 0.5 s a call
    assert not cannot_win(2.0, 0.5, config)  # over 0.5 s, but only 4x eager
    assert not cannot_win(2.0, None, config)  # eager untimed: nothing is known


def test_untimed_reference_lets_the_agent_run_and_eager_stays_chosen(
    untimed_target: CpuTarget, tmp_path: Path
) -> None:
    task = _task(lambda x: torch.tanh(x * 2 + 1) * x, torch.randn(24, 80))
    store = ExperienceStore(tmp_path / "store")
    reference = known_reference(task, untimed_target, store)
    assert reference.verdict == "verified", reference.error
    assert reference.latency_us is None and reference.speedup_vs_eager is None
    assert "too slow to time" in reference.decision
    assert reference.eager_us is not None  # eager is the baseline, always timed
    summary = optimize_task(task, untimed_target, store, make_agent("heuristic"), Budget(2))
    agent = [a for a in store.attempts(task.key) if a.source == SOURCE_AGENT]
    assert summary.attempts == len(agent) >= 1
    assert any(a.verdict == "verified" for a in agent)  # verified against the reference
    assert all(a.latency_us is None and a.eager_us is not None for a in agent)
    assert summary.winner == "eager" and summary.speedup_vs_reference is None
    choice = choose(task, untimed_target, store, "auto")
    assert choice.kernel == "eager" and "too slow to time" in choice.reason

    # A timed agent kernel that beats eager, cleanly and confirmed, is chosen over the untimed
    # reference.
    verified = next(a for a in agent if a.verdict == "verified")
    eager = next(a for a in store.attempts(task.key) if a.source == SOURCE_EAGER)
    text = store.get_artifact(verified.artifact)
    figure = dict(
        source=SOURCE_AGENT,
        verdict="verified",
        latency_us=eager.latency_us / 2,
        eager_us=eager.latency_us,
        speedup_vs_eager=2.0,
        threads=eager.threads,
        timing_quality="clean",
        clean_rounds=15,
        rounds=15,
    )
    faster = AttemptRecord(task=task.key, decision="a timed kernel twice as fast", **figure)
    store.add_attempt(faster, text)
    confirmation = AttemptRecord(
        task=task.key, decision=f"confirms {faster.id}", confirms=faster.id, **figure
    )
    store.add_attempt(confirmation, text)
    choice = choose(task, untimed_target, store, "auto")
    assert choice.kernel == "agent" and choice.source is not None
    assert winner(store.attempts(task.key)).best.id == confirmation.id
    assert [a.source for a in store.attempts(task.key)].count(SOURCE_REFERENCE) == 1


aten = torch.ops.aten
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def cpu() -> Iterator[CpuTarget]:
    target = CpuTarget(workers=1)
    yield target
    target.close()


@pytest.mark.parametrize(
    ("fn", "x"),
    [
        (lambda x: x.argmax(-1), torch.empty(33, 101)),
        (lambda x: x.argmin(0, keepdim=True), torch.empty(29, 7, dtype=torch.float16)),
        (lambda x: x.argmax(), torch.empty(5, 37, dtype=torch.float64)),
        (lambda x: torch.max(x, 1), torch.empty(3, 41, 2)),
        (lambda x: torch.min(x, -1, keepdim=True), torch.empty(6, 43, dtype=torch.float64)),
    ],
    ids=["argmax_last", "argmin_first_keepdim_f16", "argmax_all_f64", "max_dim", "min_dim_keepdim"],
)
def test_arg_extreme_references_verify_against_eager_on_nan(
    cpu: CpuTarget, fn: Callable[[torch.Tensor], object], x: torch.Tensor
) -> None:
    """The reference lowering passes KOPE's own verification against eager, whose nonfinite
    trial puts NaN, Inf and -0 in every row (torch-mlir's lowering picks no NaN: mismatch)."""
    task = _task(fn, x)
    result = cpu.evaluate(task.spec, task.reference, measure=False, seed=0)
    assert result.verdict == VERIFIED, result.error
    assert result.trials == 4  # the nonfinite trial ran


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_arg_extreme_decompositions_pick_as_eager(dtype: torch.dtype) -> None:
    """The decompositions agree with eager on NaN (first NaN wins), ±Inf, ties (first index
    wins, -0 ties 0), for every dim, dim=None and keepdim, in every floating dtype."""
    rows = [
        [1.0, NAN, 3.0, NAN],
        [INF, 2.0, NAN, INF],
        [-INF, -INF, -INF, -INF],
        [2.0, 5.0, 5.0, -1.0],
        [-0.0, 0.0, 0.0, -0.0],
        [NAN, NAN, 1.0, 1.0],
    ]
    x = torch.tensor(rows, dtype=dtype)
    for dim in (0, 1, -1, None):
        for keepdim in (False, True):
            for op in (aten.argmax.default, aten.argmin.default):
                got = REFERENCE_DECOMPOSITIONS[op](x, dim, keepdim)
                assert torch.equal(got, op(x, dim, keepdim)), (op, dim, keepdim)
            if dim is None:
                continue
            for op in (aten.max.dim, aten.min.dim):
                values, indices = REFERENCE_DECOMPOSITIONS[op](x, dim, keepdim)
                want_values, want_indices = op(x, dim, keepdim)
                assert torch.equal(indices, want_indices), (op, dim, keepdim)
                assert torch.allclose(values, want_values, equal_nan=True), (op, dim, keepdim)


_NAN_KEEPING = {
    "clamp": (lambda x: x.clamp(-0.5, 0.5), (torch.empty(4, 33),)),
    "clamp_min_f16": (lambda x: x.clamp_min(0.1), (torch.empty(5, 17, dtype=torch.float16),)),
    "clamp_max_int": (lambda x: x.clamp_max(3), (torch.empty(6, 9, dtype=torch.int32),)),
    "clamp_tensors": (lambda x, lo, hi: x.clamp(lo, hi), tuple(torch.empty(3, 40) for _ in "xyz")),
    "relu6": (lambda x: torch.nn.functional.relu6(x), (torch.empty(2, 8, 5),)),
    "hardtanh": (lambda x: torch.nn.functional.hardtanh(x, -2.0, 2.0), (torch.empty(4, 33),)),
    "threshold": (lambda x: torch.nn.functional.threshold(x, 0.1, 20.0), (torch.empty(4, 33),)),
    "maximum": (torch.maximum, (torch.empty(4, 33), torch.empty(4, 33))),
    "minimum_broadcast": (torch.minimum, (torch.empty(4, 33), torch.empty(33))),
}


@pytest.mark.parametrize("name", sorted(_NAN_KEEPING))
def test_nan_keeping_references_verify_against_eager(cpu: CpuTarget, name: str) -> None:
    """torch-mlir's clamp, hardtanh (relu6), threshold, maximum and minimum turn a NaN into a
    number; their references are KOPE's decompositions, which keep it as eager does, and
    pass the nonfinite trial (NaN and ±Inf in every input)."""
    fn, args = _NAN_KEEPING[name]
    task = _task(fn, *args)
    result = cpu.evaluate(task.spec, task.reference, measure=False, seed=0)
    assert result.verdict == VERIFIED, result.error


_RECIPROCALS = {
    "reciprocal": (torch.reciprocal, (torch.empty(4, 33),)),
    "batch_norm_eval": (
        lambda x, m, v, w, b: torch.ops.aten._native_batch_norm_legit_no_training(
            x, w, b, m, v, 0.1, 1e-5
        ),
        (torch.empty(2, 8, 5, 5), *(torch.empty(8) for _ in range(4))),
    ),
}


@pytest.mark.parametrize("name", sorted(_RECIPROCALS))
def test_reciprocal_references_verify_on_zeros_and_nan(cpu: CpuTarget, name: str) -> None:
    """torch-mlir's reciprocal asserts a nonzero divisor (NaN fails the check too), which
    aborted the worker on the nonfinite trial: the reference computes inf and NaN as eager."""
    fn, args = _RECIPROCALS[name]
    task = _task(fn, *args)
    assert "cf.assert" not in task.payload
    result = cpu.evaluate(task.spec, task.reference, measure=False, seed=0)
    assert result.verdict == VERIFIED, result.error
    assert result.trials == 4  # the nonfinite trial ran


def test_clamp_decompositions_agree_with_eager_on_special_values() -> None:
    x = torch.tensor([1.0, NAN, -3.0, -0.0, 0.0, INF, -INF, 0.5])
    lo = torch.tensor([NAN, 0.0, 0.0, 0.0, -0.0, 0.0, 0.0, 2.0])
    hi = torch.tensor([2.0, 2.0, NAN, 1.0, 1.0, 1.0, 1.0, 1.0])  # the last: lo above hi
    decomposed = REFERENCE_DECOMPOSITIONS
    for op, args in [
        (aten.clamp.Tensor, (x, lo, hi)),
        (aten.clamp.Tensor, (x, None, hi)),
        (aten.clamp.default, (x, -0.5, 0.5)),
        (aten.clamp.default, (x, NAN, None)),
        (aten.clamp.default, (x, 2.0, 1.0)),
        (aten.clamp_min.Tensor, (x, lo)),
        (aten.hardtanh.default, (x, 0.0, 6.0)),
        (aten.threshold.default, (x, 0.0, 5.0)),
        (aten.maximum.default, (x, lo)),
        (aten.minimum.default, (lo, x)),
    ]:
        torch.testing.assert_close(decomposed[op](*args), op(*args), equal_nan=True, msg=str(op))


def test_causal_attention_reference_hides_a_masked_infinite_score() -> None:
    """Row 0 of a causal attention sees key 0 alone, whose score is -inf; the keys it does not
    see score +inf. Eager hides them (the row attends to nothing: 0); PyTorch's decomposition
    added -inf to them, which made the row NaN and the reference refused on the trial."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    q[0, 0, 0, 0] = INF
    k[0, 0, 0, 0], k[0, 0, 1:, 0] = -1.0, 1.0

    def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    want = causal(q, k, v)
    assert torch.equal(want[0, 0, 0], torch.zeros(8))
    op = aten._scaled_dot_product_flash_attention_for_cpu.default
    traced = make_fx(causal, REFERENCE_DECOMPOSITIONS, tracing_mode="fake")(q, k, v)
    assert all(n.target is not op for n in traced.graph.nodes)
    got = traced(q, k, v)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()
    heads_inner = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    got = make_fx(causal, REFERENCE_DECOMPOSITIONS, tracing_mode="fake")(*heads_inner)
    assert got(*heads_inner).stride() == causal(*heads_inner).stride()  # q's layout, as eager's


def test_nan_to_num_reference_verifies_against_its_own_dtype(cpu: CpuTarget) -> None:
    """nan_to_num puts its dtype's largest finite value for Inf: the float64 oracle's rounds to
    Inf in float32, and the correct reference mismatched; its oracle runs in float32."""
    task = _task(torch.nan_to_num, torch.empty(4, 33))
    result = cpu.evaluate(task.spec, task.reference, measure=False, seed=0)
    assert result.verdict == VERIFIED, result.error
