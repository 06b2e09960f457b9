"""The experience store: a rustworkx graph of tasks, attempts and insights, durable in a log.

Every write goes to the record log first (durable on return, see `log.py`) and then to
memory; opening the store replays the log. Several processes may share one store: each
appends under a lock and `refresh()` picks up what the others wrote. Kernel texts live beside
the log in a content-addressed artifact directory and are read only when asked for.

Large stores open fast because memory holds few Python objects: each node is a row of a few
"hot" columns (kind, task, verdict, source, speedup, latency, time, decision hash, and where
its record lies in the log), and a record is decoded from the log only when asked for.
Rows up to a snapshot (`snapshot.py`) are memory-mapped numpy arrays; rows after it are
Python lists filled by replaying the log's tail. A process that replays a long tail writes a
new snapshot (atomically; the log stays the truth, and a snapshot that does not match the log
is ignored). Rows are internal; records and edges name nodes by their stable string ids.

The store records and answers queries; it never decides which kernel runs. That is the rule
of `kope.memory.standing`, over the attempts the store returns, which the store never calls.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import os
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import rustworkx as rx
from filelock import FileLock

from kope.memory import snapshot
from kope.memory.log import RecordLog
from kope.memory.schema import (
    CONFIRMS,
    EDGE_KINDS,
    HAS_ATTEMPT,
    REFINES,
    SCHEMA_VERSION,
    TRANSFERRED_FROM,
    AttemptRecord,
    EdgeRecord,
    InsightRecord,
    TaskRecord,
    from_json,
    to_json,
)
from kope.memory.similarity import SHAPE_DIMS, Features, decision_hash, features
from kope.vocabulary.evidence import (
    SOURCE_EAGER,
    SOURCES,
    VERDICTS,
)

log = logging.getLogger("kope.memory")
LOG_NAME = "experience.log"
SNAPSHOT_NAME = "snapshot.kope"
TASK, ATTEMPT, INSIGHT = 0, 1, 2
# Hot columns of every row: name -> numpy dtype.
HOT = {
    "kind": "i1",
    "task": "i4",
    "verdict": "i1",
    "source": "i1",
    "speedup": "f8",
    "latency": "f8",
    "created": "f8",
    "dhash": "i8",
    "off": "i8",
    "len": "i4",
}
# Columns of the task table: name -> numpy dtype ("shape" is a matrix).
TASK_COLUMNS = {
    "row": "i4",
    "op": "i4",
    "family": "i4",
    "target": "i4",
    "dtype": "i4",
    "rank": "i1",
    "shape": "f4",
}
CODED = ("op", "family", "target", "dtype")
_KIND_CODE = {k: i for i, k in enumerate(EDGE_KINDS)}
_CACHE_LIMIT = 200_000


class StoreError(Exception):
    """The store's directory cannot serve: it is a file, or cannot be created or written."""


_WHERE = "give a directory you can write to (--store, options={'store': ...} or $KOPE_HOME)"


