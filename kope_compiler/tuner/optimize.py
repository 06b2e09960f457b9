"""The optimization loop of one operator.

retrieve experience (ACMI) → the agent proposes a kernel with a stated decision → the target
builds, verifies (against the reference lowering) and times it in an isolated worker → the
attempt and its outcome go to the experience graph → the agent gets the feedback → repeat
until the budget (attempts, wall time, tokens) is spent or the agent stops. A failed attempt is
data, never an error. The candidate whose figure wins is then confirmed (re-measured head to
head against eager in a fresh evaluation); only a clean confirmation that still wins makes it
the operator's kernel (by `kope.memory.standing.winner`), which every later
compile uses.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kope.agents.base import Agent, Feedback, Proposal, ProposalRequest, Rejected, TaskView
from kope.core.errors import KopeError
from kope.core.options import Options
from kope.core.task import Task
from kope.memory.schema import AttemptRecord
from kope.memory.standing import winner
from kope.memory.store import ExperienceStore
from kope.targets.base import Target
from kope.targets.device_compile import estimate_of
from kope.targets.measure import machine_quiet
from kope.tuner.measuring import (
    announce,
    confirm,
    known_reference,
    oracle_for,
    recording,
    seed_for,
    stored_kernel,
    threads_now,
)
from kope.vocabulary.events import AttemptEvaluated, ChoiceMade, Events
from kope.vocabulary.evidence import (
    COMPILE_ERROR,
    SOURCE_AGENT,
    SOURCE_EAGER,
    SOURCE_REFERENCE,
    TIMING_CONTAMINATED,
    TIMING_UNKNOWN,
    VERDICTS,
    VERIFIED,
    Evaluation,
)
from kope.vocabulary.kernels import Kernel

log = logging.getLogger("kope.optimize")

# Candidates confirmed after the loop at most: when the fastest figure does not reproduce, the
# next one may; beyond that the figures are not worth a worker's time.
CONFIRMATIONS = 2


@dataclass(frozen=True)
class Budget:
    """When the loop stops optimizing one operator; None means no limit of that kind.

    Not a second shape of the `budget` setting: `attempts` *is* that setting (an int
    wherever a person sets it: `Options.budget`, `--budget`, `kope-optimize{budget=N}`,
    `BenchConfig.budget`), and its default is read from `Options`. The other fields are
    limits the setting does not cover: `kope precompile`'s `--wall-s` and `--tokens`, and how
    much experience ACMI packs into each proposal.
    """

    attempts: int = field(default_factory=lambda: Options.default("budget"))
    wall_s: float | None = None
    tokens: int | None = None
    context_tokens: int = 2000  # experience injected per proposal


@dataclass
class TaskSummary:
    """One operator after optimization: the per-operator row of `kope precompile`'s report."""

    key: str
    op: str
    label: str
    winner: str  # eager | reference | agent
    verified: bool  # the agent produced at least one verified kernel
    attempts: int
    eager_us: float | None
    reference_us: float | None
    best_us: float | None
    speedup_vs_eager: float | None
    speedup_vs_reference: float | None
    verdicts: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    stopped: str = ""
    best_decision: str = ""
    # The quality of the figures the choice rests on (clean | contaminated | unknown).
    timing_quality: str = TIMING_UNKNOWN
    clean_rounds: int = 0
    rounds: int = 0
    # On a target that compiles for GPUs it lacks: the agent's kernels Triton's compiler took
    # for every architecture, and the best one's roofline estimate (microseconds; never a
    # timing).
    device_compiled: int = 0
    estimate_us: float | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def is_proposal(attempt: AttemptRecord, agent: str | None = None) -> bool:
    """Whether `attempt` is an agent's proposal (of `agent`, when given), not a confirmation."""
    return (
        attempt.source == SOURCE_AGENT
        and attempt.confirms is None
        and (agent is None or attempt.agent == agent)
    )


def disturbed(attempt: AttemptRecord) -> bool:
    """Whether `attempt` is a verified kernel whose timing the machine's load disturbed."""
    return attempt.verdict == VERIFIED and attempt.timing_quality == TIMING_CONTAMINATED


def spent_proposals(
    attempts: Sequence[AttemptRecord], agent: str, quiet: Callable[[], bool] = machine_quiet
) -> list[AttemptRecord]:
    """This agent's proposals that count against its budget when a run resumes: all of them,
    but on a quiet machine (`quiet`, asked only where a disturbed proposal makes it matter)
    not those whose timing the machine's load disturbed. Their figures say nothing of their
    kernels: beside 2x load a precompile timed no proposal cleanly and ranked them by noise
    (a layer norm's best kernel timed 0.66x eager there, 1.30x on a quiet machine), so the
    next precompile on a quiet machine proposes and times them again, and settles what the
    busy one could not."""
    proposals = [a for a in attempts if is_proposal(a, agent)]
    if not any(disturbed(a) for a in proposals) or not quiet():
        return proposals
    return [a for a in proposals if not disturbed(a)]


