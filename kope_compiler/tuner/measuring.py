"""The figures selection needs, measured when they are missing: the reference lowering against
eager, confirmations of winning figures, re-validation of an older version's kernel.

Each evaluation is announced as an event (`kope.vocabulary.events`); the experience store's
`Recorder` is the listener that records it, so nothing here writes memory. What the store then
says a task runs is `kope.memory.standing.winner`'s rule, read by `kope.tuner.selection`.

A figure means the thread count it was measured with (`threads_now()`): under another count
the Task is measured again, as if unseen. A confirmation re-measures a candidate head to head
against eager in a fresh evaluation; only a clean one that still beats eager pins it.
"""

from __future__ import annotations

import logging

import torch

from kope.core.task import Task
from kope.memory.recorder import Recorder, attempt_of
from kope.memory.schema import AttemptRecord, hardware_of
from kope.memory.standing import speedup_over_baseline, winner, wins
from kope.memory.store import ExperienceStore
from kope.targets.base import Target
from kope.vocabulary.events import AttemptEvaluated, Events, TaskSeen
from kope.vocabulary.evidence import (
    SOURCE_AGENT,
    SOURCE_EAGER,
    SOURCE_REFERENCE,
    TIMEOUT,
    TIMING_CLEAN,
    VERIFIED,
    Evaluation,
)
from kope.vocabulary.kernels import Kernel
from kope.vocabulary.specs import eager_json

log = logging.getLogger("kope.compiler")

CONFIRM_SEED = 7919  # a confirmation times fresh inputs, not those of the figure it checks

# (task key, threads) measured in this process: a Task whose figures are not clean is
# re-measured once per process, not at every graph that holds it.
MEASURED: set[tuple[str, int]] = set()
# ... and that once re-times at most this many of its candidates, one after another while
# each confirmation is clean: the claimed winner, then other claims, then kernels whose every
# figure load disturbed. Load ranks the load, not the kernels: beside 2x load a layer norm's
# kernels timed 0.75x a two-thread eager (a loss, so no claim) and 1.35x quiet.
REMEASURED_CANDIDATES = 3


def threads_now() -> int:
    """The thread count figures are measured with, and reused only under."""
    return torch.get_num_threads()


def seed_for(key: str) -> int:
    return int(key[:8], 16)


def recording(store: ExperienceStore, events: Events | None = None) -> Events:
    """`events`, or the listeners of a plain run: the store's recorder alone."""
    return events if events is not None else Events(Recorder(store))


def task_seen(task: Task, target: Target) -> TaskSeen:
    spec = task.spec
    return TaskSeen(
        key=task.key,
        op=task.op,
        label=task.label,
        workload=task.workload,
        inputs=tuple((s.shape, s.dtype) for s in spec.inputs),
        outputs=tuple((s.shape, s.dtype) for s in spec.outputs),
        target=target.name,
        target_key=target.key(),
        eager=eager_json(spec.eager),
        payload=task.payload,
        strides=spec.strides,
    )


def announce(events: Events, event: AttemptEvaluated, store: ExperienceStore) -> AttemptRecord:
    """Emit `event`; returns the attempt it is recorded as, as stored when a listener stored it
    (with its artifact's digest), for the caller's decisions."""
    events.emit(event)
    stored = store.record(event.id)
    return stored if isinstance(stored, AttemptRecord) else attempt_of(event)


def stored_kernel(store: ExperienceStore, attempt: AttemptRecord) -> Kernel | None:
    """The kernel `attempt` evaluated, from the artifact store (None if its text is lost)."""
    text = store.get_artifact(attempt.artifact) if attempt.artifact else None
    return Kernel(text, attempt.form) if text is not None else None


def oracle_for(task: Task, target: Target) -> Kernel | None:
    """What an agent kernel for `task` is verified against on `target`: the reference
    lowering where the target runs it, else eager ATen (None)."""
    return task.reference if target.builds_oracle(task.reference) else None


