"""Choosing a kernel on figures that hold (issue 9): an unclean figure never pins a choice, a
win is confirmed head to head before it is taken, a figure means its thread count, and a store
of an older KOPE is re-validated instead of orphaned.

A scripted Target stands in for the CPU target: it returns the latencies and timing qualities
a test sets, so the rules are tested without the noise of real timings.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.core.task import Task
from kope.frontend.partition import partition
from kope.memory.recorder import Recorder
from kope.memory.schema import CONFIRMS, TRANSFERRED_FROM, AttemptRecord, TaskRecord, hardware_of
from kope.memory.standing import winner
from kope.memory.store import ExperienceStore
from kope.targets.base import Target
from kope.tools.cli import main
from kope.tools.eager_json import task_from_record
from kope.tuner import measuring
from kope.tuner.measuring import task_seen
from kope.tuner.optimize import summarize
from kope.tuner.selection import choose
from kope.vocabulary.evidence import (
    SOURCE_AGENT,
    SOURCE_EAGER,
    SOURCE_REFERENCE,
    TIMING_CLEAN,
    TIMING_CONTAMINATED,
    Evaluation,
    Timing,
)
from kope.vocabulary.kernels import Kernel
from kope.vocabulary.specs import TaskSpec, eager_from_json, eager_json

HARDWARE = "cpu|Scripted CPU avx512f 2c"
TARGET_KEY = f"{HARDWARE}|torch-2.13.0|torch-mlir-20261001|kope-9.0.0"
OLD_TARGET_KEY = f"{HARDWARE}|torch-2.12.0|torch-mlir-20260601|kope-8.0.0"
EAGER_US = 100.0
AGENT_KERNEL = "func.func @kope_kernel() { return }  // scripted agent kernel\n"


class ScriptedTarget(Target):
    """Verifies everything and times each kernel at the latency scripted for its text (the
    reference lowering: `reference_us`), eager at EAGER_US, with the quality `quality` (or the
    next of `qualities`); records every evaluation it was asked for."""

    name = "cpu"

    def __init__(self, reference_us: float = 200.0) -> None:
        self.reference_us = reference_us
        self.latencies: dict[str, list[float]] = {}  # kernel text -> latencies, in call order
        self.quality = TIMING_CLEAN
        self.qualities: list[str] = []
        self.calls: list[str] = []

    def key(self) -> str:
        return TARGET_KEY

    def evaluate(
        self,
        task: TaskSpec,
        kernel: Kernel | None,
        *,
        oracle: Kernel | None = None,
        measure: bool = True,
        seed: int = 0,
        config: Any = None,
        limit_s: float | None = None,
    ) -> Evaluation:
        assert kernel is not None, "the cpu target runs the reference lowering"
        self.calls.append(kernel.source)
        scripted = self.latencies.get(kernel.source)
        us = (scripted.pop(0) if len(scripted) > 1 else scripted[0]) if scripted else None
        quality = self.qualities.pop(0) if self.qualities else self.quality
        return Evaluation(
            "verified",
            kernel=self._timing(us if us is not None else self.reference_us, quality),
            eager=self._timing(EAGER_US, quality),
            reference=self._timing(self.reference_us, quality) if oracle else None,
        )

    @staticmethod
    def _timing(us: float, quality: str) -> Timing:
        clean = 15 if quality == TIMING_CLEAN else 3
        return Timing(us, us * 0.01, clean, torch.get_num_threads(), 15, clean, 0.01, 0.5, quality)

    @classmethod
    def build(cls, task: TaskSpec, kernel: Kernel) -> Any:
        raise NotImplementedError("scripted target: nothing to build")


@pytest.fixture(autouse=True)
def fresh_process() -> Iterator[None]:
    """Each test is a fresh process as far as `once per process` re-measuring goes."""
    measuring.MEASURED.clear()
    yield
    measuring.MEASURED.clear()


@pytest.fixture
def relu_task() -> Task:
    (task,) = partition(
        make_fx(torch.relu, tracing_mode="fake")(torch.randn(8, 16)), ScriptedTarget()
    ).tasks
    return task


def store_with(tmp_path: Path, task: Task, target: Target) -> ExperienceStore:
    store = ExperienceStore(tmp_path / "store")
    Recorder(store)(task_seen(task, target))
    return store


def agent_attempt(of: Task, us: float, quality: str, **fields: Any) -> AttemptRecord:
    fields.setdefault("task", of.key)
    return AttemptRecord(
        source=SOURCE_AGENT,
        verdict="verified",
        latency_us=us,
        eager_us=EAGER_US,
        speedup_vs_eager=EAGER_US / us,
        threads=torch.get_num_threads(),
        timing_quality=quality,
        rounds=15,
        clean_rounds=15 if quality == TIMING_CLEAN else 3,
        agent="heuristic",
        **fields,
    )


def test_reference_only_figures_judge_an_ir_task_and_only_propose_once_eager_is_known() -> None:
    """`kope-optimize` times kernels against the reference lowering (the IR has no eager call):
    that judges the task on its own, but once the task has an eager baseline (the backend met
    it), such a figure is a challenger to confirm against eager, never a pinned choice."""
    threads = torch.get_num_threads()
    common: dict[str, Any] = dict(task="k", verdict="verified", threads=threads)
    clean: dict[str, Any] = dict(timing_quality=TIMING_CLEAN, rounds=15, clean_rounds=15)
    reference = AttemptRecord(
        source=SOURCE_REFERENCE, latency_us=100.0, reference_us=100.0, speedup_vs_reference=1.0,
        artifact="reference", **common, **clean,
    )  # fmt: skip
    found = dict(latency_us=10.0, reference_us=100.0, speedup_vs_reference=10.0, artifact="k1")
    first = AttemptRecord(source=SOURCE_AGENT, **found, **common, **clean)
    confirmed = AttemptRecord(source=SOURCE_AGENT, confirms=first.id, **found, **common, **clean)
    alone = winner([reference, first, confirmed], threads)
    assert alone.pinned is confirmed and alone.challenger is None

    eager_us = 8.0
    met = [
        AttemptRecord(
            source=SOURCE_REFERENCE, latency_us=100.0, eager_us=eager_us, reference_us=100.0,
            speedup_vs_eager=eager_us / 100.0, artifact="reference", **common, **clean,
        ),
        AttemptRecord(
            source=SOURCE_EAGER, latency_us=eager_us, eager_us=eager_us, speedup_vs_eager=1.0,
            **common, **clean,
        ),
    ]  # fmt: skip
    standing = winner([reference, first, confirmed, *met], threads)
    assert standing.pinned is None and standing.baseline is met[0]
    assert standing.challenger is not None and standing.challenger.artifact == "k1"
    assert not standing.clean  # so the next compile confirms it against eager

    against_eager = AttemptRecord(
        source=SOURCE_AGENT, confirms=first.id, latency_us=10.0, eager_us=eager_us,
        speedup_vs_eager=eager_us / 10.0, artifact="k1", **common, **clean,
    )  # fmt: skip
    settled = winner([reference, first, confirmed, *met, against_eager], threads)
    assert settled.pinned is None and settled.challenger is None and settled.clean


def test_a_tie_within_noise_goes_to_the_kernel_found_first() -> None:
    """Kernels whose confirmations differ by less than WIN_MARGIN tie, and the machine's noise
    would decide which runs: the one found first does, the same in every run, and a later one
    is re-measured only where its figure beats the pinned kernel's by more than noise."""
    threads = torch.get_num_threads()
    common: dict[str, Any] = dict(task="k", verdict="verified", threads=threads, eager_us=100.0)
    clean: dict[str, Any] = dict(timing_quality=TIMING_CLEAN, rounds=15, clean_rounds=15)
    eager = AttemptRecord(source=SOURCE_EAGER, latency_us=100.0, speedup_vs_eager=1.0, **common)
    reference = AttemptRecord(
        source=SOURCE_REFERENCE, latency_us=400.0, speedup_vs_eager=0.25, artifact="reference",
        **common, **clean,
    )  # fmt: skip

    def kernel(name: str, us: float, confirms: AttemptRecord | None = None) -> AttemptRecord:
        return AttemptRecord(
            source=SOURCE_AGENT, latency_us=us, speedup_vs_eager=100.0 / us, artifact=name,
            confirms=confirms.id if confirms else None, **common, **clean,
        )  # fmt: skip

    a, b, c = kernel("a", 50.0), kernel("b", 49.0), kernel("c", 45.0)  # 2.00x, 2.04x, 2.22x
    a_sure, b_sure, c_sure = kernel("a", 50.0, a), kernel("b", 49.0, b), kernel("c", 45.0, c)
    assert winner([eager, reference, a, b, a_sure, b_sure], threads).pinned is a_sure
    assert winner([eager, reference, b, a, b_sure, a_sure], threads).pinned is b_sure
    everything = [eager, reference, a, b, c, a_sure, b_sure, c_sure]
    assert winner(everything, threads).pinned is c_sure  # beyond noise, the fastest
    assert winner([eager, reference, a, a_sure, b], threads).challenger is None
    assert winner([eager, reference, a, a_sure, c], threads).challenger is c


