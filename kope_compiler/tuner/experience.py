"""Experience for the agents: what memory's ACMI retrieves for an operator, as agents use it.

`kope.memory.retrieve` ranks the experience graph's attempts and insights for a task and packs
them under a token budget. A language model reads that rendered text; the heuristic agent
reads the same chosen attempts as structured `Experience` (decision, configuration, verdict,
speedup, and how similar their operator is), so both agents see exactly what ACMI selected.
Each item also carries what its operator's cost depends on (output shapes, the loop trip counts
of the op a schedule tiles, read from the stored reference lowering), for the heuristic agent's
learned cost model.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict

import numpy as np

from kope.agents.base import Experience
from kope.memory import retrieve
from kope.memory.schema import AttemptRecord, TaskRecord
from kope.memory.similarity import Features, distance, distances, features
from kope.memory.store import ExperienceStore
from kope.passes.analysis import analyze
from kope.spaces.schedules import principal_op, work
from kope.targets.device_compile import estimate_of
from kope.vocabulary.evidence import TIMING_CONTAMINATED

log = logging.getLogger("kope.experience")

ATTEMPT_KINDS = ("best", "attempt", "failure")


# The nearest tasks whose measured attempts train the heuristic agent's cost model: the store
# as MetaSchedule's database of measured records, not ACMI's token-budgeted pick. Enough for
# a suite's worth of operators of one target; a store of a million attempts stays cheap.
EVIDENCE_TASKS = 256


def measured_evidence(store: ExperienceStore, key: str) -> list[Experience]:
    """Every recorded attempt with a configuration of the `EVIDENCE_TASKS` tasks nearest to
    task `key` (itself excluded: the agent's history holds its own), with the similarity
    ACMI's retrieval computes: what a learned cost model trains on."""
    task = store.task(key)
    if task is None:
        return []
    mine = _features(task)
    table = store.task_table()
    if not len(table["row"]):
        return []
    dist = distances(mine, store.codes_for(mine), table)
    # Every family: a kernel family (rows, contraction) spans several op families.
    order = np.argsort(dist, kind="stable")[:EVIDENCE_TASKS]
    items: list[Experience] = []
    for index in order:
        row = int(table["row"][index])
        other = store.record_at(row)
        if not isinstance(other, TaskRecord) or other.key == key:
            continue
        similarity = math.exp(-float(dist[index]) / 2)
        loops = _loops(store, other.payload)
        same_target = _features(other).target == mine.target
        for attempt_row in store.attempt_rows(row):
            attempt = store.record_at(attempt_row)
            if not isinstance(attempt, AttemptRecord) or not attempt.config or attempt.confirms:
                continue  # no configuration to learn from, or a re-measure of one
            if attempt.speedup_vs_eager and attempt.timing_quality == TIMING_CONTAMINATED:
                continue  # a figure the machine's load disturbed teaches the wrong speed
            items.append(_experience(attempt, other, similarity, loops, same_target))
    return items


def _experience(
    attempt: AttemptRecord,
    task: TaskRecord,
    similarity: float,
    loops: tuple[tuple[int, ...], int, int],
    same_target: bool = True,
) -> Experience:
    return Experience(
        attempt_id=attempt.id,
        task_key=task.key,
        task_label=task.label,
        task_op=task.op,
        shapes=tuple(tuple(s) for s, _ in task.inputs),
        similarity=similarity,
        decision=attempt.decision,
        config=attempt.config,
        verdict=attempt.verdict,
        speedup_vs_eager=attempt.speedup_vs_eager,
        speedup_vs_reference=attempt.speedup_vs_reference,
        error=(attempt.error or "").strip().splitlines()[0][:200] if attempt.error else None,
        outputs=tuple(tuple(s) for s, _ in task.outputs),
        loop_ranges=loops[0],
        linalg_ops=loops[1],
        work=loops[2],
        same_target=same_target,
        estimate_us=estimate_of(attempt.device_compile),
    )


def retrieve_experience(
    store: ExperienceStore, key: str, budget_tokens: int
) -> tuple[list[Experience], str]:
    """The attempts ACMI chose for task `key` (as `Experience`) and the rendered context."""
    task = store.task(key)
    if task is None:
        return [], ""
    context = retrieve(store, task, budget_tokens)
    mine = _features(task)
    items: list[Experience] = []
    for item in context.items:
        if item.kind not in ATTEMPT_KINDS:
            continue
        attempt = store.record(item.id)
        other = store.task(item.task)
        if not isinstance(attempt, AttemptRecord) or other is None:
            continue
        similarity = math.exp(-distance(mine, _features(other)) / 2)
        items.append(_experience(attempt, other, similarity, _loops(store, other.payload)))
    return items, context.text


# Loops of a stored payload by its digest (content-addressed: the same in every store). Every
# attempt of the loop retrieves again, and analysing a payload parses it.
_LOOPS: OrderedDict[str, tuple[tuple[int, ...], int, int]] = OrderedDict()
_LOOPS_KEPT = 4096
_NO_LOOPS: tuple[tuple[int, ...], int, int] = ((), 0, 0)


def _loops(store: ExperienceStore, digest: str | None) -> tuple[tuple[int, ...], int, int]:
    """The loop trip counts of the op a schedule tiles in a task's stored reference lowering,
    its count of linalg ops and the iterations of its largest one; ((), 0, 0) where the
    payload is not stored."""
    if not digest:
        return _NO_LOOPS
    if digest in _LOOPS:
        _LOOPS.move_to_end(digest)
        return _LOOPS[digest]
    text = store.get_artifact(digest)
    if text is None:
        return _NO_LOOPS
    try:
        info = analyze(text)
    except Exception:  # a payload this KOPE no longer parses: the item keeps its shapes only
        log.warning("stored payload %s does not parse; its loops are unknown", digest[:12])
        return _NO_LOOPS
    op = principal_op(info)
    found = (tuple(op.ranges) if op else (), len(info.ops), work(info))
    _LOOPS[digest] = found
    if len(_LOOPS) > _LOOPS_KEPT:
        _LOOPS.popitem(last=False)
    return found


def _features(task: TaskRecord) -> Features:
    return features(task.op, task.inputs, task.outputs, task.target, task.hardware)
