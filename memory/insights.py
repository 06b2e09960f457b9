"""Insights: lessons distilled from attempts, with the evidence for and against them.

An insight is keyed on (op family, dtype, normalised decision text): the heuristic agent
writes decisions as short strings such as "tile 8x32x4 + vectorize", so the same decision on
another matmul adds evidence to the same node. `distil_insights(store, task_key)`, called by
the optimization loop after each task, links every agent attempt of the task with a decision
to its insight:

- `supports`: verified and at least `min_gain` times faster than eager;
- `contradicts`: failed (compile_error, runtime_error, timeout, mismatch), or verified but
  slower than eager by the same margin;
- neither: verified within the margin (no lesson either way).

The insight's counts are recounted from its edges (the truth, shared by every process) and
its weight is the posterior mean (support + 1) / (support + contradict + 2), so later
contradicting evidence lowers it. It is idempotent: distilling a task twice adds nothing.
"""

from __future__ import annotations

import hashlib
import logging
import time

from kope.memory.schema import (
    CONTRADICTS,
    SUPPORTS,
    AttemptRecord,
    EdgeRecord,
    InsightRecord,
    TaskRecord,
)
from kope.memory.similarity import normalize_decision, op_family
from kope.memory.store import ExperienceStore
from kope.vocabulary.evidence import SOURCE_AGENT, TIMING_CONTAMINATED, VERIFIED

log = logging.getLogger("kope.memory")


def insight_id(family: str, dtype: str, decision: str) -> str:
    """The stable id of the insight on a decision for an op family and dtype."""
    digest = hashlib.sha256(f"{family}|{dtype}|{normalize_decision(decision)}".encode())
    return f"insight-{digest.hexdigest()[:32]}"


def evidence(attempt: AttemptRecord, min_gain: float = 1.05) -> str | None:
    """SUPPORTS, CONTRADICTS or None: what an attempt says about its decision. A figure the
    machine's load disturbed says nothing about speed either way."""
    if attempt.verdict != VERIFIED:
        return CONTRADICTS
    speedup = attempt.speedup_vs_eager
    if speedup is None or attempt.timing_quality == TIMING_CONTAMINATED:
        return None
    if speedup >= min_gain:
        return SUPPORTS
    return CONTRADICTS if speedup <= 1.0 / min_gain else None


def distil_insights(
    store: ExperienceStore, task_key: str, *, min_gain: float = 1.05
) -> list[InsightRecord]:
    """Create or update the insights that the agent attempts of `task_key` bear on; returns
    them in their new state. Safe to call repeatedly and from several processes."""
    store.refresh()
    task = store.task(task_key)
    if task is None:
        raise KeyError(f"no task {task_key!r} in {store.root}")
    family, dtype = op_family(task.op), _dtype(task)
    groups: dict[str, list[AttemptRecord]] = {}
    for attempt in store.attempts(task_key):
        # A confirmation re-times an attempt's kernel: evidence about the figure, not a decision.
        if (
            attempt.source == SOURCE_AGENT
            and attempt.confirms is None
            and normalize_decision(attempt.decision)
        ):
            groups.setdefault(normalize_decision(attempt.decision), []).append(attempt)
    updated: list[InsightRecord] = []
    for decision, attempts in sorted(groups.items()):
        iid = insight_id(family, dtype, decision)
        new_edges = [
            EdgeRecord(iid, a.id, kind)
            for a in attempts
            if (kind := evidence(a, min_gain)) is not None and not store.has_edge(iid, a.id, kind)
        ]
        existing = store.record(iid)
        if not new_edges and isinstance(existing, InsightRecord):
            updated.append(existing)
            continue
        insight = _recount(store, iid, family, dtype, decision, existing, new_edges)
        store.add_records([insight, *new_edges])
        final = _recount(store, iid, family, dtype, decision, store.record(iid), [])
        if final != store.record(iid):  # another process's edges landed meanwhile
            store.add_insight(final)
        updated.append(final)
        log.info("insight %s: %s", iid, final.text)
    return updated


def _recount(
    store: ExperienceStore,
    iid: str,
    family: str,
    dtype: str,
    decision: str,
    existing: object,
    new_edges: list[EdgeRecord],
) -> InsightRecord:
    links = {(dst, kind) for dst, kind in store.edges_from(iid)} if existing else set()
    links |= {(e.dst, e.kind) for e in new_edges}
    support = [store.record(dst) for dst, kind in sorted(links) if kind == SUPPORTS]
    contradict = sum(1 for _, kind in links if kind == CONTRADICTS)
    best = max(
        (a for a in support if isinstance(a, AttemptRecord)),
        key=lambda a: (a.speedup_vs_eager or 0.0, a.id),
        default=None,
    )
    created = existing.created if isinstance(existing, InsightRecord) else time.time()
    insight = InsightRecord(
        id=iid,
        family=family,
        dtype=dtype,
        decision=decision,
        text=_text(store, family, dtype, decision, best, len(support), contradict),
        support=len(support),
        contradict=contradict,
        weight=(len(support) + 1) / (len(support) + contradict + 2),
        best_speedup=best.speedup_vs_eager if best else None,
        best_attempt=best.id if best else None,
        created=created,
        updated=existing.updated if isinstance(existing, InsightRecord) else created,
    )
    if isinstance(existing, InsightRecord) and _same_state(existing, insight):
        return existing
    insight.updated = time.time()
    return insight


def _same_state(a: InsightRecord, b: InsightRecord) -> bool:
    return (a.support, a.contradict, a.best_attempt, a.text) == (
        b.support,
        b.contradict,
        b.best_attempt,
        b.text,
    )


def _text(
    store: ExperienceStore,
    family: str,
    dtype: str,
    decision: str,
    best: AttemptRecord | None,
    support: int,
    contradict: int,
) -> str:
    tally = f"{support} supporting, {contradict} contradicting attempts"
    if best is not None and best.speedup_vs_eager is not None:
        owner = store.task(best.task)
        where = f" ({owner.label})" if owner is not None else ""
        return (
            f"{decision} gave {best.speedup_vs_eager:.2f}x over eager on {dtype} "
            f"{family}{where}; {tally}"
        )
    return f"{decision} failed or did not beat eager on {dtype} {family}; {tally}"


def _dtype(task: TaskRecord) -> str:
    spec = task.outputs[0] if task.outputs else (task.inputs[0] if task.inputs else None)
    return str(spec[1]) if spec and len(spec) > 1 else ""
