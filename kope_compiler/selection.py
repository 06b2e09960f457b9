"""Choosing the kernel each Task runs: known experience first, measurement only when needed.

Candidates per Task are eager ATen, the reference lowering, and any verified agent kernel in
the store. The first compile of an unseen Task verifies the reference lowering against eager
(float64 where the op allows) and times both, interleaved, in an isolated worker; the result
goes to the experience store, so a later process chooses without measuring again.

A choice pins only through a clean confirmation. A figure that says a candidate beats eager is
a claim, not a choice: before the candidate becomes the operator's kernel it is re-measured
head to head against eager in a fresh evaluation (`confirm`), and it is taken only when that
confirmation is clean and still beats eager beyond noise (`kope.memory.store.winner`, the one
rule that reports, passes and this module share). A figure measured under load is recorded as
contaminated and never pins: eager (or the previous clean choice) runs until a clean figure
exists. A figure means the thread count it was measured with (`torch.get_num_threads()` of
the measuring process): under another count the Task is measured again, as if unseen.

A Task whose choice does not rest on clean figures (contaminated, or measured before KOPE
judged timings) is re-measured once per process at compile. A Task with no attempts under its
key (a new KOPE or torch version makes new keys) re-validates the confirmed agent kernel of the
same workload on the same hardware under an older target key, instead of starting over.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from kope.memory.schema import (
    QUALITY_CLEAN,
    QUALITY_CONTAMINATED,
    QUALITY_UNKNOWN,
    SOURCE_AGENT,
    SOURCE_EAGER,
    SOURCE_REFERENCE,
    AttemptRecord,
    TaskRecord,
    hardware_of,
)
from kope.memory.store import ExperienceStore, Standing, wins
from kope.targets.base import (
    Evaluation,
    InputRef,
    Kernel,
    OpCall,
    Program,
    StepRef,
    Target,
    TaskSpec,
    TensorSpec,
    Timing,
)
from kope.task import Task

log = logging.getLogger("kope.compiler")

CONFIRM_SEED = 7919  # a confirmation times fresh inputs, not those of the figure it checks

# (task key, threads) measured in this process: a Task whose figures are not clean is
# re-measured once per process, not at every graph that holds it.
_MEASURED: set[tuple[str, int]] = set()


@dataclass
class Choice:
    """The kernel a Task runs and why, with the figures (from one run) it rests on."""

    kernel: str  # eager | reference | agent
    reason: str
    source: Kernel | None = None
    eager_us: float | None = None
    kernel_us: float | None = None
    verdict: str | None = None  # the reference lowering's
    quality: str = QUALITY_UNKNOWN  # of the figures above


def threads_now() -> int:
    """The thread count figures are measured with, and reused only under."""
    return torch.get_num_threads()


def task_record(task: Task, target: Target) -> TaskRecord:
    spec = task.spec
    return TaskRecord(
        key=task.key,
        op=task.op,
        label=task.label,
        workload=task.workload,
        inputs=[[list(s.shape), s.dtype] for s in spec.inputs],
        outputs=[[list(s.shape), s.dtype] for s in spec.outputs],
        target=target.name,
        target_key=target.key(),
        eager=eager_json(spec.eager),
    )


def seed_for(key: str) -> int:
    return int(key[:8], 16)


# -- recording ------------------------------------------------------------------------------
def quality_of(*timings: Timing | None) -> dict[str, Any]:
    """The quality fields of a figure resting on `timings` (None ones ignored): clean only if
    every one is, contaminated if any is; the fewest clean rounds, the largest wait share."""
    present = [t for t in timings if t is not None]
    if not present:
        return {}
    qualities = {t.quality for t in present}
    quality = (
        QUALITY_CONTAMINATED
        if QUALITY_CONTAMINATED in qualities
        else QUALITY_CLEAN
        if qualities == {QUALITY_CLEAN}
        else QUALITY_UNKNOWN
    )
    waits = [t.wait_share for t in present if t.wait_share is not None]
    loads = [t.load for t in present if t.load is not None]
    return {
        "timing_quality": quality,
        "clean_rounds": min(t.clean_rounds for t in present),
        "rounds": max(t.rounds for t in present),
        "wait_share": max(waits) if waits else None,
        "load": max(loads) if loads else None,
    }


def record_evaluation(
    store: ExperienceStore,
    key: str,
    evaluation: Evaluation,
    source: str,
    artifact: str | None,
    *,
    baseline: bool = True,
    **decision: Any,
) -> AttemptRecord:
    """Store an evaluated candidate (and, for the reference, the eager baseline timed beside it
    unless `baseline` is false).

    Every attempt carries the eager (and reference) latency measured beside it, so its
    speedups come from one interleaved run, and the quality of that run: the figure is clean
    only if the kernel's and eager's timings both are. `threads` is eager's thread count (the
    measuring process's), which is what the figure means."""
    kernel, eager, reference = evaluation.kernel, evaluation.eager, evaluation.reference
    threads = eager.threads if eager else kernel.threads if kernel else 0
    attempt = AttemptRecord(
        task=key,
        source=source,
        verdict=evaluation.verdict,
        error=evaluation.error,
        wall_s=evaluation.wall_s,
        max_abs_err=evaluation.max_abs_err,
        max_rel_err=evaluation.max_rel_err,
        latency_us=kernel.median_us if kernel else None,
        spread_us=kernel.spread_us if kernel else None,
        repeats=kernel.repeats if kernel else 0,
        threads=threads,
        eager_us=eager.median_us if eager else None,
        reference_us=reference.median_us if reference else None,
        speedup_vs_eager=eager.median_us / kernel.median_us if kernel and eager else None,
        speedup_vs_reference=(
            reference.median_us / kernel.median_us if kernel and reference else None
        ),
        **{**quality_of(kernel, eager), **decision},
    )
    if source == SOURCE_REFERENCE and kernel is not None:
        attempt.reference_us = kernel.median_us
        attempt.speedup_vs_reference = 1.0
    store.add_attempt(attempt, artifact)
    if eager is not None and source == SOURCE_REFERENCE and baseline:  # one per measurement
        store.add_attempt(
            AttemptRecord(
                task=key,
                source=SOURCE_EAGER,
                verdict="verified",
                latency_us=eager.median_us,
                spread_us=eager.spread_us,
                repeats=eager.repeats,
                threads=eager.threads,
                eager_us=eager.median_us,
                speedup_vs_eager=1.0,
                decision=f"eager ATen baseline timed beside attempt {attempt.id}",
                **quality_of(eager),
            )
        )
    return attempt