def test_a_figure_load_disturbed_ranks_no_challenger() -> None:
    """Beside 2x load every figure is disturbed and ranks the load, not the kernels: the
    challenger to confirm is a candidate with an undisturbed figure where there is one, else
    the one the search found first; and a kernel also timed cleanly is never a challenger on
    its disturbed figure."""
    threads = torch.get_num_threads()
    common: dict[str, Any] = dict(task="k", verdict="verified", threads=threads, eager_us=100.0)
    eager = AttemptRecord(source=SOURCE_EAGER, latency_us=100.0, speedup_vs_eager=1.0, **common)

    def kernel(name: str, us: float, quality: str) -> AttemptRecord:
        return AttemptRecord(
            source=SOURCE_AGENT, latency_us=us, speedup_vs_eager=100.0 / us, artifact=name,
            timing_quality=quality, rounds=15, clean_rounds=15 if quality == TIMING_CLEAN else 0,
            **common,
        )  # fmt: skip

    first = kernel("first", 40.0, TIMING_CONTAMINATED)  # 2.5x, disturbed
    noisy = kernel("noisy", 2.0, TIMING_CONTAMINATED)  # 50x, disturbed
    assert winner([eager, first, noisy], threads).challenger is first
    steady = kernel("steady", 80.0, TIMING_CLEAN)  # 1.25x, undisturbed
    assert winner([eager, first, noisy, steady], threads).challenger is steady
    noisy_quiet = kernel("noisy", 150.0, TIMING_CLEAN)  # the 50x kernel, timed quietly
    assert winner([eager, noisy, noisy_quiet], threads).challenger is None
    assert winner([eager, noisy, first, noisy_quiet], threads).challenger is first


