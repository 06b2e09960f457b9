"""Experience for the agents: the relevant past attempts of an operator, from memory.

This adapts what memory retrieves (ACMI: ranked under a token budget) into the agents'
`Experience` items and the rendered context a language model reads.
"""

from __future__ import annotations

import math

from kope.agents.base import Experience
from kope.memory.schema import SOURCE_AGENT, AttemptRecord, TaskRecord
from kope.memory.store import ExperienceStore


def retrieve_experience(store: ExperienceStore, key: str, budget_tokens: int) -> tuple[list[Experience], str]:
    """Relevant attempts (this operator's and similar ones') and their rendered context."""
    task = store.task(key)
    if task is None:
        return [], ""
    from kope.optimize import decode_decision

    items: list[Experience] = []
    for other in store.tasks():
        similarity = task_similarity(task, other)
        if similarity <= 0.0:
            continue
        for attempt in store.attempts(other.key):
            if attempt.source != SOURCE_AGENT:
                continue
            text, config = decode_decision(attempt.decision)
            items.append(Experience(
                attempt_id=attempt.id, task_key=other.key, task_label=other.label,
                task_op=other.op, shapes=tuple(tuple(s) for s, _ in other.inputs),
                similarity=similarity, decision=text, config=config, verdict=attempt.verdict,
                speedup_vs_eager=attempt.speedup_vs_eager,
                speedup_vs_reference=attempt.speedup_vs_reference,
                error=(attempt.error or "").splitlines()[0][:200] if attempt.error else None,
            ))
    items.sort(key=lambda e: (-e.similarity, -(e.speedup_vs_eager or 0.0)))
    context = render_context(items, budget_tokens)
    return items, context


def task_similarity(a: TaskRecord, b: TaskRecord) -> float:
    """1 for the same operator; high for the same op at nearby shapes; 0 for unrelated ops."""
    if a.key == b.key:
        return 1.0
    if a.target != b.target:
        return 0.0
    if a.op != b.op:
        return 0.0
    if len(a.inputs) != len(b.inputs):
        return 0.3
    distance = 0.0
    for (sa, da), (sb, db) in zip(a.inputs, b.inputs):
        if da != db or len(sa) != len(sb):
            return 0.3
        distance += sum(abs(math.log2(max(x, 1)) - math.log2(max(y, 1))) for x, y in zip(sa, sb))
    return max(0.3, 0.95 - 0.05 * distance)


def render_context(items: list[Experience], budget_tokens: int) -> str:
    lines: list[str] = []
    used = 0
    for item in items:
        speed = f"{item.speedup_vs_eager:.2f}x eager" if item.speedup_vs_eager else item.verdict
        line = f"- [{item.similarity:.2f}] {item.task_label}: {item.decision} -> {speed}"
        if item.error and item.verdict != "verified":
            line += f" ({item.error[:120]})"
        cost = len(line) // 4 + 1
        if used + cost > budget_tokens:
            break
        lines.append(line)
        used += cost
    return "\n".join(lines)