# -- measuring and confirming ---------------------------------------------------------------
def measure_reference(task: Task, target: Target, store: ExperienceStore) -> AttemptRecord:
    """Verify and time the reference lowering against eager; record both as attempts, and
    confirm the reference when its figure says it beats eager.

    A reference too slow to time (a large operator's naive loops) is recorded verified with no
    latency: it stays the oracle of the agent's candidates, and it never wins selection."""
    evaluation = target.evaluate(task.spec, Kernel(task.payload), seed=seed_for(task.key))
    decision = "; ".join(evaluation.notes)
    reference = record_evaluation(
        store, task.key, evaluation, SOURCE_REFERENCE, task.payload, decision=decision
    )
    if wins(reference):
        confirm(task, target, store, reference)
    return reference


def confirm(
    task: Task, target: Target, store: ExperienceStore, candidate: AttemptRecord
) -> AttemptRecord | None:
    """Re-measure `candidate`'s kernel head to head against eager in a fresh evaluation and
    record it as an attempt that `confirms` the candidate; None if its kernel text is lost.

    Whether the confirmation pins the kernel is `winner`'s to say: only a clean one that
    still beats eager beyond noise does."""
    text = task.payload if candidate.source == SOURCE_REFERENCE else None
    if text is None and candidate.artifact:
        text = store.get_artifact(candidate.artifact)
    if text is None:
        log.warning("%s: attempt %s has lost its kernel text", task.label, candidate.id)
        return None
    # The reference is checked against eager; an agent kernel against the reference lowering,
    # which is timed beside it, so all of a confirmation's figures come from one run.
    oracle = None if candidate.source == SOURCE_REFERENCE else Kernel(task.payload)
    evaluation = target.evaluate(
        task.spec, Kernel(text), oracle=oracle, measure=True, seed=seed_for(task.key) + CONFIRM_SEED
    )
    attempt = record_evaluation(
        store,
        task.key,
        evaluation,
        candidate.source,
        text,
        baseline=False,
        decision=f"confirms {candidate.id}: {candidate.decision}",
        agent=candidate.agent,
        model=candidate.model,
        config=candidate.config,
        confirms=candidate.id,
    )
    held = attempt.timing_quality == QUALITY_CLEAN and wins(attempt)
    log.info(
        "%s: %s kernel %s (%s, first figure %.2fx, now %s)",
        task.label,
        candidate.source,
        "confirmed" if held else "not confirmed",
        attempt.timing_quality,
        candidate.speedup_vs_eager or 0.0,
        f"{attempt.speedup_vs_eager:.2f}x" if attempt.speedup_vs_eager else attempt.verdict,
    )
    return attempt


