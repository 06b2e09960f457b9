"""Active Context Management and Injection (ACMI): the experience worth a prompt's tokens.

`retrieve(store, task, budget_tokens)` ranks what the graph knows and packs it under the
budget, deterministically (same store, same arguments, same text):

1. Tasks like this one, by `similarity.distance` (same op and target first, then other
   shapes and dtypes, then other targets, then other ops of the family); at most
   `max_tasks`, ties broken by key.
2. Their agent attempts, scored by relevance exp(-distance / 2) x outcome quality
   (latency of the task's best verified attempt / this one's: 1 for each task's best, so
   quality is normalised per task) x recency (half-life `half_life_days`, against the newest
   record considered, not the clock) x graph proximity (1 + 0.5 / hops from this task in the
   graph, following attempt, refines, transferred_from and similar edges). Failed attempts
   are scored the same without quality and packed from their own quota (`min_failures`),
   so a few instructive failures are always shown when there are any.
3. Insights of the op family, by weight and support.
4. Packing: the best known kernel of this task first, in full (its room is reserved: it
   only falls back to a summary line when it alone would not fit); then the failures, then
   `min_insights` insights, then the rest by score (failures beyond the quota weighted by
   `FAILURE_WEIGHT`) with a diversity penalty (each item already shown with the same
   decision halves a score, each from the same task multiplies it by 0.8); at most
   `full_kernels` other kernels in full. Each item is rendered at the richest level that
   fits: `full` (kernel text), `summary` (one detailed line), `line` (a short line); code is
   skipped, never truncated. The whole text is counted again at the end and is within the
   budget. Nothing is said twice: a kernel already shown for its task is not shown again (a
   model that repeats itself records the same text many times), and a kernel whose text is
   its task's reference lowering unchanged is a line that says so, never the text (for this
   task the prompt already holds it; for another it teaches nothing the line does not).
"""

from __future__ import annotations

import heapq
import itertools
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kope.memory.schema import AttemptRecord, InsightRecord, TaskRecord
from kope.memory.similarity import W_FAMILY, decision_hash, distances, features
from kope.memory.standing import winner
from kope.memory.store import INSIGHT, ExperienceStore
from kope.memory.tokens import TokenCounter, default_counter
from kope.vocabulary.evidence import SOURCE_AGENT, SOURCES, TIMING_CONTAMINATED, VERDICTS

LEVELS = ("full", "summary", "line")
_AGENT = SOURCES.index(SOURCE_AGENT)
FAILURE_WEIGHT = 0.5
REFERENCE = "reference"  # what names the kernel of an attempt that sent the reference back
# More characters per token than MLIR and schedules have (o200k: 2.2-3.2): a text longer than
# this many characters per token left is skipped without being counted.
_MAX_CHARS_PER_TOKEN = 4


@dataclass
class ContextItem:
    """One piece of injected experience, why it was chosen, and what it cost."""

    kind: str  # best | attempt | failure | insight
    id: str  # the stable id of the attempt or insight
    task: str  # the task key it belongs to ("" for insights)
    score: float
    level: str  # full | summary | line
    tokens: int
    why: str
    text: str


@dataclass
class Context:
    """The rendered context for one task under a token budget."""

    task: str
    budget_tokens: int
    tokens: int  # what the text costs: exact, or an upper bound for a subadditive counter
    counter: str
    text: str
    items: list[ContextItem] = field(default_factory=list)
    considered: int = 0  # candidates scored

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def explain(self) -> str:
        """One line per item: score, level, tokens and why (for people and the CLI)."""
        lines = [
            f"context for {self.task}: {self.tokens}/{self.budget_tokens} tokens "
            f"({self.counter}), {len(self.items)} items of {self.considered} candidates"
        ]
        for item in self.items:
            lines.append(
                f"  {item.score:7.4f}  {item.kind:8s} {item.level:7s} {item.tokens:5d} tok  "
                f"{item.id}  {item.why}"
            )
        return "\n".join(lines)


@dataclass
class _Candidate:
    row: int
    task_row: int
    kind: str
    score: float
    why: str | tuple[float, bool, float, float, float, int]  # text, or the parts of the score
    dhash: int = 0


