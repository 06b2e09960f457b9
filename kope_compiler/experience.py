"""Experience for the agents: what memory's ACMI retrieves for an operator, as agents use it.

`kope.memory.retrieve` ranks the experience graph's attempts and insights for a task and packs
them under a token budget. A language model reads that rendered text; the heuristic agent
reads the same chosen attempts as structured `Experience` (decision, configuration, verdict,
speedup, and how similar their operator is), so both agents see exactly what ACMI selected.
"""

from __future__ import annotations

import math

from kope.agents.base import Experience
from kope.memory import retrieve
from kope.memory.schema import AttemptRecord, TaskRecord
from kope.memory.similarity import Features, distance, features
from kope.memory.store import ExperienceStore

ATTEMPT_KINDS = ("best", "attempt", "failure")


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
        items.append(
            Experience(
                attempt_id=attempt.id,
                task_key=other.key,
                task_label=other.label,
                task_op=other.op,
                shapes=tuple(tuple(s) for s, _ in other.inputs),
                similarity=math.exp(-distance(mine, _features(other)) / 2),
                decision=attempt.decision,
                config=attempt.config,
                verdict=attempt.verdict,
                speedup_vs_eager=attempt.speedup_vs_eager,
                speedup_vs_reference=attempt.speedup_vs_reference,
                error=(attempt.error or "").strip().splitlines()[0][:200]
                if attempt.error
                else None,
            )
        )
    return items, context.text


def _features(task: TaskRecord) -> Features:
    return features(task.op, task.inputs, task.outputs, task.target, task.hardware)