def transfer_from_older(task: Task, target: Target, store: ExperienceStore) -> AttemptRecord | None:
    """Re-validate the pinned agent kernel of the same workload on the same hardware under an
    older target key (another KOPE, torch or torch-mlir version): evaluate it now, record it
    under this key with a `transferred_from` edge, and confirm it if it wins."""
    hardware = hardware_of(target.key())
    for other in store.tasks_with_workload(task.workload, hardware):
        if other.key == task.key:
            continue
        old = store.best(other.key)
        if old is None or old.source != SOURCE_AGENT or not old.artifact:
            continue
        text = store.get_artifact(old.artifact)
        if text is None:
            continue
        evaluation = target.evaluate(
            task.spec, Kernel(text), oracle=Kernel(task.payload), seed=seed_for(task.key)
        )
        attempt = record_evaluation(
            store,
            task.key,
            evaluation,
            SOURCE_AGENT,
            text,
            decision=f"re-validated from {other.target_key}: {old.decision}",
            agent=old.agent,
            model=old.model,
            config=old.config,
            transferred_from=old.id,
        )
        log.info(
            "%s: re-validated the kernel of an older version (%s): %s",
            task.label,
            other.target_key,
            attempt.verdict,
        )
        if wins(attempt):
            confirm(task, target, store, attempt)
        return attempt
    return None


def known_reference(task: Task, target: Target, store: ExperienceStore) -> AttemptRecord:
    """The task's reference attempt under this process's thread count: from the store, or
    verified and timed now (and stored). A task with no attempts at all first looks for its
    workload under an older target key (`transfer_from_older`)."""
    store.refresh()
    store.add_task(task_record(task, target))
    threads = threads_now()
    reference = store.standing(task.key, threads).baseline
    if reference is not None:
        return reference
    first_seen = not store.attempts(task.key)
    _MEASURED.add((task.key, threads))
    reference = measure_reference(task, target, store)
    if first_seen and reference.verdict == "verified":
        transfer_from_older(task, target, store)
    return reference


def remeasure(task: Task, target: Target, store: ExperienceStore) -> list[AttemptRecord]:
    """Re-time the task's stored choice now; returns the new attempts.

    The candidate that wins on an unconfirmed figure is confirmed; else the pinned kernel is
    re-confirmed (its new confirmation replaces the stale figure); with eager chosen, the
    reference lowering is measured against eager again (and confirmed if it now wins)."""
    store.refresh()
    store.add_task(task_record(task, target))
    threads = threads_now()
    _MEASURED.add((task.key, threads))
    before = {a.id for a in store.attempts(task.key)}
    standing = store.standing(task.key, threads)
    candidate = standing.challenger or standing.pinned
    if candidate is not None:
        if candidate.confirms is not None:  # re-confirm the kernel, naming its first figure
            candidate = _record(store, candidate.confirms) or candidate
        confirm(task, target, store, candidate)
    else:
        measure_reference(task, target, store)
    return [a for a in store.attempts(task.key) if a.id not in before]


def _record(store: ExperienceStore, attempt_id: str) -> AttemptRecord | None:
    found = store.record(attempt_id)
    return found if isinstance(found, AttemptRecord) else None


# -- choosing -------------------------------------------------------------------------------
def choose(task: Task, target: Target, store: ExperienceStore, policy: str) -> Choice:
    """The kernel `task` runs under `policy` (auto | reference | eager)."""
    if policy == "eager":
        return Choice("eager", "kernels=eager")
    reference = known_reference(task, target, store)
    if reference.verdict != "verified":
        log.warning(
            "torch-mlir defect? the reference lowering of %s is %s; running it eagerly: %s",
            task.label,
            reference.verdict,
            (reference.error or "").splitlines()[0:1],
        )
        return Choice(
            "eager",
            f"reference lowering {reference.verdict}: {_first_line(reference.error)}",
            verdict=reference.verdict,
        )
    if policy == "reference":
        return Choice(
            "reference",
            "kernels=reference",
            Kernel(task.payload),
            reference.eager_us,
            reference.latency_us,
            reference.verdict,
            reference.timing_quality,
        )
    threads = threads_now()
    standing = store.standing(task.key, threads)
    if not standing.clean and (task.key, threads) not in _MEASURED:
        remeasure(task, target, store)
        standing = store.standing(task.key, threads)
    if not standing.clean:
        log.info(
            "%s: its figures are not clean (measured under load, or before KOPE judged "
            "timings); %s runs, and the figure will be re-measured at a later compile",
            task.label,
            _kernel_of(standing),
        )
    return _choice(task, store, standing, reference)


def _kernel_of(standing: Standing) -> str:
    return standing.pinned.source if standing.pinned is not None else SOURCE_EAGER