def retrieve(
    store: ExperienceStore,
    task: str | TaskRecord,
    budget_tokens: int,
    *,
    counter: TokenCounter | None = None,
    max_tasks: int = 24,
    min_failures: int = 2,
    full_kernels: int = 2,
    min_insights: int = 2,
    max_insights: int = 6,
    max_items: int = 64,
    half_life_days: float = 30.0,
    now: float | None = None,
) -> Context:
    """The experience of `task` (a key in the store, or a record not yet stored) packed
    under `budget_tokens` tokens as counted by `counter` (default: the offline estimator)."""
    counter = counter or default_counter()
    record = store.task(task) if isinstance(task, str) else task
    if record is None:
        raise KeyError(f"no task {task!r} in {store.root}; `kope memory stats` lists the store")
    feats = features(record.op, record.inputs, record.outputs, record.target, record.hardware)
    table = store.task_table()
    dist = distances(feats, store.codes_for(feats), table) if len(table["row"]) else np.empty(0)
    task_rows, task_dist = _nearest(store, table["row"], dist, max_tasks)
    self_row = store.row_of(record.key)
    hops = _hops(store, self_row) if self_row is not None else {}
    candidates = _score_attempts(store, task_rows, task_dist, hops, half_life_days, now)
    packer = _Packer(store, counter, budget_tokens, record)
    best = winner(store.attempts(record.key)).best if self_row is not None else None
    best_row = store.row_of(best.id) if best is not None else None
    if best is not None and best.source == SOURCE_AGENT and best_row is not None:
        packer.add(
            _Candidate(
                best_row,
                self_row or 0,
                "best",
                1.0,
                "best known kernel of this task",
                decision_hash(best.decision),
            ),
            LEVELS,
        )
    failures = [c for c in candidates if c.kind == "failure"]
    for c in itertools.islice((c for c in failures if not packer.repeats(c.row)), min_failures):
        packer.add(c, ("summary", "line"))
    insights = _score_insights(store, feats.family, feats.dtype)
    for c in insights[:min_insights]:
        packer.add(c, ("summary", "line"))
    for c in failures[min_failures:]:
        c.score *= FAILURE_WEIGHT  # beyond the quota a failure teaches less than a success
    rest = [c for c in candidates + insights[:max_insights] if not packer.has(c.row)]
    heap = [(-c.score, store.id_of(c.row), i) for i, c in enumerate(rest)]
    heapq.heapify(heap)
    full_left, misses = full_kernels, 0
    # Lazy greedy: penalties only lower scores, so a popped item whose penalised score still
    # beats the next stale score is the true maximum.
    while heap and len(packer.items) < max_items and misses < 16 and not packer.full():
        _, key, i = heapq.heappop(heap)
        c = rest[i]
        score = c.score * packer.penalty(c)
        if heap and score < -heap[0][0]:
            heapq.heappush(heap, (-score, key, i))
            continue
        if packer.repeats(c.row):
            continue
        chosen = _Candidate(c.row, c.task_row, c.kind, score, c.why, c.dhash)
        levels = LEVELS if full_left > 0 and c.kind == "attempt" else LEVELS[1:]
        level = packer.add(chosen, levels)
        misses = 0 if level else misses + 1
        full_left -= level == "full"
    context = packer.finish()
    context.considered = len(candidates) + len(insights)
    return context


def _nearest(
    store: ExperienceStore, rows: np.ndarray, dist: np.ndarray, k: int
) -> tuple[list[int], list[float]]:
    """The k tasks of the op's family nearest by distance, ties broken by key."""
    inside = np.flatnonzero(dist < W_FAMILY)
    if not len(inside):
        return [], []
    order = inside[np.argsort(dist[inside], kind="stable")]
    cutoff = dist[order[min(k, len(order)) - 1]]
    chosen = [int(i) for i in order if dist[i] <= cutoff]
    chosen.sort(key=lambda i: (float(dist[i]), store.id_of(int(rows[i]))))
    chosen = chosen[:k]
    return [int(rows[i]) for i in chosen], [float(dist[i]) for i in chosen]