def task_view(task: Task, target: Target) -> TaskView:
    """The operator as an agent sees it, with what the target builds and how it says so."""
    return TaskView(
        key=task.key,
        op=task.op,
        label=task.label,
        payload=task.payload,
        inputs=task.spec.inputs,
        outputs=task.spec.outputs,
        target=target.name,
        capabilities=target.capabilities(),
        kernel_forms=target.kernel_forms,
        description=target.describe(task.spec),
        rules=target.kernel_rules(),
    )


def optimize_task(
    task: Task,
    target: Target,
    store: ExperienceStore,
    agent: Agent,
    budget: Budget = Budget(),
    *,
    seed: int = 0,
    events: Events | None = None,
    quiet: Callable[[], bool] = machine_quiet,
) -> TaskSummary:
    """Run the loop on one operator and summarise what the store now knows about it.

    Every evaluation and the choice made are announced to `events` (by default, the store's
    recorder alone); the loop reads the store, and writes it only through them. A run that
    resumes the operator continues after the proposals that count against the budget
    (`spent_proposals`, with `quiet`)."""
    events = recording(store, events)
    reference = known_reference(task, target, store, events)
    if reference.verdict != VERIFIED:
        log.warning(
            "%s: the reference lowering was not verified (verdict: %s); nothing to verify "
            "candidates against",
            task.label,
            reference.verdict,
        )
        return summarize(task, store, stopped=f"reference lowering {reference.verdict}")
    view = task_view(task, target)
    # Resuming: this agent's earlier proposals count against the budget (disturbed ones not
    # on a quiet machine: they are proposed and timed again).
    spent = spent_proposals(store.attempts(task.key), agent.name, quiet)
    history = [_feedback(a, store) for a in spent]
    tokens = 0
    start = time.monotonic()
    stopped = "budget spent"
    from kope.tuner.experience import measured_evidence, retrieve_experience

    # Other operators' records change only between operators: read once per operator.
    evidence = measured_evidence(store, task.key)
    for index in range(len(history), budget.attempts):
        if budget.wall_s is not None and time.monotonic() - start >= budget.wall_s:
            stopped = "wall time spent"
            break
        if budget.tokens is not None and tokens >= budget.tokens:
            stopped = "tokens spent"
            break
        experience, context = retrieve_experience(store, task.key, budget.context_tokens)
        request = ProposalRequest(
            view, experience, context, list(history), budget.attempts - index, seed, evidence
        )
        try:
            proposal = agent.propose(request)
        except KopeError:
            raise  # the user must act (an unreachable endpoint, a missing model name)
        except Exception as err:  # an agent defect: stop this operator, keep what is recorded
            log.error(
                "%s: the %s agent failed (%s: %s); stopping this operator",
                task.label,
                agent.name,
                type(err).__name__,
                err,
            )
            stopped = f"agent error: {type(err).__name__}"
            break
        if proposal is None:
            # The heuristic agent returns None when every candidate it knows for the
            # operator has been tried, or it knows none (an op its schedules do not fit).
            stopped = agent.stop_reason or (
                "no more candidates from the agent" if index else "the agent had none"
            )
            break
        tokens += proposal.tokens_in + proposal.tokens_out
        attempt = _attempt(task, target, store, events, agent, proposal, seed + index + 1)
        history.append(_feedback(attempt, store))
        log.info(
            "%s attempt %d: %s -> %s%s",
            task.label,
            index + 1,
            attempt.decision,
            attempt.verdict,
            f" {attempt.speedup_vs_eager:.2f}x eager" if attempt.speedup_vs_eager else "",
        )
    confirm_winner(task, target, store, events)
    _distil(store, task.key)
    summary = summarize(task, store, stopped=stopped, tokens=tokens)
    pinned = winner(store.attempts(task.key), threads_now()).pinned
    events.emit(
        ChoiceMade(
            task.key,
            task.label,
            summary.winner,
            f"{summary.winner} after {summary.attempts} attempts ({stopped})",
            pinned.id if pinned is not None else None,
            summary.timing_quality,
        )
    )
    return summary


def confirm_winner(
    task: Task, target: Target, store: ExperienceStore, events: Events | None = None
) -> None:
    """Confirm the candidate whose figure says it wins (a few, while they do not reproduce)."""
    for _ in range(CONFIRMATIONS):
        challenger = winner(store.attempts(task.key), threads_now()).challenger
        if challenger is None or confirm(task, target, store, challenger, events) is None:
            return


