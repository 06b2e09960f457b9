"""Merging experience stores: what several machines learned, in one graph.

`merge_stores(sources, into)` copies every task, attempt, insight and edge of each source that
`into` lacks, with its id kept, and the kernel texts and reference lowerings (artifacts) those
records name. Sources are only read. Everything goes through the store's own append path in
batches, in an order `into` can apply as it reads: per batch the artifacts first (flushed
together), then the records; tasks before attempts, an attempt after the attempts it names
(parent, transferred_from, confirms, whose edges are implied by its fields), insights, and last
the edges written on their own. A merge killed at any point leaves `into` loadable with a
prefix of that sequence, and running it again completes it: records already there are skipped.

A record whose id `into` already holds with other content is a conflict: `into` keeps its own
and the report names the id and the differing fields; edges that touch it are not copied.
What a record's content is depends on its kind. A task's key is the operator and target, so
when each machine first saw it (`created`) is not content. An insight's id is its lesson
(family, dtype, decision) and its counts are derived from its `supports` / `contradicts`
edges, so after the edges are merged it is recounted from them (as `distil_insights` does)
rather than reported.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kope.memory.insights import _recount
from kope.memory.schema import (
    HAS_ATTEMPT,
    AttemptRecord,
    EdgeRecord,
    InsightRecord,
    TaskRecord,
    to_json,
    type_name,
)
from kope.memory.store import LOG_NAME, SNAPSHOT_NAME, ExperienceStore

log = logging.getLogger("kope.memory")

KINDS = ("task", "attempt", "insight", "edge", "artifact")
"""What a merge counts, in the order reports list them."""

BATCH = 5000
"""Records per append: one write and one fsync each."""

# Fields that are not a record's content when two machines hold the same id (module doc).
_NOT_CONTENT = {
    "task": {"created"},
    "insight": {
        "text",
        "support",
        "contradict",
        "weight",
        "best_speedup",
        "best_attempt",
        "created",
        "updated",
    },
}


class MergeError(ValueError):
    """A source that cannot be merged (the message says why and what to do)."""


@dataclass
class Conflict:
    """A record both stores hold under one id with different content: `into` keeps its own."""

    id: str
    kind: str  # the source record's type: task, attempt or insight
    fields: list[str]  # the fields that differ ("type" when the two are of different types)


@dataclass
class SourceReport:
    """What merging one source did, per kind (`KINDS`)."""

    source: Path
    added: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    present: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    conflicts: list[Conflict] = field(default_factory=list)
    edges_skipped: int = 0  # edges with an end in conflict (or missing from both stores)
    artifacts_missing: int = 0  # named by a copied record but pruned or damaged in the source
    insights_recounted: int = 0

    def conflicts_of(self, kind: str) -> int:
        return sum(1 for c in self.conflicts if c.kind == kind)


@dataclass
class MergeReport:
    """What a merge did, one report per source in the order given."""

    into: Path
    sources: list[SourceReport]

    @property
    def conflicts(self) -> list[Conflict]:
        return [c for s in self.sources for c in s.conflicts]

    @property
    def added(self) -> int:
        """Records and edges added over all sources (artifacts not counted)."""
        return sum(s.added[k] for s in self.sources for k in KINDS if k != "artifact")


def check_sources(sources: Iterable[Path], into: Path | None) -> list[Path]:
    """The sources as paths, after checking that each is an existing store other than `into`
    (None: merged later into stores not known yet); MergeError otherwise (before anything is
    opened or written)."""
    checked = []
    for source in sources:
        path = Path(source).expanduser()
        if not (path / LOG_NAME).is_file() and not (path / SNAPSHOT_NAME).is_file():
            raise MergeError(
                f"{path} is not an experience store (no {LOG_NAME} in it); "
                "give the directory a store lives in (its $KOPE_HOME)"
            )
        if into is not None and _same_directory(path, Path(into).expanduser()):
            raise MergeError(
                f"{path} is the store being merged into; a store cannot be merged into itself "
                "(give another --into)"
            )
        checked.append(path)
    return checked


def merge_stores(sources: list[Path], into: ExperienceStore, *, batch: int = BATCH) -> MergeReport:
    """Copy what each source holds and `into` lacks into `into` (module doc); returns what
    was added, what was there already and what conflicts, per source."""
    paths = check_sources(sources, into.root)
    reports = []
    for path in paths:
        # Opened only to read: never compacted (that would write a snapshot into it).
        source = ExperienceStore(path, compact_after=sys.maxsize)
        try:
            reports.append(_merge_one(source, into, batch))
        finally:
            source.close()
    report = MergeReport(into.root, reports)
    if report.added >= into.compact_after:
        into.compact(only_if_free=True)  # once, so that the next open skips the merged tail
    return report


def _merge_one(source: ExperienceStore, into: ExperienceStore, batch: int) -> SourceReport:
    report = SourceReport(source.root)
    into.refresh()
    new, shared_insights, conflicting = _sort_out(source, into, report)
    edges = list(source.iter_edges())
    had = [into.has_edge(s, d, k) for s, d, k in edges]
    report.present["edge"] = sum(had)
    seen: set[str] = set()
    for start in range(0, len(new), batch):
        chunk = new[start : start + batch]
        _copy_artifacts(source, into, chunk, seen, report)
        into.add_records(chunk)
    for record in new:
        report.added[type_name(record)] += 1
    _merge_edges(
        into,
        [e for e, there in zip(edges, had, strict=True) if not there],
        conflicting,
        batch,
        report,
    )
    insights = [*shared_insights, *(r.id for r in new if isinstance(r, InsightRecord))]
    recounted = [r for r in (_recounted(into, i) for i in insights) if r is not None]
    if recounted:
        into.add_records(recounted)
    report.insights_recounted = len(recounted)
    log.info(
        "merged %s into %s: %s added, %d conflicts",
        source.root,
        into.root,
        report.added,
        len(report.conflicts),
    )
    return report


def _sort_out(
    source: ExperienceStore, into: ExperienceStore, report: SourceReport
) -> tuple[list[Any], list[str], set[str]]:
    """The source's records `into` lacks, in the order to write them (tasks, attempts after
    those they name, insights); the ids of the insights both hold; the ids in conflict.
    Counts what is present and reports the conflicts."""
    tasks: list[TaskRecord] = []
    attempts: dict[str, AttemptRecord] = {}
    insights: list[InsightRecord] = []
    shared: list[str] = []
    conflicting: set[str] = set()
    for record in source.iter_records():
        existing = into.record(record.id)
        if existing is None:
            if isinstance(record, TaskRecord):
                tasks.append(record)
            elif isinstance(record, AttemptRecord):
                attempts[record.id] = record
            else:
                insights.append(record)
            continue
        differ = [] if record == existing else _differing(record, existing)
        if differ:
            report.conflicts.append(Conflict(record.id, type_name(record), differ))
            conflicting.add(record.id)
            continue
        report.present[type_name(record)] += 1
        if isinstance(record, InsightRecord):
            shared.append(record.id)
    ordered: list[Any] = sorted(tasks, key=lambda t: (t.created, t.key))
    ordered += _in_order(attempts)
    ordered += sorted(insights, key=lambda i: i.id)
    return ordered, shared, conflicting


def _merge_edges(
    into: ExperienceStore,
    missing: list[tuple[str, str, str]],
    conflicting: set[str],
    batch: int,
    report: SourceReport,
) -> None:
    """Write the source edges `into` lacked that the records just written did not imply,
    unless an end is in conflict (or it is an attempt's link to its task, always implied)."""
    explicit = []
    for src, dst, kind in missing:
        if into.has_edge(src, dst, kind):
            report.added["edge"] += 1
        elif (
            kind == HAS_ATTEMPT
            or src in conflicting
            or dst in conflicting
            or into.row_of(src) is None
            or into.row_of(dst) is None
        ):
            report.edges_skipped += 1
        else:
            explicit.append(EdgeRecord(src, dst, kind))
    for start in range(0, len(explicit), batch):
        into.add_records(explicit[start : start + batch])
    report.added["edge"] += len(explicit)


def _differing(record: Any, existing: Any) -> list[str]:
    """The fields in which two records of one id differ, beyond those that are not content."""
    ours, theirs = to_json(record), to_json(existing)
    ignored = _NOT_CONTENT.get(type_name(record), set()) | {"v"}
    differ = [
        name
        for name in sorted(ours.keys() | theirs.keys())
        if name not in ignored and not _same(ours.get(name), theirs.get(name))
    ]
    return ["type" if name == "t" else name for name in differ]


def _same(a: Any, b: Any) -> bool:
    # Compared as stored: NaN equals NaN, as it does in the log.
    return bool(a == b) or json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _in_order(attempts: dict[str, AttemptRecord]) -> list[AttemptRecord]:
    """The attempts, oldest first, each moved after the attempts it names among them, so that
    the store links it to them as it applies it (a cycle, which ids make impossible, is cut)."""
    placed: set[str] = set()
    visiting: set[str] = set()
    ordered: list[AttemptRecord] = []
    for first in sorted(attempts.values(), key=lambda a: (a.created, a.id)):
        stack = [first]
        while stack:
            attempt = stack[-1]
            if attempt.id in placed:
                stack.pop()
                continue
            visiting.add(attempt.id)
            before = [
                attempts[other]
                for other in _named(attempt)
                if other in attempts and other not in placed and other not in visiting
            ]
            if before:
                stack.extend(before)
                continue
            stack.pop()
            visiting.discard(attempt.id)
            placed.add(attempt.id)
            ordered.append(attempt)
    return ordered


def _named(attempt: AttemptRecord) -> Iterator[str]:
    for other in (attempt.parent, attempt.transferred_from, attempt.confirms):
        if other:
            yield other


def _copy_artifacts(
    source: ExperienceStore,
    into: ExperienceStore,
    records: list[Any],
    seen: set[str],
    report: SourceReport,
) -> None:
    """Copy the artifacts `records` name that `into` lacks, flushed to disk before the records
    that name them are written (one flush for all, as `add_records` does); `seen` holds the
    digests already counted for this source."""
    digests: set[str] = set()
    for record in records:
        if isinstance(record, AttemptRecord) and record.artifact:
            digests.add(record.artifact)
        elif isinstance(record, TaskRecord) and record.payload:
            digests.add(record.payload)
    copied = 0
    for digest in sorted(digests - seen):
        seen.add(digest)
        if into.artifact_path(digest).exists():
            report.present["artifact"] += 1
            continue
        text = source.get_artifact(digest)
        if text is None:
            report.artifacts_missing += 1
            continue
        into.put_artifact(text, sync=False)
        copied += 1
    if copied:
        os.sync()
    report.added["artifact"] += copied


def _recounted(into: ExperienceStore, insight_id: str) -> InsightRecord | None:
    """The insight recounted from its edges in `into`, or None if its counts stand."""
    existing = into.record(insight_id)
    if not isinstance(existing, InsightRecord):
        return None
    fresh = _recount(
        into, insight_id, existing.family, existing.dtype, existing.decision, existing, []
    )
    return None if fresh is existing else fresh


def _same_directory(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except FileNotFoundError:
        return a.resolve() == b.resolve()
