"""`kope memory merge`: stores of several machines in one graph, ids kept, conflicts reported,
idempotent, loadable after kill -9 mid-merge."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kope.memory import Recorder, distil_insights
from kope.memory.log import RecordLog
from kope.memory.merge import MergeError, merge_stores
from kope.memory.schema import SIMILAR, AttemptRecord, TaskRecord
from kope.memory.standing import winner
from kope.memory.store import LOG_NAME, ExperienceStore
from kope.tools.cli import main
from kope.vocabulary.events import AttemptEvaluated, TaskSeen
from kope.vocabulary.evidence import (
    SOURCE_AGENT,
    SOURCE_REFERENCE,
    TIMING_CLEAN,
    VERIFIED,
    Evaluation,
    Timing,
)
from kope.vocabulary.kernels import Kernel

SHARED = "shared-" + "0" * 57  # the same operator on the same target, seen by both machines


def _timing(us: float) -> Timing:
    return Timing(us, 0.1, 10, 4, rounds=5, clean_rounds=5, quality=TIMING_CLEAN)


def _seen(key: str, n: int) -> TaskSeen:
    spec = (((n, n), "float32"),)
    return TaskSeen(
        key,
        "aten.mm.default",
        f"aten.mm({n}x{n}xf32)",
        f"workload-{n}",
        spec * 2,
        spec,
        "cpu",
        "cpu|test",
        eager={"op": "aten.mm.default"},
        payload=f"func.func @main() {{ // reference {n} }}",
    )


def _evaluated(task: str, source: str, kernel_us: float, text: str, **kw: Any) -> AttemptEvaluated:
    evaluation = Evaluation(VERIFIED, kernel=_timing(kernel_us), eager=_timing(30.0), threads=4)
    return AttemptEvaluated(task, source, evaluation, Kernel(text), **kw)


def machine(root: Path, tag: str, agent_us: float) -> ExperienceStore:
    """What one machine learned, recorded as the loop records it: the shared task and one of
    its own; a reference lowering (with its eager baseline), an agent kernel refining it and
    a clean confirmation of it; a kernel transferred to its own task; an insight; edges."""
    store = ExperienceStore(root)
    record = Recorder(store)
    own = f"own-{tag}"
    record(_seen(SHARED, 64))
    record(_seen(own, 32))
    reference = _evaluated(SHARED, SOURCE_REFERENCE, 20.0, "kernel reference 64")
    record(reference)
    decision = "tile 8x32x4 + vectorize"
    agent = _evaluated(
        SHARED, SOURCE_AGENT, agent_us, f"kernel {tag}", decision=decision, parent=reference.id
    )
    record(agent)
    record(_evaluated(SHARED, SOURCE_AGENT, agent_us, f"kernel {tag}", confirms=agent.id))
    record(_evaluated(own, SOURCE_AGENT, 5.0, f"kernel {tag}", transferred_from=agent.id))
    distil_insights(store, SHARED)
    store.add_edge(own, SHARED, SIMILAR)
    return store


def _listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_two_machines_merge_into_one_graph_and_again_adds_nothing(tmp_path: Path) -> None:
    a = machine(tmp_path / "a", "a", 10.0)
    b = machine(tmp_path / "b", "b", 8.0)
    before = {p: _listing(p) for p in (a.root, b.root)}
    into = ExperienceStore(tmp_path / "c")
    report = merge_stores([a.root, b.root], into)

    first, second = report.sources
    assert first.added == {"task": 2, "attempt": 5, "insight": 1, "edge": 10, "artifact": 4}
    # The shared task (first seen at another time) and the insight (the same lesson) are there.
    assert second.added == {"task": 1, "attempt": 5, "insight": 0, "edge": 10, "artifact": 1}
    assert second.present["task"] == 1 and second.present["insight"] == 1
    # Texts b's new records name that a's already brought, by hash: its own task's reference
    # lowering (a's own task has the same shape) and the shared task's reference kernel.
    assert second.present["artifact"] == 2
    assert not report.conflicts and second.edges_skipped == 0
    assert {p: _listing(p) for p in (a.root, b.root)} == before  # the sources only read

    merged = ExperienceStore(tmp_path / "c")
    ids = [r.id for r in merged.iter_records()]
    source_ids = {r.id for s in (a, b) for r in s.iter_records()}
    assert len(ids) == len(set(ids)) == len(source_ids) == 14 and set(ids) == source_ids
    for store in (a, b):
        for r in store.iter_records():
            if isinstance(r, AttemptRecord):
                assert merged.record(r.id) == r
                assert merged.get_artifact(r.artifact or "") == store.get_artifact(r.artifact or "")
            elif isinstance(r, TaskRecord):
                assert merged.get_artifact(r.payload or "") == store.get_artifact(r.payload or "")
    assert set(merged.iter_edges()) == set(a.iter_edges()) | set(b.iter_edges())
    assert merged.graph.num_nodes() == 14 and merged.graph.num_edges() == 20
    assert len(merged.attempts(SHARED)) == 8  # reference, eager, agent, confirmation per machine
    # The faster machine's confirmed kernel wins; the insight counts both machines' evidence.
    best = winner(merged.attempts(SHARED)).best
    assert best is not None and best.confirms is not None and best.latency_us == 8.0
    (insight,) = merged.insights()
    assert insight.support == 2 and second.insights_recounted == 1
    assert len(merged.edges_from(insight.id, "supports")) == 2

    size = (tmp_path / "c" / LOG_NAME).stat().st_size
    again = merge_stores([a.root, b.root], merged)
    assert again.added == 0 and not again.conflicts
    assert all(s.added["artifact"] == 0 and s.insights_recounted == 0 for s in again.sources)
    assert again.sources[0].present["attempt"] == 5 and again.sources[0].present["edge"] == 10
    assert (tmp_path / "c" / LOG_NAME).stat().st_size == size


def test_a_conflicting_record_is_reported_and_not_applied(tmp_path: Path) -> None:
    a = machine(tmp_path / "a", "a", 10.0)
    into = ExperienceStore(tmp_path / "c")
    merge_stores([a.root], into)
    agent = next(x for x in a.attempts(SHARED) if x.parent is not None)
    other = ExperienceStore(tmp_path / "x")
    task = a.task(SHARED)
    assert task is not None
    other.add_task(TaskRecord(**{**vars(task), "created": task.created + 100}))  # same content
    own = a.task("own-a")
    assert own is not None
    other.add_task(TaskRecord(**{**vars(own), "label": "renamed", "payload": None}))
    changed = AttemptRecord(**{**vars(agent), "verdict": "mismatch", "error": "max abs err 1"})
    fresh = AttemptRecord(task=SHARED, source=SOURCE_AGENT, verdict=VERIFIED)
    other.add_records([changed, fresh])
    other.add_edge(fresh.id, changed.id, "refines")  # touches the conflict: not copied
    other.add_edge(fresh.id, task.key, SIMILAR)  # a made-up edge of a new record: copied

    report = merge_stores([other.root], into).sources[0]
    assert [(c.id, c.kind, c.fields) for c in report.conflicts] == [
        (own.key, "task", ["label", "payload"]),
        (agent.id, "attempt", ["error", "verdict"]),
    ]
    assert report.present["task"] == 1 and report.added["attempt"] == 1
    assert report.edges_skipped == 1 and report.added["edge"] == 2  # fresh's task link, similar
    kept = into.record(agent.id)
    assert isinstance(kept, AttemptRecord) and kept.verdict == VERIFIED
    assert not into.has_edge(fresh.id, agent.id, "refines") and into.has_edge(
        fresh.id, SHARED, SIMILAR
    )
    assert into.task(own.key) == own
    assert merge_stores([other.root], into).sources[0].conflicts == report.conflicts  # again


def test_merging_a_store_into_itself_or_a_non_store_is_refused(tmp_path: Path) -> None:
    store = machine(tmp_path / "a", "a", 10.0)
    size = (tmp_path / "a" / LOG_NAME).stat().st_size
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "a")
    for source in (tmp_path / "a", link):
        with pytest.raises(MergeError, match="cannot be merged into itself"):
            merge_stores([source], store)
    with pytest.raises(MergeError, match="not an experience store"):
        merge_stores([tmp_path / "nowhere"], store)
    assert not (tmp_path / "nowhere").exists()
    assert (tmp_path / "a" / LOG_NAME).stat().st_size == size


# Merges a source into a store in small batches (many appends), as `kope memory merge` does.
MERGER = """
import sys
from pathlib import Path
from kope.memory.merge import merge_stores
from kope.memory.store import ExperienceStore
merge_stores([Path(sys.argv[1])], ExperienceStore(sys.argv[2]), batch=int(sys.argv[3]))
"""


def _large_source(root: Path, tasks: int = 10, per_task: int = 500) -> ExperienceStore:
    """Tasks whose attempts refine one another, a kernel text every tenth; compacted, so that
    its records read back in id order rather than in the order they were recorded."""
    store = ExperienceStore(root)
    records: list[object] = []
    texts: dict[str, str] = {}
    for t in range(tasks):
        key = f"task-{t:03d}"
        records.append(
            TaskRecord(key, "aten.mm.default", key, "w", [[[8, 8], "float32"]], [], "cpu", "cpu|t")
        )
        parent = None
        for i in range(per_task):
            a = AttemptRecord(
                task=key, source=SOURCE_AGENT, verdict=VERIFIED, latency_us=float(i), parent=parent
            )
            records.append(a)
            if i % 10 == 0:
                texts[a.id] = f"kernel {t} {i}\n" * 50
            parent = a.id
    store.add_records(records, texts)
    store.compact()
    return store


def _ids_in_log(root: Path) -> list[str]:
    records, _ = RecordLog(root / LOG_NAME).read_from(0)
    return [r.get("id") or r.get("key") or f"{r['src']}>{r['dst']}" for r in records]


def test_kill_9_mid_merge_leaves_a_prefix_and_a_rerun_completes_it(tmp_path: Path) -> None:
    source = _large_source(tmp_path / "src")
    before = _listing(source.root)
    full = ExperienceStore(tmp_path / "full")
    merge_stores([source.root], full)
    order = _ids_in_log(full.root)
    full_size = (full.root / LOG_NAME).stat().st_size

    dst = tmp_path / "dst"
    proc = subprocess.Popen([sys.executable, "-c", MERGER, str(source.root), str(dst), "100"])
    log_path = dst / LOG_NAME
    deadline = time.monotonic() + 60
    while not (log_path.exists() and log_path.stat().st_size > full_size // 3):
        assert proc.poll() is None and time.monotonic() < deadline, "the merge never started"
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL

    killed = ExperienceStore(dst)
    landed = _ids_in_log(dst)
    assert 0 < len(landed) < len(order) and landed == order[: len(landed)]
    for key in (t.key for t in killed.tasks()):
        for attempt in killed.attempts(key):
            assert attempt == source.record(attempt.id)
            assert attempt.parent is None or killed.record(attempt.parent) is not None
            if attempt.artifact:
                assert killed.get_artifact(attempt.artifact) is not None

    report = merge_stores([source.root], killed).sources[0]
    assert report.added["attempt"] + report.present["attempt"] == 5000
    assert report.present["attempt"] > 0 and not report.conflicts
    done = ExperienceStore(dst)
    assert _ids_in_log(dst)[: len(landed)] == landed
    assert sorted(_ids_in_log(dst)) == sorted(order)
    assert done.stats() == full.stats() == {**full.stats(), "attempts": 5000, "tasks": 10}
    assert sorted(done.iter_edges()) == sorted(source.iter_edges())
    assert _listing(source.root) == before


def test_cli_merges_reports_conflicts_and_refuses_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a = machine(tmp_path / "a", "a", 10.0)
    machine(tmp_path / "b", "b", 8.0)
    monkeypatch.setenv("KOPE_HOME", str(tmp_path / "home"))
    assert main(["memory", "merge", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert f"from {tmp_path / 'a'}:" in out and f"from {tmp_path / 'b'}:" in out
    assert out.splitlines()[1].split() == ["tasks", "2", "added", "0", "present", "0", "conflicts"]
    assert out.splitlines()[-1] == f"merged 2 stores into {tmp_path / 'home'}: 34 added"
    assert ExperienceStore(tmp_path / "home").stats()["attempts"] == 10

    # A machine that re-recorded one of a's attempts with another verdict.
    shutil.copytree(tmp_path / "a", tmp_path / "x")
    agent = next(x for x in a.attempts(SHARED) if x.parent is not None)
    ExperienceStore(tmp_path / "x").add_records(
        [AttemptRecord(**{**vars(agent), "verdict": "timeout"})]
    )
    code = main(["memory", "merge", str(tmp_path / "x"), "--into", str(tmp_path / "home")])
    out = capsys.readouterr().out
    assert code == 0
    assert f"  conflict: attempt {agent.id} differs in verdict" in out
    assert out.splitlines()[-1].endswith(
        f"0 added, conflicts: 1 ({tmp_path / 'home'} kept its own records)"
    )

    code = main(["memory", "merge", str(tmp_path / "a"), "--into", str(tmp_path / "a")])
    assert code == 2 and "cannot be merged into itself" in capsys.readouterr().err
