"""The store under crashes and contention: kill -9 at random points loses at most the attempt
in flight; concurrent writers lose nothing; torn logs and bad snapshots load with a warning."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kope.memory.schema import AttemptRecord, TaskRecord
from kope.memory.store import SNAPSHOT_NAME, ExperienceStore

# A writer that records attempts (each with an artifact, every third refining the one
# before), prints each id once `add_attempt` has returned, and writes a snapshot now and then.
WRITER = """
import sys
from kope.memory.store import ExperienceStore
from kope.memory.schema import AttemptRecord, TaskRecord
root, tag, count, compact_every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
store = ExperienceStore(root)
store.add_task(TaskRecord("task-" + tag, "aten.mm.default", "mm", "w", [[[8, 8], "float32"]],
                          [[[8, 8], "float32"]], "cpu", "cpu|test"))
parent = None
for i in range(count):
    a = AttemptRecord(task="task-" + tag, source="agent", verdict="verified", decision=f"d{i % 5}",
                      latency_us=float(i) + 0.1, parent=parent, error="x" * (i * 997 % 20000))
    store.add_attempt(a, artifact=f"kernel {tag} {i}\\n" * 200)
    print(a.id, flush=True)
    parent = a.id if i % 3 else None
    if compact_every and i % compact_every == compact_every - 1:
        store.compact()
"""


def _task(key: str) -> TaskRecord:
    return TaskRecord(
        key,
        "aten.mm.default",
        "mm",
        "w",
        [[[8, 8], "float32"]],
        [[[8, 8], "float32"]],
        "cpu",
        "cpu|test",
    )


def test_kill_9_at_random_points_loses_at_most_the_attempt_in_flight(tmp_path: Path) -> None:
    rng = random.Random(1234)
    acknowledged: set[str] = set()
    for round_ in range(20):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), "k", "10000", "4"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        wanted = rng.randint(1, 12)
        for _ in range(wanted):
            acknowledged.add(proc.stdout.readline().strip())
        time.sleep(rng.random() * 0.02)  # land somewhere in a write, an fsync or a snapshot
        proc.send_signal(signal.SIGKILL)
        acknowledged.update(
            line.strip() for line in proc.stdout if line.strip()
        )  # printed before death
        proc.wait()
        store = ExperienceStore(tmp_path)
        stored = {a.id for a in store.attempts("task-k")}
        lost = acknowledged - stored
        assert not lost, f"round {round_}: acknowledged attempts lost: {lost}"
        # Rounds append one after another: at most one unacknowledged attempt per round.
        assert len(stored - acknowledged) <= round_ + 1
        for attempt in store.attempts("task-k"):
            assert attempt.artifact is not None and store.get_artifact(attempt.artifact) is not None
        store.close()


def test_concurrent_writers_with_snapshots_lose_nothing(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), tag, "120", every],
            stdout=subprocess.PIPE,
            text=True,
        )
        for tag, every in (("a", "25"), ("b", "0"), ("c", "40"))
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    store = ExperienceStore(tmp_path)
    for tag, out in zip("abc", outputs, strict=True):
        printed = out.split()
        stored = store.attempts(f"task-{tag}")
        assert [a.id for a in stored] == printed and len(printed) == 120
        refines = sum(1 for a in stored if a.parent is not None)
        assert sum(len(store.edges_from(a.id, "refines")) for a in stored) == refines
    assert store.stats() == {"tasks": 3, "attempts": 360, "verified": 360, "skipped_records": 0}
    assert store.snapshot_offset > 0


def test_truncated_log_loads_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = ExperienceStore(tmp_path)
    store.add_task(_task("t"))
    ids = [
        store.add_attempt(AttemptRecord(task="t", source="agent", verdict="mismatch")).id
        for _ in range(5)
    ]
    path = tmp_path / "experience.log"
    size = path.stat().st_size
    last = size - len(path.read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[1]) - 1
    for cut in sorted({last + 1, (last + size) // 2, size - 1}):
        os.truncate(path, cut)
        with caplog.at_level(logging.WARNING, logger="kope.memory"):
            reopened = ExperienceStore(tmp_path)
        assert [a.id for a in reopened.attempts("t")] == ids[:4]
        assert "torn record" in caplog.text
        caplog.clear()
    reopened.add_attempt(AttemptRecord(task="t", source="agent", verdict="verified"))
    assert len(ExperienceStore(tmp_path).attempts("t")) == 5


def test_a_damaged_or_stale_snapshot_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = ExperienceStore(tmp_path)
    store.add_task(_task("t"))
    for i in range(4):
        store.add_attempt(AttemptRecord(task="t", source="agent", verdict="verified", latency_us=i))
    store.compact()
    snap = tmp_path / SNAPSHOT_NAME
    data = bytearray(snap.read_bytes())
    data[len(data) // 2] ^= 0xFF
    snap.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="kope.memory"):
        again = ExperienceStore(tmp_path)
    assert "checksum mismatch" in caplog.text and len(again.attempts("t")) == 4
    assert again.snapshot_offset == 0
    again.compact()
    # A log rewritten under the snapshot (here: a different first record) invalidates it.
    log = tmp_path / "experience.log"
    log.write_bytes(log.read_bytes().replace(b'"label":"mm"', b'"label":"MM"'))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kope.memory"):
        third = ExperienceStore(tmp_path)
    assert "does not match" in caplog.text
    assert third.snapshot_offset == 0


def test_open_reader_keeps_working_while_another_process_compacts(tmp_path: Path) -> None:
    reader = ExperienceStore(tmp_path)
    writer = ExperienceStore(tmp_path)
    writer.add_task(_task("t"))
    for _ in range(3):
        writer.add_attempt(AttemptRecord(task="t", source="agent", verdict="verified"))
    writer.compact()
    writer.add_attempt(AttemptRecord(task="t", source="agent", verdict="timeout"))
    reader.refresh()
    assert len(reader.attempts("t")) == 4 == len(ExperienceStore(tmp_path).attempts("t"))


def test_a_long_tail_is_compacted_when_opened(tmp_path: Path) -> None:
    store = ExperienceStore(tmp_path)
    store.add_task(_task("t"))
    store.add_records(
        [AttemptRecord(task="t", source="agent", verdict="verified") for _ in range(30)]
    )
    assert not (tmp_path / SNAPSHOT_NAME).exists()
    ExperienceStore(tmp_path, compact_after=20)
    again = ExperienceStore(tmp_path)
    assert again.snapshot_offset == (tmp_path / "experience.log").stat().st_size
    assert len(again.attempts("t")) == 30