class ExperienceStore:
    """Tasks, attempts, insights and their edges on one directory.

    `compact_after`: a process that replays at least this many records of the log's tail
    when opening writes a fresh snapshot, so the next open skips them.
    """

    def __init__(self, root: Path | str, *, compact_after: int = 50_000):
        self.root = Path(root).expanduser()
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"the store {self.root} is a file, not a directory: {_WHERE}")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StoreError(
                f"cannot create the store directory {self.root} ({err.strerror}): {_WHERE}"
            ) from err
        self.log = RecordLog(self.root / LOG_NAME)
        self.compact_after = compact_after
        self._offset = 0
        self._skipped = 0
        self._nbase = 0
        self._base: dict[str, np.ndarray] = {n: np.empty(0, d) for n, d in HOT.items()}
        self._base_ids = np.empty(0, "S1")
        self._tbase = _empty_task_table()
        self._att_start = np.zeros(1, np.int64)
        self._att_rows = np.empty(0, np.int32)
        self._e_start = np.zeros(1, np.int64)
        self._e_dst = np.empty(0, np.int32)
        self._e_kind = np.empty(0, np.int8)
        self._codes: dict[str, dict[str, int]] = {c: {} for c in CODED}
        self._over_ids: list[str] = []
        self._over_row: dict[str, int] = {}
        self._hot: dict[str, list[Any]] = {n: [] for n in HOT}
        self._patch: dict[int, tuple[Any, ...]] = {}  # base rows re-recorded after the snapshot
        self._tover: dict[str, list[Any]] = {n: [] for n in TASK_COLUMNS}
        self._task_index: dict[int, int] = {}  # row -> index in the task table (overlay tasks)
        self._over_att: dict[int, list[int]] = {}  # task row -> overlay attempt rows
        self._over_edges: dict[int, list[tuple[int, int]]] = {}  # src -> [(dst, kind code)]
        self._edge_set: set[tuple[int, int, int]] = set()
        self._n_edges = 0
        self._counts = {"tasks": 0, "attempts": 0, "verified": 0, "insights": 0}
        self._insights: dict[int, InsightRecord] = {}
        self._cache: dict[int, Any] = {}
        self._table_cache: dict[str, np.ndarray] | None = None
        self._graph: rx.PyDiGraph | None = None
        self.snapshot_offset = 0
        self._load_snapshot()
        replayed = self.refresh()
        if replayed >= compact_after:
            self.compact(only_if_free=True)

    # -- reading -----------------------------------------------------------------------------
    def refresh(self) -> int:
        """Replay what was appended (by any process) since the last read; returns how many
        records that was."""
        count, more = 0, True
        while more:
            entries, self._offset, more = self.log.scan(self._offset)
            for off, length, data in entries:
                count += 1
                try:
                    self._apply(from_json(data), off, length)
                except (ValueError, TypeError, KeyError) as err:
                    self._skipped += 1
                    log.warning(
                        "%s: ignoring a record (%s); it will be rebuilt if needed",
                        self.log.path,
                        err,
                    )
        return count

    def row_of(self, record_id: str) -> int | None:
        """The internal row of a stable id (valid for this open store only)."""
        row = self._over_row.get(record_id)
        if row is not None or not self._nbase:
            return row
        key = record_id.encode()
        if len(key) > self._base_ids.dtype.itemsize:
            return None
        i = int(np.searchsorted(self._base_ids, key))
        return i if i < self._nbase and self._base_ids[i] == key else None

    def id_of(self, row: int) -> str:
        if row < self._nbase:
            return self._base_ids[row].decode()
        return self._over_ids[row - self._nbase]

    def record_at(self, row: int) -> Any:
        """The record of a row, decoded from the log on first use."""
        if row >= self._nbase or row in self._patch:
            cached = self._cache.get(row)
            if cached is None:
                off, length = int(self._hot_value(row, "off")), int(self._hot_value(row, "len"))
                cached = self._decode(off, length)
                self._remember(row, cached)
            return cached
        cached = self._cache.get(row)
        if cached is None:
            cached = self._decode(int(self._base["off"][row]), int(self._base["len"][row]))
            self._remember(row, cached)
        return cached

    def record(self, record_id: str) -> Any | None:
        """The task, attempt or insight with this id, or None."""
        row = self.row_of(record_id)
        return None if row is None else self.record_at(row)

    def task(self, key: str) -> TaskRecord | None:
        node = self.record(key)
        return node if isinstance(node, TaskRecord) else None

    def tasks(self) -> list[TaskRecord]:
        """Every task, oldest first."""
        rows = self.task_table()["row"].tolist()
        found = [self.record_at(r) for r in rows]
        return sorted(found, key=lambda t: (t.created, t.key))

    def attempt_rows(self, task_row: int) -> list[int]:
        """Rows of a task's attempts (snapshot part first, then later ones)."""
        rows: list[int] = []
        if task_row < self._nbase:
            i = int(np.searchsorted(self._tbase["row"], task_row))
            if i < len(self._tbase["row"]) and self._tbase["row"][i] == task_row:
                rows = self._att_rows[self._att_start[i] : self._att_start[i + 1]].tolist()
        return rows + self._over_att.get(task_row, [])

    def attempts(self, key: str) -> list[AttemptRecord]:
        """The attempts of task `key`, oldest first."""
        row = self.row_of(key)
        if row is None:
            return []
        found = [self.record_at(r) for r in self.attempt_rows(row)]
        return sorted(found, key=lambda a: a.created)

    def tasks_with_workload(self, workload: str, hardware: str) -> list[TaskRecord]:
        """The tasks of the same workload on the same hardware (any target key), newest first:
        where a task measured under an older KOPE or torch keeps its experience."""
        found = [t for t in self.tasks() if t.workload == workload and t.hardware == hardware]
        return sorted(found, key=lambda t: -t.created)

    def insights(self) -> list[InsightRecord]:
        """Every insight, heaviest first."""
        return sorted(self._insights.values(), key=lambda i: (-i.weight, -i.support, i.id))

    def edges_from(self, record_id: str, kind: str | None = None) -> list[tuple[str, str]]:
        """(destination id, kind) of the edges leaving a node, optionally of one kind."""
        row = self.row_of(record_id)
        if row is None:
            return []
        return [
            (self.id_of(d), EDGE_KINDS[k])
            for d, k in self._out_edges(row)
            if kind is None or EDGE_KINDS[k] == kind
        ]

    def has_edge(self, src: str, dst: str, kind: str) -> bool:
        s, d = self.row_of(src), self.row_of(dst)
        return s is not None and d is not None and self._edge_exists(s, d, _KIND_CODE[kind])

    def stats(self) -> dict[str, int]:
        return {
            "tasks": self._counts["tasks"],
            "attempts": self._counts["attempts"],
            "verified": self._counts["verified"],
            "skipped_records": self._skipped + self.log.damaged,
        }

    def summary(self) -> dict[str, Any]:
        """Counts and sizes for people and `kope memory stats`."""
        snap = self.root / SNAPSHOT_NAME
        return {
            **self.stats(),
            "insights": self._counts["insights"],
            "edges": self._n_edges,
            "schema_version": SCHEMA_VERSION,
            "store": str(self.root),
            "log_bytes": self.log.size(),
            "snapshot_bytes": snap.stat().st_size if snap.exists() else 0,
            "snapshot_covers_bytes": self.snapshot_offset,
        }

    def rows(self) -> int:
        """How many nodes there are (rows are 0 .. rows() - 1)."""
        return self._nbase + len(self._over_ids)

    def rows_of_kind(self, kind: int) -> list[int]:
        """The rows of every TASK, ATTEMPT or INSIGHT."""
        base = np.flatnonzero(self._base["kind"] == kind).tolist()
        return base + [self._nbase + i for i, k in enumerate(self._hot["kind"]) if k == kind]

    def iter_records(self) -> Iterator[Any]:
        """Every node's record, in row order (decodes the whole log: for export)."""
        for row in range(self.rows()):
            yield self.record_at(row)

    def iter_edges(self) -> Iterator[tuple[str, str, str]]:
        """Every edge as (src id, dst id, kind)."""
        for row in range(self.rows()):
            for dst, kind in self._out_edges(row):
                yield self.id_of(row), self.id_of(dst), EDGE_KINDS[kind]

    @property
    def graph(self) -> rx.PyDiGraph:
        """The rustworkx graph: node i's payload is the stable id of row i, edge payloads are
        edge kinds. Built on first use and kept current after."""
        if self._graph is None:
            graph = rx.PyDiGraph(multigraph=True)
            graph.add_nodes_from([b.decode() for b in self._base_ids.tolist()] + self._over_ids)
            src = np.repeat(np.arange(self._nbase, dtype=np.int64), np.diff(self._e_start))
            kinds = np.array(EDGE_KINDS, dtype=object)
            graph.add_edges_from(
                list(
                    zip(
                        src.tolist(),
                        self._e_dst.tolist(),
                        kinds[self._e_kind].tolist(),
                        strict=True,
                    )
                )
            )
            graph.add_edges_from(
                [(s, d, EDGE_KINDS[k]) for s, out in self._over_edges.items() for d, k in out]
            )
            self._graph = graph
        return self._graph

    # -- what retrieval reads ----------------------------------------------------------------
    def task_table(self) -> dict[str, np.ndarray]:
        """Columns over every task: row, codes of op/family/target/dtype, rank, shape matrix."""
        if self._table_cache is None:
            table = {}
            for name, dtype in TASK_COLUMNS.items():
                over = np.asarray(self._tover[name], dtype=dtype)
                if name == "shape":
                    over = over.reshape(-1, self._tbase["shape"].shape[1])
                table[name] = np.concatenate([self._tbase[name], over])
            self._table_cache = table
        return self._table_cache

    def codes_for(self, f: Features) -> dict[str, int | None]:
        """The codes of a task's feature strings in this store (None where unseen)."""
        return {c: self._codes[c].get(getattr(f, c)) for c in CODED}

    def hot(self, rows: list[int]) -> dict[str, np.ndarray]:
        """Hot columns of the given rows, as arrays aligned with `rows`."""
        idx = np.asarray(rows, dtype=np.int64)
        out = {n: np.empty(len(rows), d) for n, d in HOT.items()}
        in_base = idx < self._nbase
        for name in HOT:
            out[name][in_base] = self._base[name][idx[in_base]]
        for i in np.flatnonzero(~in_base | np.isin(idx, list(self._patch))).tolist():
            for name, value in zip(HOT, self._hot_tuple(rows[i]), strict=True):
                out[name][i] = value
        return out

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
        if self.task(attempt.task) is None:
            raise KeyError(f"attempt for unknown task {attempt.task}; add the task first")
        if artifact is not None:
            attempt.artifact = self.put_artifact(artifact)
        self._write([attempt])
        return attempt

    def add_insight(self, insight: InsightRecord) -> InsightRecord:
        """Record an insight, or its new state (same id)."""
        self._write([insight])
        return insight

    def add_edge(self, src: str, dst: str, kind: str) -> None:
        """Record a typed edge between two known nodes."""
        if kind not in _KIND_CODE:
            raise ValueError(f"unknown edge kind {kind!r}; use one of {', '.join(EDGE_KINDS)}")
        for end in (src, dst):
            if self.row_of(end) is None:
                raise KeyError(f"edge {src} -> {dst}: no node {end}; record it first")
        self._write([EdgeRecord(src, dst, kind)])

    def add_records(self, records: list[Any], artifacts: dict[str, str] | None = None) -> None:
        """Append many records in one write and one fsync (bulk imports, benchmarks).

        `artifacts` maps an attempt id to its kernel text; the texts are written first and
        flushed to disk together before the records that name them.
        """
        if artifacts:
            by_id = {r.id: r for r in records if isinstance(r, AttemptRecord)}
            for attempt_id, text in artifacts.items():
                by_id[attempt_id].artifact = self.put_artifact(text, sync=False)
            os.sync()  # one flush for all of them instead of one fsync each
        self._write(records)

    def _check_writable(self) -> None:
        # Said before the first write fails deep in it (a read-only mount, another user's
        # directory): the records this process would add are what is lost, nothing recorded.
        if not os.access(self.root, os.W_OK):
            raise StoreError(f"the store {self.root} is not writable: {_WHERE}")

    def _write(self, records: Iterable[Any]) -> None:
        self._check_writable()
        self.log.append(to_json(r) for r in records)
        self.refresh()  # applies ours and anything another process appended meanwhile

    # -- applying records --------------------------------------------------------------------
    def _apply(self, record: Any, off: int, length: int) -> None:
        if isinstance(record, EdgeRecord):
            src, dst = self.row_of(record.src), self.row_of(record.dst)
            kind = _KIND_CODE.get(record.kind)
            if src is None or dst is None or kind is None:
                log.debug(
                    "dropping edge %s -> %s (%s): unknown end or kind",
                    record.src,
                    record.dst,
                    record.kind,
                )
                return
            self._add_edge(src, dst, kind)
            return
        hot = self._hot_of(record, off, length)
        row = self.row_of(record.id)
        if row is not None:  # a record re-recorded: the latest version wins
            self._count(self._hot_tuple(row), -1)
            if row < self._nbase:
                self._patch[row] = hot
            else:
                for name, value in zip(HOT, hot, strict=True):
                    self._hot[name][row - self._nbase] = value
        else:
            row = self._nbase + len(self._over_ids)
            self._over_ids.append(record.id)
            self._over_row[record.id] = row
            for name, value in zip(HOT, hot, strict=True):
                self._hot[name].append(value)
            if self._graph is not None:
                self._graph.add_node(record.id)
            if isinstance(record, TaskRecord):
                self._add_task_features(row, record)
        self._count(hot, +1)
        self._remember(row, record)
        if isinstance(record, InsightRecord):
            self._insights[row] = record
        elif isinstance(record, AttemptRecord):
            self._link_attempt(row, record)

    def _link_attempt(self, row: int, attempt: AttemptRecord) -> None:
        task = self.row_of(attempt.task)
        if task is not None and not self._edge_exists(task, row, _KIND_CODE[HAS_ATTEMPT]):
            if row >= self._nbase or task >= self._nbase:
                self._over_att.setdefault(task, []).append(row)
            self._add_edge(task, row, _KIND_CODE[HAS_ATTEMPT])
        for other, kind in (
            (attempt.parent, REFINES),
            (attempt.transferred_from, TRANSFERRED_FROM),
            (attempt.confirms, CONFIRMS),
        ):
            target = self.row_of(other) if other else None
            if target is not None:
                self._add_edge(row, target, _KIND_CODE[kind])

    def _add_edge(self, src: int, dst: int, kind: int) -> None:
        if self._edge_exists(src, dst, kind):
            return
        self._over_edges.setdefault(src, []).append((dst, kind))
        self._edge_set.add((src, dst, kind))
        self._n_edges += 1
        if self._graph is not None:
            self._graph.add_edge(src, dst, EDGE_KINDS[kind])

    def _edge_exists(self, src: int, dst: int, kind: int) -> bool:
        if (src, dst, kind) in self._edge_set:
            return True
        if src < self._nbase:
            lo, hi = self._e_start[src], self._e_start[src + 1]
            return bool(np.any((self._e_dst[lo:hi] == dst) & (self._e_kind[lo:hi] == kind)))
        return False

    def _out_edges(self, row: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        if row < self._nbase:
            lo, hi = self._e_start[row], self._e_start[row + 1]
            out = list(zip(self._e_dst[lo:hi].tolist(), self._e_kind[lo:hi].tolist(), strict=True))
        return out + self._over_edges.get(row, [])

    def _add_task_features(self, row: int, task: TaskRecord) -> None:
        f = features(task.op, task.inputs, task.outputs, task.target, task.hardware)
        self._task_index[row] = len(self._tbase["row"]) + len(self._tover["row"])
        self._tover["row"].append(row)
        for name in CODED:
            codes = self._codes[name]
            self._tover[name].append(codes.setdefault(getattr(f, name), len(codes)))
        self._tover["rank"].append(f.rank)
        self._tover["shape"].append(list(f.shape))
        self._table_cache = None

    def _hot_of(self, record: Any, off: int, length: int) -> tuple[Any, ...]:
        if isinstance(record, AttemptRecord):
            task = self.row_of(record.task)
            return (
                ATTEMPT,
                -1 if task is None else task,
                _code(VERDICTS, record.verdict),
                _code(SOURCES, record.source),
                _nan(1.0 if record.source == SOURCE_EAGER else record.speedup_vs_eager),
                _nan(record.latency_us),
                record.created,
                decision_hash(record.decision),
                off,
                length,
            )
        kind = TASK if isinstance(record, TaskRecord) else INSIGHT
        return (kind, -1, -1, -1, math.nan, math.nan, record.created, 0, off, length)

    def _hot_tuple(self, row: int) -> tuple[Any, ...]:
        if row >= self._nbase:
            i = row - self._nbase
            return tuple(self._hot[name][i] for name in HOT)
        if row in self._patch:
            return self._patch[row]
        return tuple(self._base[name][row].item() for name in HOT)

    def kind_of(self, row: int) -> int:
        """TASK, ATTEMPT or INSIGHT."""
        if row < self._nbase and row not in self._patch:
            return int(self._base["kind"][row])
        return int(self._hot_value(row, "kind"))

    def _hot_value(self, row: int, name: str) -> Any:
        return self._hot_tuple(row)[list(HOT).index(name)]

    def _count(self, hot: tuple[Any, ...], sign: int) -> None:
        kind, verdict = hot[0], hot[2]
        if kind == TASK:
            self._counts["tasks"] += sign
        elif kind == INSIGHT:
            self._counts["insights"] += sign
        else:
            self._counts["attempts"] += sign
            self._counts["verified"] += sign * (verdict == 0)

    def _decode(self, off: int, length: int) -> Any:
        return from_json(self.log.read_at(off, length))

    def _remember(self, row: int, record: Any) -> None:
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()  # decoded again from the log on demand
        self._cache[row] = record

    # -- snapshots ---------------------------------------------------------------------------
    def _load_snapshot(self) -> None:
        path = self.root / SNAPSHOT_NAME
        loaded = snapshot.load(path)
        if loaded is None:
            return
        header, arrays = loaded
        offset = int(header.get("log_offset", -1))
        if header.get("schema") != SCHEMA_VERSION or not self._matches_log(offset, header):
            log.warning(
                "%s does not match %s (or another schema); replaying the whole log",
                path,
                self.log.path,
            )
            return
        self._nbase = int(header["rows"])
        self._base_ids = arrays["ids"]
        self._base = {n: arrays[f"hot.{n}"] for n in HOT}
        self._tbase = {n: arrays[f"task.{n}"] for n in TASK_COLUMNS}
        self._att_start, self._att_rows = arrays["att_start"], arrays["att_rows"]
        self._e_start, self._e_dst, self._e_kind = (
            arrays["e_start"],
            arrays["e_dst"],
            arrays["e_kind"],
        )
        self._codes = {c: {s: i for i, s in enumerate(header["codes"][c])} for c in CODED}
        self._counts = dict(header["counts"])
        self._n_edges = len(self._e_dst)
        self._skipped = int(header.get("skipped", 0))
        self._offset = self.snapshot_offset = offset
        for row in np.flatnonzero(self._base["kind"] == INSIGHT).tolist():
            self._insights[row] = self.record_at(row)

    def _matches_log(self, offset: int, header: dict[str, Any]) -> bool:
        if offset < 0 or self.log.size() < offset:
            return False
        start = max(0, offset - 4096)
        return zlib.crc32(self.log.read_bytes(start, offset - start)) == header.get("log_check")

    def compact(self, only_if_free: bool = False) -> bool:
        """Write a snapshot of everything read so far, so the next open skips replaying it.
        With `only_if_free`, skip it when another process is writing one; returns whether
        a snapshot was written."""
        lock = os.open(self.root / ".snapshot.lock", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (fcntl.LOCK_NB if only_if_free else 0))
            except BlockingIOError:
                return False
            for stale in self.root.glob(".snapshot-*"):  # left by a writer killed mid-way
                stale.unlink(missing_ok=True)
            self.refresh()
            header, arrays = self._snapshot_arrays()
            size = snapshot.write(self.root / SNAPSHOT_NAME, header, arrays)
            log.info(
                "%s: snapshot of %d rows up to byte %d (%d bytes)",
                self.root,
                header["rows"],
                self._offset,
                size,
            )
            self.snapshot_offset = self._offset
            return True
        finally:
            os.close(lock)

    def _snapshot_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        n = self._nbase + len(self._over_ids)
        width = max([self._base_ids.dtype.itemsize] + [len(i.encode()) for i in self._over_ids])
        ids = np.concatenate(
            [
                self._base_ids.astype(f"S{width}"),
                np.array([i.encode() for i in self._over_ids], dtype=f"S{width}"),
            ]
        )
        order = np.argsort(ids, kind="stable")
        new_of = np.empty(n, np.int64)
        new_of[order] = np.arange(n)
        hot = self.hot(list(range(n)))
        hot["task"] = np.where(hot["task"] >= 0, new_of[np.maximum(hot["task"], 0)], -1)
        arrays: dict[str, np.ndarray] = {"ids": ids[order]}
        arrays.update({f"hot.{k}": v[order].astype(HOT[k]) for k, v in hot.items()})
        table = self.task_table()
        rows = new_of[table["row"]]
        by_row = np.argsort(rows, kind="stable")
        for name, column in table.items():
            arrays[f"task.{name}"] = (rows if name == "row" else column)[by_row].astype(
                TASK_COLUMNS[name]
            )
        arrays["att_start"], arrays["att_rows"] = _attempts_by_task(arrays)
        src, dst, kind = self._all_edges()
        src, dst = new_of[src], new_of[dst]
        by_src = np.lexsort((dst, src))
        arrays["e_start"] = np.searchsorted(src[by_src], np.arange(n + 1)).astype(np.int64)
        arrays["e_dst"] = dst[by_src].astype(np.int32)
        arrays["e_kind"] = kind[by_src].astype(np.int8)
        start = max(0, self._offset - 4096)
        header = {
            "schema": SCHEMA_VERSION,
            "rows": n,
            "log_offset": self._offset,
            "log_check": zlib.crc32(self.log.read_bytes(start, self._offset - start)),
            "codes": {c: sorted(self._codes[c], key=self._codes[c].__getitem__) for c in CODED},
            "counts": self._counts,
            "skipped": self._skipped,
        }
        return header, arrays

    def _all_edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        base_src = np.repeat(np.arange(self._nbase, dtype=np.int64), np.diff(self._e_start))
        over = [(s, d, k) for s, out in self._over_edges.items() for d, k in out]
        o = np.array(over, dtype=np.int64).reshape(-1, 3)
        return (
            np.concatenate([base_src, o[:, 0]]),
            np.concatenate([self._e_dst.astype(np.int64), o[:, 1]]),
            np.concatenate([self._e_kind.astype(np.int64), o[:, 2]]),
        )

    # -- artifacts ---------------------------------------------------------------------------
    def task_lock(self, key: str) -> FileLock:
        """The lock a process holds while it optimizes task `key` into this store (`kope
        precompile`): another that reaches the task waits, then reads what the first
        recorded, instead of making the same proposals beside it."""
        self._check_writable()
        directory = self.root / "locks"
        directory.mkdir(exist_ok=True)
        return FileLock(str(directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.lock"))

    def artifact_path(self, digest: str) -> Path:
        return self.root / "artifacts" / digest[:2] / f"{digest}.mlir"

    def put_artifact(self, text: str, sync: bool = True) -> str:
        """Store a kernel text by its sha256 (durably unless `sync` is False); returns it."""
        data = text.encode()
        digest = hashlib.sha256(data).hexdigest()
        path = self.artifact_path(digest)
        if path.exists():
            return digest
        self._check_writable()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if sync:
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


def _attempts_by_task(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """CSR of attempt rows per task (in the task table's order), oldest first."""
    kind, task, created = arrays["hot.kind"], arrays["hot.task"], arrays["hot.created"]
    attempts = np.flatnonzero((kind == ATTEMPT) & (task >= 0))
    task_rows = arrays["task.row"]
    index = np.minimum(np.searchsorted(task_rows, task[attempts]), max(len(task_rows) - 1, 0))
    ok = task_rows[index] == task[attempts] if len(task_rows) else np.zeros(len(attempts), bool)
    attempts, index = attempts[ok], index[ok]
    order = np.lexsort((created[attempts], index))
    start = np.searchsorted(index[order], np.arange(len(task_rows) + 1)).astype(np.int64)
    return start, attempts[order].astype(np.int32)


def _empty_task_table() -> dict[str, np.ndarray]:
    table = {n: np.empty(0, d) for n, d in TASK_COLUMNS.items()}
    table["shape"] = np.empty((0, SHAPE_DIMS + 1), np.float32)
    return table


def _code(names: tuple[str, ...], value: str) -> int:
    return names.index(value) if value in names else len(names)


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)