def _hops(store: ExperienceStore, start: int, depth: int = 3, cap: int = 4000) -> dict[int, int]:
    """Hops from a task node over non-insight nodes, undirected, up to `depth`."""
    graph = store.graph
    seen = {start: 0}
    frontier = [start]
    for hop in range(1, depth + 1):
        nxt = []
        for node in frontier:
            for other in graph.neighbors_undirected(node):
                if other not in seen and store.kind_of(other) != INSIGHT:
                    seen[other] = hop
                    nxt.append(other)
            if len(seen) > cap:
                return seen
        frontier = nxt
    return seen


def _score_attempts(
    store: ExperienceStore,
    task_rows: list[int],
    task_dist: list[float],
    hops: dict[int, int],
    half_life_days: float,
    now: float | None,
) -> list[_Candidate]:
    per_task = [store.attempt_rows(t) for t in task_rows]
    counts = np.array([len(found) for found in per_task], dtype=np.int64)
    if not counts.sum():
        return []
    rows = [r for found in per_task for r in found]
    owner = np.repeat(np.asarray(task_rows, dtype=np.int64), counts)
    dist = np.repeat(np.asarray(task_dist), counts)
    hot = store.hot(rows)
    latency = hot["latency"]
    verified = (hot["verdict"] == VERDICTS.index("verified")) & np.isfinite(latency) & (latency > 0)
    # Quality is normalised per task: the task's best verified latency over this one's.
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[counts > 0]
    best = np.minimum.reduceat(np.where(verified, latency, np.inf), starts)
    quality = np.where(
        verified, np.repeat(best, counts[counts > 0]) / np.where(verified, latency, 1.0), 0.0
    )
    newest = float(np.max(hot["created"])) if now is None else now
    recency = 0.25 + 0.75 * 0.5 ** (
        np.maximum(0.0, newest - hot["created"]) / (half_life_days * 86400.0)
    )
    hop = np.array([hops.get(r, 0) for r in rows], dtype=np.float64)
    proximity = np.where(hop > 0, 1.0 + 0.5 / np.maximum(hop, 1.0), 1.0)
    relevance = np.exp(-dist / 2.0)
    score = relevance * recency * proximity * np.where(verified, 0.25 + 0.75 * quality, 1.0)
    own = {t for t in task_rows if hops.get(t) == 0}
    out = [
        _Candidate(
            rows[i],
            int(owner[i]),
            "attempt" if verified[i] else "failure",
            float(score[i]),
            (
                float(dist[i]),
                int(owner[i]) in own,
                float(quality[i]),
                float(recency[i]),
                float(proximity[i]),
                int(hot["verdict"][i]),
            ),
            int(hot["dhash"][i]),
        )
        # Eager baselines and the reference lowering carry no lesson of their own.
        for i in np.flatnonzero(hot["source"] == _AGENT).tolist()
    ]
    out.sort(key=lambda c: (-c.score, store.id_of(c.row)))
    return _distinct_failures(out)


def _why(c: _Candidate) -> str:
    """Why an attempt was chosen, from the parts of its score."""
    if isinstance(c.why, str):
        return c.why
    d, own, quality, recency, proximity, verdict = c.why
    where = "this task" if own else f"similar task (distance {d:.2f})"
    if c.kind == "attempt":
        return (
            f"{where}; verified, {quality:.2f} of its task's best latency; "
            f"recency {recency:.2f}; graph x{proximity:.2f}"
        )
    name = VERDICTS[verdict] if 0 <= verdict < len(VERDICTS) else "failed"
    return f"instructive failure ({name}) on {where}; recency {recency:.2f}"


def _distinct_failures(candidates: list[_Candidate]) -> list[_Candidate]:
    """Failures with a decision already failed above them move to the end: one lesson each."""
    seen: set[int] = set()
    first, later = [], []
    for c in candidates:
        if c.kind == "failure" and c.dhash in seen:
            later.append(c)
            continue
        if c.kind == "failure":
            seen.add(c.dhash)
        first.append(c)
    return first + later