def _attempt(
    task: Task,
    target: Target,
    store: ExperienceStore,
    events: Events,
    agent: Agent,
    proposal: Proposal | Rejected,
    seed: int,
) -> AttemptRecord:
    """Evaluate one proposal (a refused one is a failed attempt that never ran) and announce it."""
    meta: dict[str, Any] = dict(
        agent=agent.name,
        model=proposal.model,
        tokens_in=proposal.tokens_in,
        tokens_out=proposal.tokens_out,
    )
    if isinstance(proposal, Rejected):
        refused = Evaluation(COMPILE_ERROR, error=f"rejected without running: {proposal.reason}")
        text = Kernel(proposal.source, proposal.form or target.kernel_forms[0])
        event = AttemptEvaluated(
            task.key,
            SOURCE_AGENT,
            refused,
            text if proposal.source else None,
            decision=proposal.decision or "answer rejected",
            **meta,
        )
        return announce(events, event, store)
    kernel = Kernel(proposal.source, proposal.form or target.kernel_forms[0])
    evaluation = target.evaluate(
        task.spec, kernel, oracle=oracle_for(task, target), seed=seed_for(task.key) + seed
    )
    event = AttemptEvaluated(
        task.key,
        SOURCE_AGENT,
        evaluation,
        kernel,
        decision=proposal.decision,
        config=proposal.config,
        parent=proposal.parent,
        transferred_from=proposal.transferred_from,
        **meta,
    )
    return announce(events, event, store)


def _feedback(attempt: AttemptRecord, store: ExperienceStore) -> Feedback:
    kernel = stored_kernel(store, attempt)
    return Feedback(
        attempt.id,
        attempt.decision,
        attempt.config,
        attempt.verdict,
        attempt.error,
        attempt.latency_us,
        attempt.eager_us,
        attempt.speedup_vs_eager,
        attempt.speedup_vs_reference,
        source=kernel.source if kernel is not None else "",
        estimate_us=estimate_of(attempt.device_compile),
    )


def _distil(store: ExperienceStore, key: str) -> None:
    try:
        from kope.memory.insights import distil_insights
    except ImportError:
        return
    distil_insights(store, key)


def summarize(
    task: Task, store: ExperienceStore, *, stopped: str = "", tokens: int | None = None
) -> TaskSummary:
    """The report row of `task`: the winner by the store's rule, with figures from one run
    (the pinned kernel's confirmation, or the reference lowering's measurement when eager
    runs) and their quality."""
    attempts = store.attempts(task.key)
    agent_attempts = [a for a in attempts if is_proposal(a)]
    standing = winner(attempts, threads_now())
    verdicts = Counter(a.verdict for a in agent_attempts)
    pinned = standing.pinned
    figures = pinned or standing.baseline
    # What runs when nothing is pinned: eager, or the reference body of an IR-only operator.
    unpinned = SOURCE_EAGER if task.spec.eager is not None else SOURCE_REFERENCE
    runs = pinned.source if pinned is not None else unpinned
    eager_us = figures.eager_us if figures else None
    ref_us = figures.reference_us if figures and figures.verdict == VERIFIED else None
    best_us = pinned.latency_us if pinned is not None else eager_us
    estimates = [
        e
        for a in agent_attempts
        if a.verdict == VERIFIED and (e := estimate_of(a.device_compile)) is not None
    ]
    return TaskSummary(
        key=task.key,
        op=task.op,
        label=task.label,
        winner=runs,
        verified=verdicts.get(VERIFIED, 0) > 0,
        attempts=len(agent_attempts),
        eager_us=eager_us,
        reference_us=ref_us,
        best_us=best_us,
        speedup_vs_eager=_ratio(eager_us, best_us),
        speedup_vs_reference=_ratio(ref_us, best_us),
        verdicts={v: verdicts.get(v, 0) for v in VERDICTS if verdicts.get(v)},
        tokens=tokens
        if tokens is not None
        else sum(a.tokens_in + a.tokens_out for a in agent_attempts),
        stopped=stopped,
        best_decision=pinned.decision if pinned is not None and runs == SOURCE_AGENT else "",
        timing_quality=figures.timing_quality if figures else TIMING_UNKNOWN,
        clean_rounds=figures.clean_rounds if figures else 0,
        rounds=figures.rounds if figures else 0,
        device_compiled=len(estimates),
        estimate_us=min(estimates, default=None),
    )


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator and denominator and math.isfinite(numerator) and math.isfinite(denominator):
        return numerator / denominator
    return None
