"""The experience store as a listener: what the loop and selection announce becomes records.

The loop and selection never write the store; they emit events (`kope.vocabulary.events`),
and `Recorder` turns them into tasks, attempts, the eager baseline timed beside a reference
lowering, artifacts and edges. `attempt_of` is the one rule that makes an attempt of an
evaluation: its figures from one interleaved run, speedups against the eager (and reference)
timing measured beside it, and the quality of that run.
"""

from __future__ import annotations

from typing import Any

from kope.memory.schema import AttemptRecord, TaskRecord
from kope.memory.store import ExperienceStore
from kope.vocabulary.events import AttemptEvaluated, Event, TaskSeen
from kope.vocabulary.evidence import SOURCE_EAGER, SOURCE_REFERENCE, VERIFIED, quality_of


def attempt_of(event: AttemptEvaluated) -> AttemptRecord:
    """The attempt an evaluation is recorded as (its artifact digest is set when stored).

    The figure is clean only if the kernel's and its baseline's timings both are: eager's, or
    the reference lowering's for an operator known only as IR (no eager call). `threads` is
    the baseline's thread count (the measuring process's), which is what the figure means."""
    evaluation = event.evaluation
    kernel, eager, reference = evaluation.kernel, evaluation.eager, evaluation.reference
    baseline = eager or reference
    threads = evaluation.threads or (
        baseline.threads if baseline else kernel.threads if kernel else 0
    )
    decision: dict[str, Any] = {
        "decision": event.decision,
        "agent": event.agent,
        "model": event.model,
        "tokens_in": event.tokens_in,
        "tokens_out": event.tokens_out,
        "config": event.config,
        "parent": event.parent,
        "transferred_from": event.transferred_from,
        "confirms": event.confirms,
    }
    attempt = AttemptRecord(
        task=event.task,
        source=event.source,
        verdict=evaluation.verdict,
        id=event.id,
        created=event.created,
        form=event.kernel.form if event.kernel is not None else AttemptRecord.form,
        error=evaluation.error,
        wall_s=evaluation.wall_s,
        max_abs_err=evaluation.max_abs_err,
        max_rel_err=evaluation.max_rel_err,
        latency_us=kernel.median_us if kernel else None,
        spread_us=kernel.spread_us if kernel else None,
        repeats=kernel.repeats if kernel else 0,
        threads=threads,
        device_compile=evaluation.device_compile,
        eager_us=eager.median_us if eager else None,
        reference_us=reference.median_us if reference else None,
        speedup_vs_eager=eager.median_us / kernel.median_us if kernel and eager else None,
        speedup_vs_reference=(
            reference.median_us / kernel.median_us if kernel and reference else None
        ),
        **{**quality_of(kernel, baseline), **decision},
    )
    if event.source == SOURCE_REFERENCE and kernel is not None:
        attempt.reference_us = kernel.median_us
        attempt.speedup_vs_reference = 1.0
    return attempt


def baseline_of(event: AttemptEvaluated) -> AttemptRecord | None:
    """The eager baseline a reference lowering's evaluation timed beside it (one per
    measurement; a confirmation's is not one), or None."""
    eager = event.evaluation.eager
    if eager is None or event.source != SOURCE_REFERENCE or not event.baseline:
        return None
    return AttemptRecord(
        task=event.task,
        source=SOURCE_EAGER,
        verdict=VERIFIED,
        latency_us=eager.median_us,
        spread_us=eager.spread_us,
        repeats=eager.repeats,
        threads=eager.threads,
        eager_us=eager.median_us,
        speedup_vs_eager=1.0,
        decision=f"eager ATen baseline timed beside attempt {event.id}",
        **quality_of(eager),
    )


def task_of(event: TaskSeen) -> TaskRecord:
    return TaskRecord(
        key=event.key,
        op=event.op,
        label=event.label,
        workload=event.workload,
        inputs=[[list(shape), dtype] for shape, dtype in event.inputs],
        outputs=[[list(shape), dtype] for shape, dtype in event.outputs],
        target=event.target,
        target_key=event.target_key,
        eager=event.eager,
        strides=[list(s) for s in event.strides] or None,
    )


class Recorder:
    """Records what it hears into `store`: the listener every run of the loop has."""

    def __init__(self, store: ExperienceStore):
        self.store = store

    def __call__(self, event: Event) -> None:
        if isinstance(event, TaskSeen):
            if self.store.task(event.key) is None:
                record = task_of(event)
                if event.payload:
                    record.payload = self.store.put_artifact(event.payload)
                self.store.add_task(record)
        elif isinstance(event, AttemptEvaluated):
            self._attempt(event)

    def _attempt(self, event: AttemptEvaluated) -> None:
        # The edges to the attempt's parent, the kernel it reused and the figure it confirms
        # are implied by its fields (`ExperienceStore._link_attempt`).
        artifact = event.kernel.source if event.kernel is not None else None
        self.store.add_attempt(attempt_of(event), artifact)
        baseline = baseline_of(event)
        if baseline is not None:
            self.store.add_attempt(baseline)