def test_a_baseline_that_timed_out_is_measured_again_a_few_times(
    relu_task: Task, tmp_path: Path
) -> None:
    """A worker that did not start in time (a loaded machine, a limit set too low) left the
    operator's reference 'timed out' for good: every later compile ran it eagerly."""
    target = ScriptedTarget()
    store = store_with(tmp_path, relu_task, target)
    timeouts = [True, True]
    scripted = target.evaluate

    def evaluate(*args: Any, **kwargs: Any) -> Evaluation:
        if timeouts and timeouts.pop(0):
            return Evaluation("timeout", error="the worker timed out during start")
        return scripted(*args, **kwargs)

    target.evaluate = evaluate  # type: ignore[method-assign]
    verdicts = [measuring.known_reference(relu_task, target, store).verdict for _ in range(3)]
    assert verdicts == ["timeout", "timeout", "verified"]
    again = ExperienceStore(tmp_path / "again")
    Recorder(again)(task_seen(relu_task, target))
    timeouts[:] = [True] * measuring.TIMEOUT_TRIES
    for _ in range(measuring.TIMEOUT_TRIES + 2):
        measuring.known_reference(relu_task, target, again)
    assert not timeouts  # tried TIMEOUT_TRIES times, then the verdict stands
    assert measuring.known_reference(relu_task, target, again).verdict == "timeout"


def test_a_contaminated_figure_never_pins_and_a_clean_confirmation_does(
    relu_task: Task, tmp_path: Path
) -> None:
    target = ScriptedTarget(reference_us=EAGER_US / 126)  # "126x faster than eager"
    target.quality = TIMING_CONTAMINATED
    store = store_with(tmp_path, relu_task, target)
    choice = choose(relu_task, target, store, "auto")
    assert choice.kernel == "eager" and choice.quality == TIMING_CONTAMINATED
    attempts = store.attempts(relu_task.key)
    first = next(a for a in attempts if a.source == SOURCE_REFERENCE and a.confirms is None)
    assert first.timing_quality == TIMING_CONTAMINATED and first.clean_rounds == 3
    # The win was re-measured at once (and was contaminated too): recorded, not taken.
    (confirmation,) = [a for a in attempts if a.confirms == first.id]
    assert store.has_edge(confirmation.id, first.id, CONFIRMS)
    assert len(target.calls) == 2

    # A later process on a quiet machine re-measures it once, and then it pins.
    measuring.MEASURED.clear()
    target.quality = TIMING_CLEAN
    choice = choose(relu_task, target, store, "auto")
    assert choice.kernel == "reference" and choice.quality == TIMING_CLEAN
    assert "confirmed" in choice.reason and len(target.calls) == 3
    again = choose(relu_task, target, store, "auto")  # settled: nothing measured
    assert again.kernel == "reference" and len(target.calls) == 3


