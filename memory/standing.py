"""The rule that says which kernel a task runs, over the attempts the store recorded.

The store records, queries and merges attempts and never decides what runs; this module
decides, from the attempts alone (as MetaSchedule's ApplyHistoryBest does beside its
database). `winner` is the one rule that selection, measuring, reports, plots and the passes
share: `winner(store.attempts(key), threads)` says where a task's choice stands. `wins`,
`WIN_MARGIN` and `first_of_the_fastest` are its pieces that others use alone: the measuring
of a confirmation, the whole-graph check and the heuristic agent's climb.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from kope.memory.schema import AttemptRecord
from kope.vocabulary.evidence import (
    SOURCE_EAGER,
    SOURCE_GRAPH,
    SOURCE_REFERENCE,
    TIMEOUT,
    TIMING_CLEAN,
    TIMING_CONTAMINATED,
    TIMING_UNKNOWN,
    VERIFIED,
)

T = TypeVar("T")


def speedup_over_baseline(attempt: AttemptRecord) -> float:
    """The speedup over the task's baseline: eager ATen, else (an operator known only as IR,
    timed with no eager call) its reference lowering."""
    if attempt.source == SOURCE_EAGER:
        return 1.0
    if attempt.eager_us is None and attempt.reference_us is not None:
        return attempt.speedup_vs_reference or 0.0
    return attempt.speedup_vs_eager or 0.0


# A confirmation wins only by more than this share of eager's time: the few percent machine
# noise moves a median from run to run must not pin a kernel.
WIN_MARGIN = 0.03


@dataclass
class Standing:
    """Where a task's choice stands, by `winner`'s rule.

    `pinned` is the attempt whose figures the chosen kernel rests on (None: eager runs);
    `baseline` the latest reference attempt, whose figures show eager against the reference
    lowering (or, on a target that cannot run it, the latest eager timing); `challenger` a
    candidate whose figure says it wins but that no clean confirmation has settled (it is what
    to re-measure); `refuted` the latest re-check of a candidate that failed (a wrong answer,
    a crash: that kernel never runs again); `legacy` marks a task with no judged timing at all
    (an older store). `clean` says the choice rests on clean figures.
    """

    pinned: AttemptRecord | None = None
    baseline: AttemptRecord | None = None
    eager: AttemptRecord | None = None
    challenger: AttemptRecord | None = None
    legacy: bool = False
    refuted: AttemptRecord | None = None
    # Verified kernels whose every figure load disturbed, whatever those figures say (a win or
    # a loss), in the order found: what a quiet re-measurement may still settle.
    unsettled: list[AttemptRecord] = field(default_factory=list)

    @property
    def best(self) -> AttemptRecord | None:
        return self.pinned if self.pinned is not None else self.eager

    @property
    def clean(self) -> bool:
        if self.legacy or self.challenger is not None:
            return False
        if self.pinned is not None:
            return True
        # Eager runs: settled when eager beat the reference on a clean figure, or when the
        # reference could not be timed at all (then no figure would change the choice).
        return self.baseline is not None and (
            self.baseline.latency_us is None or self.baseline.timing_quality == TIMING_CLEAN
        )


def wins(attempt: AttemptRecord) -> bool:
    """Whether an attempt's figure beats its baseline beyond noise (WIN_MARGIN)."""
    return (
        attempt.verdict == VERIFIED
        and attempt.source not in (SOURCE_EAGER, SOURCE_GRAPH)
        and attempt.latency_us is not None
        and speedup_over_baseline(attempt) > 1.0 + WIN_MARGIN
    )