def _score_insights(store: ExperienceStore, family: str, dtype: str) -> list[_Candidate]:
    out = []
    for insight in store.insights():
        if insight.family != family:
            continue
        match = 1.0 if insight.dtype == dtype else 0.5
        score = insight.weight * match * (1.0 - 1.0 / (2.0 + insight.support + insight.contradict))
        row = store.row_of(insight.id)
        why = (
            f"insight on {insight.family} ({insight.dtype}): weight {insight.weight:.2f}, "
            f"{insight.support} supporting, {insight.contradict} contradicting"
        )
        out.append(_Candidate(row if row is not None else -1, -1, "insight", score, why))
    out.sort(key=lambda c: (-c.score, store.id_of(c.row)))
    return out


class _Packer:
    """Adds rendered items while the budget allows, richest level first."""

    def __init__(
        self, store: ExperienceStore, counter: TokenCounter, budget: int, task: TaskRecord
    ):
        self.store, self.counter, self.budget, self.task = store, counter, budget, task
        self.header = f"# Experience for {task.label} ({task.op}, target {task.target})"
        self.used = counter.count(self.header) + 1
        self.items: list[ContextItem] = []
        self._rows: set[int] = set()
        self._decisions: dict[int, int] = {}
        self._tasks: dict[int, int] = {}
        self._kernels: set[tuple[str, str]] = set()
        self._read: dict[int, Any] = {}
        self._texts: dict[str, str] = {}  # reference lowerings by digest

    def has(self, row: int) -> bool:
        return row in self._rows

    def repeats(self, row: int) -> bool:
        """Whether an attempt's kernel was already shown for its task: a model that sends the
        same text again learns nothing from seeing it, or its line, twice."""
        kernel = self._kernel(row)
        return kernel is not None and kernel in self._kernels

    def _record(self, row: int) -> Any:
        if row not in self._read:
            self._read[row] = self.store.record_at(row)
        return self._read[row]

    def _kernel(self, row: int) -> tuple[str, str] | None:
        """(task, kernel) naming an attempt's kernel text: every copy of its task's reference
        lowering is one kernel, whatever whitespace the model sent back; None without one."""
        record = self._record(row)
        if not isinstance(record, AttemptRecord) or not record.artifact:
            return None
        return record.task, REFERENCE if self._unchanged(record) else record.artifact

    def _unchanged(self, record: AttemptRecord) -> bool:
        """Whether an attempt's kernel text is its task's reference lowering, unchanged."""
        owner = self.store.task(record.task)
        if owner is None or not owner.payload or not record.artifact:
            return False
        if record.artifact == owner.payload:
            return True
        if owner.payload not in self._texts:
            self._texts[owner.payload] = (self.store.get_artifact(owner.payload) or "").strip()
        reference = self._texts[owner.payload]
        code = self.store.get_artifact(record.artifact)
        return bool(reference) and code is not None and code.strip() == reference

    def full(self) -> bool:
        return self.used >= self.budget - 4

    def penalty(self, c: _Candidate) -> float:
        """Diversity: each item already shown with the same decision halves a score, each
        from the same task multiplies it by 0.8."""
        same_decision = self._decisions.get(c.dhash, 0) if c.dhash else 0
        return 0.5**same_decision * 0.8 ** self._tasks.get(c.task_row, 0)

    def add(self, c: _Candidate, levels: tuple[str, ...]) -> str | None:
        """Render `c` at the first of `levels` that fits; returns the level used."""
        record = self._record(c.row)
        kernel = self._kernel(c.row)
        unchanged = kernel is not None and kernel[1] == REFERENCE
        if unchanged:
            levels = tuple(level for level in levels if level != "full")
        for level in levels:
            text = _render(self.store, record, level, c.kind, self.task, unchanged)
            if text is None:
                continue
            if len(text) > _MAX_CHARS_PER_TOKEN * (self.budget - self.used):
                continue  # cannot fit: no need to count it
            cost = self.counter.count(text) + 1  # +1 for the joining newline
            if self.used + cost <= self.budget:
                self.used += cost
                self.items.append(
                    ContextItem(
                        c.kind,
                        record.id,
                        getattr(record, "task", ""),
                        round(c.score, 6),
                        level,
                        cost,
                        _why(c),
                        text,
                    )
                )
                self._rows.add(c.row)
                if kernel is not None:
                    self._kernels.add(kernel)
                if c.dhash:
                    self._decisions[c.dhash] = self._decisions.get(c.dhash, 0) + 1
                self._tasks[c.task_row] = self._tasks.get(c.task_row, 0) + 1
                return level
        return None

    def finish(self) -> Context:
        items = list(self.items)
        text = self._join(items)
        if getattr(self.counter, "subadditive", False) and self.used <= self.budget:
            # The parts were counted with one token per joining newline: an upper bound, so
            # the text need not be counted again (its count is at most `tokens`).
            return Context(
                self.task.key,
                self.budget,
                self.used - 1 if text else 0,
                self.counter.name,
                text,
                items,
            )
        while items and self.counter.count(text) > self.budget:
            # Joining can merge whitespace differently than counting pieces apart did.
            items.remove(min(items, key=lambda i: i.score))
            text = self._join(items)
        if self.counter.count(text) > self.budget:
            text, items = "", []
        return Context(
            self.task.key,
            self.budget,
            self.counter.count(text) if text else 0,
            self.counter.name,
            text,
            items,
        )

    def _join(self, items: list[ContextItem]) -> str:
        return "\n".join([self.header] + [i.text for i in items]) if items else ""