def _choice(
    task: Task, store: ExperienceStore, standing: Standing, reference: AttemptRecord
) -> Choice:
    pinned = standing.pinned
    how = "confirmed" if pinned is not None and pinned.confirms else "stored"
    if pinned is not None and pinned.source == SOURCE_AGENT and pinned.artifact:
        text = store.get_artifact(pinned.artifact)
        if text is not None:
            return Choice(
                SOURCE_AGENT,
                f"fastest {how} agent kernel ({pinned.speedup_vs_eager or 0:.2f}x eager)",
                Kernel(text),
                pinned.eager_us,
                pinned.latency_us,
                reference.verdict,
                pinned.timing_quality,
            )
        log.warning("the kernel of %s has lost its artifact; running eager", task.label)
    if pinned is not None and pinned.source == SOURCE_REFERENCE:
        return Choice(
            SOURCE_REFERENCE,
            f"{how} reference is fastest ({_fmt(pinned.latency_us)} µs "
            f"vs eager {_fmt(pinned.eager_us)} µs)",
            Kernel(task.payload),
            pinned.eager_us,
            pinned.latency_us,
            reference.verdict,
            pinned.timing_quality,
        )
    figures = standing.baseline or reference
    if figures.latency_us is None:
        reason = "the reference lowering is verified but too slow to time; no faster kernel known"
    elif standing.challenger is not None:
        reason = (
            f"eager until a clean confirmation: the {standing.challenger.source} kernel's "
            f"{standing.challenger.speedup_vs_eager or 0:.2f}x did not reproduce cleanly"
        )
    else:
        reason = (
            f"eager is fastest ({_fmt(figures.eager_us)} µs "
            f"vs reference {_fmt(figures.latency_us)} µs)"
        )
    return Choice(
        SOURCE_EAGER,
        reason,
        eager_us=figures.eager_us,
        kernel_us=figures.latency_us,
        verdict=reference.verdict,
        quality=figures.timing_quality,
    )


def latest(attempts: list[AttemptRecord], source: str) -> AttemptRecord | None:
    """The most recent attempt from `source` (eager | reference | agent)."""
    matching = [a for a in attempts if a.source == source]
    return matching[-1] if matching else None


# -- a stored task's eager call, as plain JSON ----------------------------------------------
def eager_json(call: OpCall | Program) -> dict[str, Any] | None:
    """The eager call as JSON the store can hold, or None if an argument has no encoding."""
    try:
        if isinstance(call, Program):
            return {
                "steps": [_encode_call(s) for s in call.steps],
                "outputs": [_encode(r) for r in call.outputs],
            }
        return _encode_call(call)
    except TypeError:
        return None


def eager_from_json(data: dict[str, Any]) -> OpCall | Program:
    """The eager call `eager_json` encoded."""
    if "steps" in data:
        return Program(
            tuple(_decode_call(s) for s in data["steps"]),
            tuple(_decode(r) for r in data["outputs"]),
        )
    return _decode_call(data)


def task_from_record(record: TaskRecord, payload: str) -> Task | None:
    """The Task a stored record describes (no fx nodes: for re-measuring), or None when the
    record holds no eager call (tasks recorded before KOPE stored it)."""
    if record.eager is None:
        return None
    spec = TaskSpec(
        record.label,
        tuple(TensorSpec(tuple(shape), dtype) for shape, dtype in record.inputs),
        tuple(TensorSpec(tuple(shape), dtype) for shape, dtype in record.outputs),
        eager_from_json(record.eager),
    )
    return Task([], [], spec, payload, record.key, record.workload)


def _encode_call(call: OpCall) -> dict[str, Any]:
    return {
        "op": call.op,
        "args": [_encode(a) for a in call.args],
        "kwargs": [[k, _encode(v)] for k, v in call.kwargs],
    }


def _decode_call(data: dict[str, Any]) -> OpCall:
    return OpCall(
        data["op"],
        tuple(_decode(a) for a in data["args"]),
        tuple((k, _decode(v)) for k, v in data["kwargs"]),
    )


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, InputRef):
        return {"input": value.index}
    if isinstance(value, StepRef):
        return {"step": value.step, "index": value.index}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_encode(v) for v in value]}
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return {"torch": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    raise TypeError(f"no JSON form for {type(value).__name__}")


def _decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if "input" in value:
        return InputRef(value["input"])
    if "step" in value:
        return StepRef(value["step"], value["index"])
    if "list" in value:
        return [_decode(v) for v in value["list"]]
    if "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if "torch" in value:
        return getattr(torch, value["torch"])
    return torch.device(value["device"])


def _fmt(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "?"


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:200] if text else ""