def winner(attempts: Sequence[AttemptRecord], threads: int | None = None) -> Standing:
    """The one rule that says which kernel a task runs (selection, reports, passes).

    Only figures measured with `threads` threads count (when given): a figure means what it
    was measured under. A candidate (the reference lowering or an agent kernel) pins the
    choice only through a clean confirmation: a later attempt that re-measured it head to head
    against eager (`confirms`), whose figure was clean and still beats eager by more than
    WIN_MARGIN. Per kernel the latest clean confirmation decides, so a clean re-measurement
    that no longer wins un-pins it, while a contaminated one changes nothing. Among pinned
    kernels the fastest (by its confirmation) runs, and of kernels within WIN_MARGIN of it,
    a tie, the one found first; with none, eager runs. A candidate is re-measured (the
    `challenger`) only where its figure beats the pinned kernel's by more than WIN_MARGIN, and
    never on a disturbed figure of a kernel that has a clean one; of several, the fastest by an
    undisturbed figure, and where every figure is disturbed, the one found first.

    A task none of whose figures were judged or confirmed (`unknown` quality: recorded
    before KOPE judged timings) keeps the older rule, its fastest verified figure with eager
    as 1, and is marked `legacy` so that the next compile re-times it.

    A kernel that once failed a re-check (a confirmation or re-validation that mismatched,
    crashed or did not build; a timeout may be the machine's load and does not count) is
    refuted: whatever its other figures say, it is neither pinned nor a challenger.

    A task known only as IR (no eager call: `kope-optimize` inside a pipeline) is judged the
    same way against its reference lowering. Once a task has an eager baseline, figures timed
    against the reference alone no longer pin anything: a kernel they say wins is a challenger,
    to be confirmed against eager, until a figure against eager exists for it.
    """
    # A record without a thread count (0: untimed, or written by hand) counts under any.
    counted = [a for a in attempts if threads is None or a.threads in (threads, 0)]
    timed = [a for a in counted if a.latency_us is not None]
    eager = next((a for a in reversed(timed) if a.source == SOURCE_EAGER), None)
    # The baseline is the latest reference attempt; a target that cannot run the reference
    # lowering has eager timed alone as its baseline instead.
    baseline = next((a for a in reversed(counted) if a.source == SOURCE_REFERENCE), None)
    if baseline is None:
        baseline = next((a for a in reversed(counted) if a.source == SOURCE_EAGER), None)
    # Judged by what was recorded, timed or not: a hand-made or older store's untimed kernel
    # still counts under the older rule, while any judged figure brings in the new one.
    unjudged = all(a.timing_quality == TIMING_UNKNOWN and a.confirms is None for a in counted)
    if counted and unjudged:
        best = max(
            (a for a in counted if a.verdict == VERIFIED), key=speedup_over_baseline, default=None
        )
        pinned = best if best is not None and best.source != SOURCE_EAGER else None
        return Standing(pinned, baseline, eager, legacy=True)
    failed = [a for a in counted if _refutes(a)]
    refuted = {a.artifact for a in failed}
    against_eager = any(a.source == SOURCE_EAGER for a in counted)
    comparable = [
        a
        for a in timed
        if (not against_eager or a.eager_us is not None) and a.artifact not in refuted
    ]
    settled: dict[str, AttemptRecord] = {}  # kernel (artifact) -> its latest clean confirmation
    for a in comparable:
        if a.confirms is not None and a.artifact and a.timing_quality == TIMING_CLEAN:
            settled[a.artifact] = a
    found: dict[str, int] = {}  # kernel (artifact) -> when it was first recorded
    for index, a in enumerate(counted):
        if a.artifact:
            found.setdefault(a.artifact, index)

    def in_found_order(kernels: Iterable[AttemptRecord]) -> list[AttemptRecord]:
        return sorted(kernels, key=lambda c: found.get(c.artifact or "", len(found)))

    pinned = first_of_the_fastest(
        in_found_order(c for c in settled.values() if wins(c)), speedup_over_baseline
    )
    # A candidate is worth re-measuring only if its figure beats the pinned kernel's by more
    # than noise: a tie never unseats the kernel found first.
    floor = (speedup_over_baseline(pinned) if pinned is not None else 1.0) * (1.0 + WIN_MARGIN)
    # A disturbed figure never outweighs a clean one of the same kernel: once a kernel has been
    # timed cleanly, what load once made it look like is no reason to re-measure it.
    timed_clean = {a.artifact for a in comparable if a.timing_quality == TIMING_CLEAN}
    open_ = [
        a
        for a in comparable
        if a.confirms is None
        and wins(a)
        and a.artifact not in settled
        and speedup_over_baseline(a) > floor
        and not (a.timing_quality == TIMING_CONTAMINATED and a.artifact in timed_clean)
    ]
    if not open_ and against_eager:  # a kernel found against the reference alone, untried
        tried = {a.artifact for a in comparable}
        open_ = [
            a for a in timed if a.eager_us is None and wins(a) and a.artifact not in tried | refuted
        ]
    # Figures that load disturbed rank the load, not the kernels (beside 2x load a one-thread
    # matmul kernel timed 66x a two-thread eager whose threads waited on each other; 0.65x
    # quiet): a candidate with an undisturbed figure goes first, else the one the search found
    # first, its own best guess.
    steady = [a for a in open_ if a.timing_quality != TIMING_CONTAMINATED]
    if steady:
        challenger = first_of_the_fastest(in_found_order(steady), speedup_over_baseline)
    else:
        challenger = next(iter(in_found_order(open_)), None)
    unsettled: dict[str, AttemptRecord] = {}
    for a in in_found_order(comparable):
        if (
            a.artifact
            and a.confirms is None
            and a.verdict == VERIFIED
            and a.source not in (SOURCE_EAGER, SOURCE_GRAPH)
            and a.artifact not in timed_clean
        ):
            unsettled.setdefault(a.artifact, a)
    return Standing(
        pinned,
        baseline,
        eager,
        challenger,
        refuted=failed[-1] if failed else None,
        unsettled=list(unsettled.values()),
    )


def first_of_the_fastest(candidates: Iterable[T], speed: Callable[[T], float]) -> T | None:
    """Of `candidates`, in the order given, the first whose speed is within WIN_MARGIN of the
    fastest's: figures that close are a tie that the machine's noise decides, and deciding it
    by the order of the search gives the same choice in every run (the store's winner, the
    heuristic agent's climb)."""
    items = list(candidates)
    top = max((speed(c) for c in items), default=0.0)
    return next((c for c in items if speed(c) * (1.0 + WIN_MARGIN) >= top), None)


def _refutes(attempt: AttemptRecord) -> bool:
    """Whether `attempt` is a failed re-check of a candidate kernel (see `winner`)."""
    rechecks = attempt.confirms is not None or attempt.transferred_from is not None
    return (
        rechecks
        and bool(attempt.artifact)
        and attempt.source != SOURCE_EAGER
        and attempt.verdict not in (VERIFIED, TIMEOUT)
    )