def measure_reference(
    task: Task,
    target: Target,
    store: ExperienceStore,
    events: Events | None = None,
    limit_s: float | None = None,
) -> AttemptRecord:
    """Verify and time the reference lowering against eager; announce both (the eager
    baseline rides on the reference's event), and confirm the reference when its figure says
    it beats eager. A target that cannot run the reference lowering times eager alone: that
    is the task's baseline there.

    A reference too slow to time (a large operator's naive loops) is recorded verified with no
    latency: it stays the oracle of the agent's candidates, and it never wins selection. With
    `limit_s` (a first call's bound), an evaluation that needs longer is recorded as deferred:
    a timeout of the bound, not of the operator, which `kope precompile` measures again."""
    events = recording(store, events)
    kernel = task.reference if target.builds(task.reference) else None
    # An operator known only as IR (no eager call) has its reference as its own oracle: what
    # is measured is that it builds, runs, and how fast; agent kernels are timed against it.
    oracle = oracle_for(task, target) if task.spec.eager is None else None
    evaluation = target.evaluate(
        task.spec, kernel, oracle=oracle, seed=seed_for(task.key), limit_s=limit_s
    )
    config = None
    if limit_s is not None and evaluation.verdict == TIMEOUT:
        evaluation.notes.insert(
            0,
            f"deferred: verifying it takes longer than a first call affords ({limit_s:g} s); "
            "it runs on ATen until `kope precompile` verifies it",
        )
        config = {DEFERRED: True}
    if kernel is None:
        what = "eager ATen baseline" if task.spec.eager is not None else "baseline (no eager call)"
        decision = "; ".join(
            [f"{what}: the {target.name} target does not run the reference", *evaluation.notes]
        )
        event = AttemptEvaluated(task.key, SOURCE_EAGER, evaluation, None, decision=decision)
        return announce(events, event, store)
    decision = "; ".join(evaluation.notes)
    event = AttemptEvaluated(
        task.key, SOURCE_REFERENCE, evaluation, kernel, decision=decision, config=config
    )
    reference = announce(events, event, store)
    if wins(reference):
        confirm(task, target, store, reference, events)
    return reference


def confirm(
    task: Task,
    target: Target,
    store: ExperienceStore,
    candidate: AttemptRecord,
    events: Events | None = None,
) -> AttemptRecord | None:
    """Re-measure `candidate`'s kernel head to head against eager in a fresh evaluation and
    announce it as an attempt that `confirms` the candidate; None if its kernel text is lost.

    Whether the confirmation pins the kernel is `winner`'s to say: only a clean one that
    still beats eager beyond noise does."""
    events = recording(store, events)
    if candidate.source == SOURCE_REFERENCE:
        kernel: Kernel | None = task.reference
    else:
        kernel = stored_kernel(store, candidate)
    if kernel is None:
        log.warning("%s: attempt %s has lost its kernel text", task.label, candidate.id)
        return None
    # The reference is checked against eager; an agent kernel against the reference lowering,
    # which is timed beside it, so all of a confirmation's figures come from one run.
    oracle = None if candidate.source == SOURCE_REFERENCE else oracle_for(task, target)
    evaluation = target.evaluate(
        task.spec, kernel, oracle=oracle, measure=True, seed=seed_for(task.key) + CONFIRM_SEED
    )
    event = AttemptEvaluated(
        task.key,
        candidate.source,
        evaluation,
        kernel,
        decision=f"confirms {candidate.id}: {candidate.decision}",
        agent=candidate.agent,
        model=candidate.model,
        config=candidate.config,
        confirms=candidate.id,
        baseline=False,
    )
    attempt = announce(events, event, store)
    held = attempt.timing_quality == TIMING_CLEAN and wins(attempt)
    now = speedup_over_baseline(attempt) if attempt.latency_us is not None else None
    log.info(
        "%s: %s kernel %s (%s, first figure %.2fx, now %s)",
        task.label,
        candidate.source,
        "confirmed" if held else "not confirmed",
        attempt.timing_quality,
        speedup_over_baseline(candidate),
        f"{now:.2f}x" if now else attempt.verdict,
    )
    return attempt


def transfer_from_older(
    task: Task, target: Target, store: ExperienceStore, events: Events | None = None
) -> AttemptRecord | None:
    """Re-validate the pinned agent kernel of the same workload on the same hardware under an
    older target key (another KOPE, torch or torch-mlir version): evaluate it now, announce it
    under this key with a `transferred_from` link, and confirm it if it wins."""
    events = recording(store, events)
    hardware = hardware_of(target.key())
    for other in store.tasks_with_workload(task.workload, hardware):
        if other.key == task.key:
            continue
        old = winner(store.attempts(other.key)).best
        if old is None or old.source != SOURCE_AGENT:
            continue
        kernel = stored_kernel(store, old)
        if kernel is None:
            continue
        evaluation: Evaluation = target.evaluate(
            task.spec, kernel, oracle=oracle_for(task, target), seed=seed_for(task.key)
        )
        event = AttemptEvaluated(
            task.key,
            SOURCE_AGENT,
            evaluation,
            kernel,
            decision=f"re-validated from {other.target_key}: {old.decision}",
            agent=old.agent,
            model=old.model,
            config=old.config,
            transferred_from=old.id,
        )
        attempt = announce(events, event, store)
        log.info(
            "%s: re-validated the kernel of an older version (%s): %s",
            task.label,
            other.target_key,
            attempt.verdict,
        )
        if wins(attempt):
            confirm(task, target, store, attempt, events)
        return attempt
    return None