def test_stored_contaminated_agent_figures_leave_eager_until_a_clean_confirmation(
    relu_task: Task, tmp_path: Path
) -> None:
    target = ScriptedTarget()
    store = store_with(tmp_path, relu_task, target)
    measuring.measure_reference(relu_task, target, store)  # clean: eager beats the reference
    claimed = agent_attempt(relu_task, 25.0, TIMING_CONTAMINATED)
    store.add_attempt(claimed, AGENT_KERNEL)
    standing = winner(store.attempts(relu_task.key), torch.get_num_threads())
    assert standing.pinned is None and standing.challenger == claimed and not standing.clean
    assert winner(store.attempts(relu_task.key)).best.source == "eager"
    # A clean confirmation that still wins pins the kernel.
    confirmed = agent_attempt(relu_task, 50.0, TIMING_CLEAN, confirms=claimed.id)
    store.add_attempt(confirmed, AGENT_KERNEL)
    standing = winner(store.attempts(relu_task.key), torch.get_num_threads())
    assert standing.pinned == confirmed and standing.clean
    choice = choose(relu_task, target, store, "auto")
    assert (
        choice.kernel == "agent"
        and choice.kernel_us == 50.0
        and target.calls == [relu_task.payload]
    )
    # A later contaminated re-measurement changes nothing; a clean one that no longer wins
    # un-pins it.
    store.add_attempt(agent_attempt(relu_task, 200.0, TIMING_CONTAMINATED, confirms=claimed.id))
    assert winner(store.attempts(relu_task.key)).pinned == confirmed
    late = agent_attempt(relu_task, 99.5, TIMING_CLEAN, confirms=claimed.id)
    store.add_attempt(late, AGENT_KERNEL)
    assert winner(store.attempts(relu_task.key)).pinned is None
    assert winner(store.attempts(relu_task.key)).clean


def test_a_process_re_times_several_claims_and_the_fastest_confirmed_runs(
    relu_task: Task, tmp_path: Path
) -> None:
    # Three kernels a precompile beside load claimed wins for, the one found first slowest.
    target = ScriptedTarget()
    store = store_with(tmp_path, relu_task, target)
    measuring.measure_reference(relu_task, target, store)  # clean: eager beats the reference
    kernels = {
        f"{AGENT_KERNEL}// {name}\n": (claimed, quiet)
        for name, claimed, quiet in [
            ("first", 30.0, 80.0),
            ("fastest", 20.0, 50.0),
            ("third", 40.0, 60.0),
        ]
    }
    for text, (claimed, quiet) in kernels.items():
        store.add_attempt(agent_attempt(relu_task, claimed, TIMING_CONTAMINATED), text)
        target.latencies[text] = [quiet]
    choice = choose(relu_task, target, store, "auto")
    assert choice.kernel == "agent" and choice.kernel_us == 50.0
    assert target.calls[1:] == list(kernels)  # each confirmed once, in the order found
    # A busy machine stops the re-timing at the first disturbed confirmation.
    measuring.MEASURED.clear()
    store = store_with(tmp_path / "busy", relu_task, target)
    measuring.measure_reference(relu_task, target, store)
    for text, (claimed, _) in kernels.items():
        store.add_attempt(agent_attempt(relu_task, claimed, TIMING_CONTAMINATED), text)
    target.calls.clear()
    target.quality = TIMING_CONTAMINATED
    assert choose(relu_task, target, store, "auto").kernel == "eager"
    assert len(target.calls) == 1