def _render(
    store: ExperienceStore,
    record: Any,
    level: str,
    kind: str,
    task: TaskRecord,
    unchanged: bool = False,
) -> str | None:
    if isinstance(record, InsightRecord):
        if level == "summary":
            counts = f"{record.support}+/{record.contradict}-"
            return f"- insight (weight {record.weight:.2f}, {counts}): {record.text}"
        return f"- insight: {record.text}" if level == "line" else None
    if not isinstance(record, AttemptRecord):
        return None
    owner = store.task(record.task)
    label = owner.label if owner is not None else record.task[:12]
    decision = record.decision or "(no decision recorded)"
    if unchanged:
        decision += " (its kernel: the reference lowering, unchanged)"
    outcome = _outcome(record)
    if level == "full":
        if not record.artifact:
            return None
        code = store.get_artifact(record.artifact)
        if code is None:
            return None
        title = "Best known kernel of this task" if kind == "best" else f"Kernel of {label}"
        return f"## {title}: {decision} ({outcome})\n```mlir\n{code.rstrip()}\n```"
    if level == "summary":
        extra = f"; parent {record.parent[:16]}" if record.parent else ""
        who = f"{record.agent}/{record.model}".strip("/") or record.source
        return f"- {label}: {decision} -> {outcome} [{who}{extra}]"
    return f"- {decision} on {label}: {_short(record)}"


def _outcome(a: AttemptRecord) -> str:
    if a.verdict != "verified":
        first = (a.error or "").strip().splitlines()[0][:160] if a.error else ""
        return f"{a.verdict}: {first}" if first else a.verdict
    parts = ["verified"]
    if a.latency_us is not None:
        parts.append(f"{a.latency_us:.1f} us")
    if a.speedup_vs_eager is not None:
        parts.append(f"{a.speedup_vs_eager:.2f}x vs eager")
    if a.speedup_vs_reference is not None:
        parts.append(f"{a.speedup_vs_reference:.1f}x vs reference")
    if a.latency_us is not None and a.timing_quality == TIMING_CONTAMINATED:
        parts.append("timed under load (contaminated)")
    return ", ".join(parts)


def _short(a: AttemptRecord) -> str:
    if a.verdict != "verified":
        return a.verdict
    if a.speedup_vs_eager is None:
        return "verified"
    mark = "~" if a.timing_quality == TIMING_CONTAMINATED else ""  # a figure not to trust
    return f"{mark}{a.speedup_vs_eager:.2f}x"


def dumps(context: Context) -> str:
    """The context as JSON (for `kope memory context --json` and logs)."""
    return json.dumps(context.to_json(), indent=2, sort_keys=True)