def known_reference(
    task: Task,
    target: Target,
    store: ExperienceStore,
    events: Events | None = None,
    first_call: bool = False,
) -> AttemptRecord:
    """The task's baseline attempt under this process's thread count (its reference lowering,
    or eager where the target cannot run it): from the store, or measured now. A task with no
    attempts at all first looks for its workload under an older target key.

    At a model's `first_call` the measurement is bounded by `FIRST_CALL_LIMIT_S`; a deferred
    baseline (one that needed longer) is then taken as it is, and measured again, unbounded,
    only outside a first call (`kope precompile`)."""
    events = recording(store, events)
    store.refresh()
    events.emit(task_seen(task, target))
    threads = threads_now()
    reference = winner(store.attempts(task.key), threads).baseline
    if reference is not None and _serves(reference, task):
        if (first_call and _deferred(reference)) or not _timed_out(reference, store):
            return reference
    first_seen = not store.attempts(task.key)
    MEASURED.add((task.key, threads))
    limit_s = FIRST_CALL_LIMIT_S if first_call else None
    reference = measure_reference(task, target, store, events, limit_s)
    if first_seen and reference.verdict == VERIFIED:
        transfer_from_older(task, target, store, events)
    return reference


# Baseline measurements that ran out of time before one counts as the operator's verdict.
TIMEOUT_TRIES = 3
# The longest the first call of a compiled model waits for one operator's reference lowering
# to be verified and timed; an operator that needs longer runs on ATen until `kope
# precompile`, which has no such bound, measures it (torch-mlir's MaxPool3dStaticModule, a
# 360 MB input, spent over 120 s verifying inside a first call).
FIRST_CALL_LIMIT_S = 20.0
# The `config` flag of a baseline that ran out of a first call's time, not of its own.
DEFERRED = "deferred"


def _deferred(baseline: AttemptRecord) -> bool:
    return baseline.verdict == TIMEOUT and bool((baseline.config or {}).get(DEFERRED))


def _timed_out(baseline: AttemptRecord, store: ExperienceStore) -> bool:
    """Whether the stored baseline timed out and is worth measuring again: a worker that did
    not start or answer in time may have met the machine's load (or a limit set too low for
    one run), not the operator; after TIMEOUT_TRIES such baselines the verdict stands. One
    deferred by a first call's bound is always measured again (it says nothing of the
    operator) and counts for none of the tries."""
    if baseline.verdict != TIMEOUT:
        return False
    if _deferred(baseline):
        return True
    tries = [
        a
        for a in store.attempts(baseline.task)
        if a.source == baseline.source
        and a.threads == baseline.threads
        and a.verdict == TIMEOUT
        and not _deferred(a)
    ]
    return len(tries) < TIMEOUT_TRIES


def _serves(baseline: AttemptRecord, task: Task) -> bool:
    """Whether a stored baseline serves `task`: one timed without eager (by `kope-optimize`,
    on the IR alone) does not serve a task that has an eager call, whose eager figures are
    then measured."""
    timed_without_eager = baseline.verdict == VERIFIED and baseline.eager_us is None
    return task.spec.eager is None or not timed_without_eager


def remeasure(
    task: Task, target: Target, store: ExperienceStore, events: Events | None = None
) -> list[AttemptRecord]:
    """Re-time the task's stored choice now; returns the new attempts.

    The candidate that wins on an unconfirmed figure is confirmed; else the pinned kernel is
    re-confirmed (its new confirmation replaces the stale figure); with eager chosen, the
    baseline is measured against eager again (and confirmed if it now wins). While each
    measurement is clean, the next claimed win is confirmed, then the kernels whose every
    figure load disturbed, up to `REMEASURED_CANDIDATES` confirmations (the fastest confirmed
    pins)."""
    events = recording(store, events)
    store.refresh()
    events.emit(task_seen(task, target))
    threads = threads_now()
    MEASURED.add((task.key, threads))
    before = {a.id for a in store.attempts(task.key)}
    standing = winner(store.attempts(task.key), threads)
    candidate = standing.challenger or standing.pinned
    tried: set[str | None] = set()

    def following() -> AttemptRecord | None:
        """What to confirm next: a claimed win, else a kernel load left unsettled."""
        standing = winner(store.attempts(task.key), threads)
        unsettled = (a for a in standing.unsettled if a.artifact not in tried)
        return standing.challenger or next(unsettled, None)

    if candidate is None:
        reference = measure_reference(task, target, store, events)
        if reference.timing_quality == TIMING_CLEAN:
            candidate = following()
    for _ in range(REMEASURED_CANDIDATES):
        if candidate is None:
            break
        if candidate.confirms is not None:  # re-confirm the kernel, naming its first figure
            first = store.record(candidate.confirms)
            candidate = first if isinstance(first, AttemptRecord) else candidate
        tried.add(candidate.artifact)
        attempt = confirm(task, target, store, candidate, events)
        if attempt is None or attempt.timing_quality != TIMING_CLEAN:
            break  # the machine is busy now: the next candidate would be timed no cleaner
        candidate = following()
    return [a for a in store.attempts(task.key) if a.id not in before]