def test_kernels_whose_figures_load_disturbed_are_re_timed_whatever_they_claimed(
    relu_task: Task, tmp_path: Path
) -> None:
    # Beside load a two-thread eager suffered less than the kernels: they timed as losses
    # (0.75x), the reference as a win; quietly the reference loses and a kernel wins.
    target = ScriptedTarget(reference_us=EAGER_US / 4)
    target.quality = TIMING_CONTAMINATED
    store = store_with(tmp_path, relu_task, target)
    measuring.measure_reference(relu_task, target, store)
    kernels = {f"{AGENT_KERNEL}// {name}\n": quiet for name, quiet in [("a", 90.0), ("b", 70.0)]}
    for text, quiet in kernels.items():
        store.add_attempt(agent_attempt(relu_task, EAGER_US / 0.75, TIMING_CONTAMINATED), text)
        target.latencies[text] = [quiet]
    standing = winner(store.attempts(relu_task.key), torch.get_num_threads())
    assert [a.source for a in standing.unsettled] == [SOURCE_REFERENCE, SOURCE_AGENT, SOURCE_AGENT]
    measuring.MEASURED.clear()
    target.quality = TIMING_CLEAN
    target.reference_us = EAGER_US / 0.07
    target.calls.clear()
    choice = choose(relu_task, target, store, "auto")
    assert choice.kernel == "agent" and choice.kernel_us == 70.0
    assert target.calls == [relu_task.payload, *kernels]  # the reference's claim first
    assert not winner(store.attempts(relu_task.key), torch.get_num_threads()).unsettled


def test_a_win_that_does_not_reproduce_is_not_taken(relu_task: Task, tmp_path: Path) -> None:
    target = ScriptedTarget()
    target.latencies[AGENT_KERNEL] = [101.0]  # the re-measurement: no faster than eager
    store = store_with(tmp_path, relu_task, target)
    measuring.measure_reference(relu_task, target, store)
    store.add_attempt(agent_attempt(relu_task, 40.0, TIMING_CLEAN), AGENT_KERNEL)
    choice = choose(relu_task, target, store, "auto")  # the unconfirmed win is confirmed now
    assert choice.kernel == "eager"
    confirmation = store.attempts(relu_task.key)[-1]
    assert confirmation.confirms is not None and confirmation.timing_quality == TIMING_CLEAN
    assert confirmation.latency_us == 101.0
    summary = summarize(relu_task, store)
    assert summary.winner == "eager" and summary.timing_quality == TIMING_CLEAN
    assert (summary.clean_rounds, summary.rounds) == (15, 15)
    assert summary.attempts == 1  # a confirmation is not another attempt of the agent


def test_a_kernel_whose_re_check_gives_a_wrong_answer_never_runs(
    relu_task: Task, tmp_path: Path
) -> None:
    """A win whose confirmation mismatches is refuted for good: eager runs, the reason says
    why (not that the reference was too slow to time), and no later process re-checks it."""

    class MismatchingTarget(ScriptedTarget):
        def evaluate(self, task: TaskSpec, kernel: Kernel | None, **kw: Any) -> Evaluation:
            evaluation = super().evaluate(task, kernel, **kw)
            if kernel is not None and kernel.source == AGENT_KERNEL:
                return Evaluation("mismatch", error="output 0: 3 of 128 elements differ")
            return evaluation

    target = MismatchingTarget()
    store = store_with(tmp_path, relu_task, target)
    measuring.measure_reference(relu_task, target, store)
    store.add_attempt(agent_attempt(relu_task, 40.0, TIMING_CLEAN), AGENT_KERNEL)
    choice = choose(relu_task, target, store, "auto")
    assert choice.kernel == "eager"
    assert "failed its re-check (mismatch: output 0: 3 of 128" in choice.reason
    standing = winner(store.attempts(relu_task.key), torch.get_num_threads())
    assert standing.refuted is not None and standing.challenger is None and standing.clean
    calls = len(target.calls)
    measuring.MEASURED.clear()  # a later process
    again = choose(relu_task, target, store, "auto")
    assert again.kernel == "eager" and again.reason == choice.reason
    assert len(target.calls) == calls


def test_a_choice_is_reused_only_under_the_threads_it_was_measured_with(
    relu_task: Task, tmp_path: Path
) -> None:
    target = ScriptedTarget()
    store = store_with(tmp_path, relu_task, target)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        measuring.measure_reference(relu_task, target, store)
        claimed = agent_attempt(relu_task, 50.0, TIMING_CLEAN)
        store.add_attempt(claimed, AGENT_KERNEL)
        confirmed = agent_attempt(relu_task, 50.0, TIMING_CLEAN, confirms=claimed.id)
        store.add_attempt(confirmed, AGENT_KERNEL)
        assert choose(relu_task, target, store, "auto").kernel == "agent"
        calls = len(target.calls)
        torch.set_num_threads(1)
        choice = choose(relu_task, target, store, "auto")
        # Measured again as for an unseen task (the reference against eager, 1 thread); the
        # 2-thread agent kernel is not reused.
        assert choice.kernel == "eager" and len(target.calls) == calls + 1
        assert store.attempts(relu_task.key)[-1].threads == 1
    finally:
        torch.set_num_threads(before)


