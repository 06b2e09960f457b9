"""The experience store: a rustworkx graph of tasks and attempts, durable in a record log.

Every write goes to the log first (durable on return) and then to the in-memory graph; opening
the store replays the log. Several processes may share one store: each appends under a lock
and `refresh()` picks up what the others wrote. Kernel texts live beside the log in a
content-addressed artifact directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import rustworkx as rx

from kope.memory.log import RecordLog
from kope.memory.schema import (
    HAS_ATTEMPT,
    SOURCE_EAGER,
    AttemptRecord,
    EdgeRecord,
    TaskRecord,
    from_json,
    to_json,
)

log = logging.getLogger("kope.memory")

LOG_NAME = "experience.log"
VERIFIED = "verified"


class ExperienceStore:
    """Tasks, attempts and their edges on one directory."""

    def __init__(self, root: Path | str):
        self.root = Path(root).expanduser()
        self.root.mkdir(parents=True, exist_ok=True)
        self.log = RecordLog(self.root / LOG_NAME)
        self.graph: rx.PyDiGraph = rx.PyDiGraph(multigraph=False)
        self._index: dict[str, int] = {}
        self._offset = 0
        self._skipped = 0
        self.refresh()

    # -- reading -----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Replay what was appended (by any process) since the last read."""
        records, self._offset = self.log.read_from(self._offset)
        for data in records:
            try:
                self._apply(from_json(data))
            except (ValueError, TypeError, KeyError) as err:
                self._skipped += 1
                log.warning("%s: ignoring a record (%s); it will be rebuilt if needed", self.log.path, err)

    def _apply(self, record: Any) -> None:
        if isinstance(record, EdgeRecord):
            src, dst = self._index.get(record.src), self._index.get(record.dst)
            if src is not None and dst is not None:
                self.graph.add_edge(src, dst, record.kind)
            return
        if record.id in self._index:
            self.graph[self._index[record.id]] = record
            return
        self._index[record.id] = self.graph.add_node(record)
        if isinstance(record, AttemptRecord) and record.task in self._index:
            self.graph.add_edge(self._index[record.task], self._index[record.id], HAS_ATTEMPT)

    def task(self, key: str) -> TaskRecord | None:
        index = self._index.get(key)
        node = self.graph[index] if index is not None else None
        return node if isinstance(node, TaskRecord) else None

    def tasks(self) -> list[TaskRecord]:
        return [n for n in self.graph.nodes() if isinstance(n, TaskRecord)]

    def attempts(self, key: str) -> list[AttemptRecord]:
        """The attempts of task `key`, oldest first."""
        index = self._index.get(key)
        if index is None:
            return []
        found = [
            self.graph[child]
            for child in self.graph.successor_indices(index)
            if isinstance(self.graph[child], AttemptRecord)
        ]
        return sorted(found, key=lambda a: a.created)

    def best(self, key: str) -> AttemptRecord | None:
        """The verified attempt with the highest speedup over eager (eager itself counts as 1)."""
        verified = [a for a in self.attempts(key) if a.verdict == VERIFIED]
        if not verified:
            return None
        return max(verified, key=_speedup)

    def stats(self) -> dict[str, int]:
        attempts = [n for n in self.graph.nodes() if isinstance(n, AttemptRecord)]
        return {
            "tasks": len(self.tasks()),
            "attempts": len(attempts),
            "verified": sum(1 for a in attempts if a.verdict == VERIFIED),
            "skipped_records": self._skipped,
        }

    # -- writing -----------------------------------------------------------------------------
    def add_task(self, task: TaskRecord) -> TaskRecord:
        """Record a task once; returns the stored record."""
        existing = self.task(task.key)
        if existing is not None:
            return existing
        self._write([task])
        return task

    def add_attempt(self, attempt: AttemptRecord, artifact: str | None = None) -> AttemptRecord:
        """Record an attempt (its kernel text stored first, by content hash)."""
        if attempt.task not in self._index:
            raise KeyError(f"attempt for unknown task {attempt.task}; add the task first")
        if artifact is not None:
            attempt.artifact = self.put_artifact(artifact)
        self._write([attempt])
        return attempt

    def add_edge(self, src: str, dst: str, kind: str) -> None:
        self._write([EdgeRecord(src, dst, kind)])

    def _write(self, records: Iterable[Any]) -> None:
        records = list(records)
        self.log.append(to_json(r) for r in records)
        self.refresh()  # applies ours and anything another process appended meanwhile

    # -- artifacts ---------------------------------------------------------------------------
    def artifact_path(self, digest: str) -> Path:
        return self.root / "artifacts" / digest[:2] / f"{digest}.mlir"

    def put_artifact(self, text: str) -> str:
        data = text.encode()
        digest = hashlib.sha256(data).hexdigest()
        path = self.artifact_path(digest)
        if path.exists():
            return digest
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest

    def get_artifact(self, digest: str) -> str | None:
        """The kernel text, or None if missing or damaged (its hash no longer matches)."""
        path = self.artifact_path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if hashlib.sha256(data).hexdigest() != digest:
            log.warning("artifact %s is damaged; ignoring it", path)
            return None
        return data.decode()

    def close(self) -> None:
        self.log.close()


def _speedup(attempt: AttemptRecord) -> float:
    if attempt.source == SOURCE_EAGER:
        return 1.0
    return attempt.speedup_vs_eager or 0.0
