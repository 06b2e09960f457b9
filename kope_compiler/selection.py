"""Choosing the kernel each Task runs: known experience first, measurement only when unseen.

Candidates per Task are eager ATen, the reference lowering, and any verified agent kernel in
the store. The first compile of an unseen Task verifies the reference lowering against eager
(float64 where the op allows) and times both, interleaved, in an isolated worker; the result
goes to the experience store, so a later process chooses without measuring again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kope.memory.schema import (
    SOURCE_AGENT,
    SOURCE_EAGER,
    SOURCE_REFERENCE,
    AttemptRecord,
    TaskRecord,
)
from kope.memory.store import ExperienceStore
from kope.targets.base import Evaluation, Kernel, Target
from kope.task import Task

log = logging.getLogger("kope.compiler")


@dataclass
class Choice:
    """The kernel a Task runs and why."""

    kernel: str  # eager | reference | agent
    reason: str
    source: Kernel | None = None
    eager_us: float | None = None
    kernel_us: float | None = None
    verdict: str | None = None  # the reference lowering's


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
    )


def seed_for(key: str) -> int:
    return int(key[:8], 16)


def measure_reference(task: Task, target: Target, store: ExperienceStore) -> AttemptRecord:
    """Verify and time the reference lowering against eager; record both as attempts.

    A reference too slow to time (a large operator's naive loops) is recorded verified with no
    latency: it stays the oracle of the agent's candidates, and it never wins selection."""
    evaluation = target.evaluate(task.spec, Kernel(task.payload), seed=seed_for(task.key))
    decision = "; ".join(evaluation.notes)
    return record_evaluation(
        store, task.key, evaluation, SOURCE_REFERENCE, task.payload, decision=decision
    )


def record_evaluation(
    store: ExperienceStore,
    key: str,
    evaluation: Evaluation,
    source: str,
    artifact: str | None,
    **decision: Any,
) -> AttemptRecord:
    """Store an evaluated candidate (and, for the reference, the eager baseline timed beside it).

    Every attempt carries the eager (and reference) latency measured beside it, so its
    speedups come from one interleaved run."""
    kernel, eager, reference = evaluation.kernel, evaluation.eager, evaluation.reference
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
        threads=kernel.threads if kernel else 0,
        eager_us=eager.median_us if eager else None,
        reference_us=reference.median_us if reference else None,
        speedup_vs_eager=eager.median_us / kernel.median_us if kernel and eager else None,
        speedup_vs_reference=(
            reference.median_us / kernel.median_us if kernel and reference else None
        ),
        **decision,
    )
    if source == SOURCE_REFERENCE and kernel is not None:
        attempt.reference_us = kernel.median_us
        attempt.speedup_vs_reference = 1.0
    store.add_attempt(attempt, artifact)
    if eager is not None and source == SOURCE_REFERENCE:  # one baseline per task suffices
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
            )
        )
    return attempt


def known_reference(task: Task, target: Target, store: ExperienceStore) -> AttemptRecord:
    """The task's reference attempt: from the store, or verified and timed now (and stored)."""
    store.refresh()
    store.add_task(task_record(task, target))
    reference = latest(store.attempts(task.key), SOURCE_REFERENCE)
    return reference if reference is not None else measure_reference(task, target, store)


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
    ref_choice = Choice(
        "reference",
        "",
        Kernel(task.payload),
        reference.eager_us,
        reference.latency_us,
        reference.verdict,
    )
    if policy == "reference":
        ref_choice.reason = "kernels=reference"
        return ref_choice
    best = store.best(task.key)
    if reference.latency_us is None and (best is None or best.source != SOURCE_AGENT):
        return Choice(
            "eager",
            "the reference lowering is verified but too slow to time; no faster kernel known",
            eager_us=reference.eager_us,
            verdict=reference.verdict,
        )
    if best is None or best.source == SOURCE_EAGER:
        return Choice(
            "eager",
            f"eager is fastest ({_fmt(reference.eager_us)} µs "
            f"vs reference {_fmt(reference.latency_us)} µs)",
            eager_us=reference.eager_us,
            kernel_us=reference.latency_us,
            verdict=reference.verdict,
        )
    if best.source == SOURCE_AGENT and best.artifact and best.latency_us is not None:
        text = store.get_artifact(best.artifact)
        if text is not None:
            return Choice(
                "agent",
                f"fastest verified agent kernel ({best.speedup_vs_eager or 0:.2f}x eager)",
                Kernel(text),
                best.eager_us,
                best.latency_us,
                reference.verdict,
            )
        log.warning("the best kernel of %s has lost its artifact; using the next best", task.label)
    ref_choice.reason = (
        f"reference is fastest ({_fmt(reference.latency_us)} µs "
        f"vs eager {_fmt(reference.eager_us)} µs)"
    )
    if (reference.speedup_vs_eager or 0) < 1.0:
        return Choice(
            "eager",
            "eager is fastest",
            eager_us=reference.eager_us,
            kernel_us=reference.latency_us,
            verdict=reference.verdict,
        )
    return ref_choice


def latest(attempts: list[AttemptRecord], source: str) -> AttemptRecord | None:
    """The most recent attempt from `source` (eager | reference | agent)."""
    matching = [a for a in attempts if a.source == source]
    return matching[-1] if matching else None


def _fmt(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "?"


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:200] if text else ""