def test_an_older_versions_kernel_is_revalidated_not_orphaned(
    relu_task: Task, tmp_path: Path
) -> None:
    target = ScriptedTarget()
    target.latencies[AGENT_KERNEL] = [40.0]
    store = ExperienceStore(tmp_path / "store")
    assert hardware_of(OLD_TARGET_KEY) == hardware_of(TARGET_KEY)
    old = TaskRecord(
        "old-" + relu_task.key,
        relu_task.op,
        relu_task.label,
        relu_task.workload,
        [],
        [],
        "cpu",
        OLD_TARGET_KEY,
    )
    store.add_task(old)
    first = agent_attempt(relu_task, 45.0, TIMING_CLEAN, task=old.key)
    store.add_attempt(first, AGENT_KERNEL)
    confirmed = agent_attempt(relu_task, 45.0, TIMING_CLEAN, task=old.key, confirms=first.id)
    store.add_attempt(confirmed, AGENT_KERNEL)

    choice = choose(relu_task, target, store, "auto")
    assert choice.kernel == "agent" and choice.kernel_us == 40.0
    moved = next(a for a in store.attempts(relu_task.key) if a.transferred_from)
    # It names the record that pinned the kernel under the older key: its confirmation.
    assert moved.transferred_from == confirmed.id and moved.source == SOURCE_AGENT
    assert store.has_edge(moved.id, confirmed.id, TRANSFERRED_FROM)
    assert any(a.confirms == moved.id for a in store.attempts(relu_task.key))
    # reference vs eager, the old kernel re-validated, then confirmed
    assert target.calls == [relu_task.payload, AGENT_KERNEL, AGENT_KERNEL]


def test_the_eager_call_survives_the_store(relu_task: Task, tmp_path: Path) -> None:
    encoded = eager_json(relu_task.spec.eager)
    assert encoded is not None and json.loads(json.dumps(encoded)) == encoded
    assert eager_from_json(encoded) == relu_task.spec.eager
    store = store_with(tmp_path, relu_task, ScriptedTarget())
    rebuilt = task_from_record(store.task(relu_task.key), relu_task.payload)
    assert rebuilt is not None and rebuilt.spec == relu_task.spec


def test_the_eager_call_of_an_fx_list_argument_survives_the_store() -> None:
    """fx passes `normalized_shape` to layer_norm as its `immutable_list`: encoded as a list,
    decoded as one, so a stored layer_norm can be run again (once, it could not)."""
    from torch.fx.immutable_collections import immutable_list

    from kope.vocabulary.specs import InputRef, OpCall

    call = OpCall("aten.layer_norm.default", (InputRef(0), immutable_list([64]), None, None, 1e-5))
    encoded = eager_json(call)
    assert encoded is not None and encoded["args"][1] == {"list": [64]}
    decoded = eager_from_json(json.loads(json.dumps(encoded)))
    assert isinstance(decoded, OpCall) and decoded.args[1] == [64]
    x = torch.randn(3, 64)
    torch.testing.assert_close(decoded([x])[0], torch.nn.functional.layer_norm(x, [64]))


def test_memory_remeasure_replaces_a_contaminated_figure(
    relu_task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    target = ScriptedTarget(reference_us=50.0)
    target.quality = TIMING_CONTAMINATED
    store = store_with(tmp_path, relu_task, target)
    assert choose(relu_task, target, store, "auto").kernel == "eager"
    target.quality = TIMING_CLEAN
    monkeypatch.setattr("kope.frontend.compiler.target_for", lambda *args: target)
    assert main(["memory", "remeasure", relu_task.key[:12], "--store", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert "re-measured 1 of 1 tasks" in out and "reference" in out
    again = ExperienceStore(store.root)
    latest = again.attempts(relu_task.key)[-1]
    assert latest.confirms is not None and latest.timing_quality == TIMING_CLEAN
    assert winner(again.attempts(relu_task.key)).best.id == latest.id

    assert main(["memory", "show", relu_task.key[:12], "--store", str(store.root)]) == 0
    shown = capsys.readouterr().out
    assert "[contaminated 3/15 clean rounds" in shown and "[clean 15/15 clean rounds" in shown
    assert "speedup not clean" in shown  # the contaminated figure, not printed as a speedup
