"""Choosing the kernel each Task runs: known experience first, measurement only when needed.

Candidates per Task are eager ATen, the reference lowering (where the target runs it), and any
verified agent kernel in the store. The first compile of an unseen Task has its baseline
measured (`kope.tuner.measuring`: the reference lowering verified against eager, float64 where the
op allows, both timed interleaved in an isolated worker); the store records it, so a later process
chooses without measuring again. This module only chooses: it reads the store through
`kope.memory.standing.winner`, the one rule that reports, passes and the loop share.

A choice pins only through a clean confirmation: a figure that says a candidate beats eager is
a claim until a fresh head-to-head re-measurement (`kope.tuner.measuring.confirm`) is clean and
still beats eager beyond noise. A figure measured under load never pins: eager (or the
previous clean choice) runs until a clean figure exists. A figure means the thread count it
was measured with: under another count the Task is measured again, as if unseen.

A Task whose choice does not rest on clean figures (contaminated, or measured before KOPE
judged timings) is re-measured once per process at compile (up to three of its claims,
`kope.tuner.measuring.REMEASURED_CANDIDATES`). A Task with no attempts under its
key (a new KOPE or torch version makes new keys) re-validates the confirmed agent kernel of the
same workload on the same hardware under an older target key, instead of starting over.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kope.core.task import Task
from kope.memory.schema import AttemptRecord
from kope.memory.standing import Standing, winner
from kope.memory.store import ExperienceStore
from kope.targets.base import Target
from kope.tuner.measuring import (
    DEFERRED,
    FIRST_CALL_LIMIT_S,
    MEASURED,
    known_reference,
    remeasure,
    stored_kernel,
    threads_now,
)
from kope.vocabulary.events import Events
from kope.vocabulary.evidence import (
    SOURCE_AGENT,
    SOURCE_EAGER,
    SOURCE_REFERENCE,
    TIMEOUT,
    TIMING_UNKNOWN,
    VERDICT_NAMES,
    VERIFIED,
)
from kope.vocabulary.kernels import Kernel

log = logging.getLogger("kope.compiler")


@dataclass
class Choice:
    """The kernel a Task runs and why, with the figures (from one run) it rests on."""

    kernel: str  # eager | reference | agent
    reason: str
    source: Kernel | None = None
    eager_us: float | None = None
    kernel_us: float | None = None
    verdict: str | None = None  # the reference lowering's
    quality: str = TIMING_UNKNOWN  # of the figures above
    attempt: str | None = None  # the store's attempt a pinned kernel rests on


# -- choosing -------------------------------------------------------------------------------
_REFUSED_REFERENCES: set[str] = set()  # keys whose refused reference lowering was warned about


def choose(
    task: Task,
    target: Target,
    store: ExperienceStore,
    policy: str,
    events: Events | None = None,
) -> Choice:
    """The kernel `task` runs under `policy` (auto | reference | eager); what it has to
    measure first goes to `events` (by default, the store's recorder)."""
    if policy == "eager":
        return Choice(SOURCE_EAGER, "kernels=eager")
    reference = known_reference(task, target, store, events, first_call=True)
    if reference.verdict == TIMEOUT and (reference.config or {}).get(DEFERRED):
        return Choice(
            SOURCE_EAGER,
            f"its reference lowering takes longer to verify than a first call affords "
            f"({FIRST_CALL_LIMIT_S:g} s): ATen runs it until `kope precompile` verifies it",
            verdict=reference.verdict,
        )
    if reference.verdict != VERIFIED:
        # Once per operator and process: a model compiled again says nothing new.
        told = task.key in _REFUSED_REFERENCES
        _REFUSED_REFERENCES.add(task.key)
        # A timeout says nothing of torch-mlir's lowering: the worker ran out of time.
        why = (
            "could not be verified in time"
            if reference.verdict == TIMEOUT
            else "(torch-mlir's) failed verification"
        )
        (log.info if told else log.warning)(
            "%s runs eagerly (results unaffected): its reference lowering %s, %s: %s",
            task.label,
            why,
            VERDICT_NAMES.get(reference.verdict or "", reference.verdict),
            _first_line(reference.error),
        )
        return Choice(
            "eager",
            f"reference lowering {reference.verdict}: {_first_line(reference.error)}",
            verdict=reference.verdict,
        )
    if policy == "reference" and reference.source != SOURCE_REFERENCE:
        return Choice(
            SOURCE_EAGER,
            f"kernels=reference, but the {target.name} target does not run the reference lowering",
            eager_us=reference.eager_us,
            verdict=reference.verdict,
            quality=reference.timing_quality,
        )
    if policy == "reference":
        return Choice(
            SOURCE_REFERENCE,
            "kernels=reference",
            task.reference,
            reference.eager_us,
            reference.latency_us,
            reference.verdict,
            reference.timing_quality,
        )
    threads = threads_now()
    standing = winner(store.attempts(task.key), threads)
    if not standing.clean and (task.key, threads) not in MEASURED:
        remeasure(task, target, store, events)
        standing = winner(store.attempts(task.key), threads)
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
    if pinned is not None and pinned.source == SOURCE_AGENT:
        kernel = stored_kernel(store, pinned)
        if kernel is not None:
            return Choice(
                SOURCE_AGENT,
                f"fastest {how} agent kernel ({pinned.speedup_vs_eager or 0:.2f}x eager)",
                kernel,
                pinned.eager_us,
                pinned.latency_us,
                reference.verdict,
                pinned.timing_quality,
                pinned.id,
            )
        log.warning("the kernel of %s has lost its artifact; running eager", task.label)
    if pinned is not None and pinned.source == SOURCE_REFERENCE:
        return Choice(
            SOURCE_REFERENCE,
            f"{how} reference is fastest ({_fmt(pinned.latency_us)} µs "
            f"vs eager {_fmt(pinned.eager_us)} µs)",
            task.reference,
            pinned.eager_us,
            pinned.latency_us,
            reference.verdict,
            pinned.timing_quality,
            pinned.id,
        )
    figures = standing.baseline or reference
    refuted = standing.refuted
    if standing.challenger is not None:
        reason = (
            f"eager until a clean confirmation: the {standing.challenger.source} kernel's "
            "figure did not reproduce cleanly"
        )
    elif refuted is not None:
        reason = (
            f"eager: the {refuted.source} kernel that won failed its re-check "
            f"({refuted.verdict}: {_first_line(refuted.error)}) and is never run"
        )
    elif figures.latency_us is None:
        reason = "the reference lowering is verified but too slow to time; no faster kernel known"
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


def _fmt(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "?"


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:200] if text else ""
