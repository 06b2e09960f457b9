"""`kope memory ...`: stats, show, context, export and prune on a real store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kope.memory.export import read_graphml, read_json
from kope.memory.schema import AttemptRecord, TaskRecord
from kope.memory.store import ExperienceStore
from kope.memory.tokens import EstimatingCounter
from kope.tools.cli import main

KEY = "ab12" + "0" * 60


def make_store(root: Path) -> ExperienceStore:
    store = ExperienceStore(root)
    for key, n in ((KEY, 512), ("ab34" + "1" * 60, 256)):
        store.add_task(
            TaskRecord(
                key,
                "aten.mm.default",
                f"aten.mm({n}x{n}xf32)",
                "w",
                [[[n, n], "float32"]] * 2,
                [[[n, n], "float32"]],
                "cpu",
                "cpu|t",
            )
        )
    old = time.time() - 90 * 86400
    root_attempt = store.add_attempt(
        AttemptRecord(
            task=KEY,
            source="agent",
            verdict="verified",
            decision="tile 8x32x4 + vectorize",
            latency_us=12.5,
            speedup_vs_eager=2.6,
            created=old,
        ),
        artifact="module { // best }",
    )
    store.add_attempt(
        AttemptRecord(
            task=KEY,
            source="agent",
            verdict="mismatch",
            decision="tile 4x4",
            parent=root_attempt.id,
            error="max abs err 1.0",
            created=old + 1,
        ),
        artifact="module { // wrong }",
    )
    store.add_attempt(
        AttemptRecord(
            task=KEY,
            source="agent",
            verdict="compile_error",
            decision="unroll 16",
            parent=root_attempt.id,
        ),
        artifact="module { // new }",
    )
    return store


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["memory", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_stats_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_store(tmp_path)
    code, out, _ = run(capsys, "stats", "--json", "--store", str(tmp_path))
    stats = json.loads(out)
    assert code == 0
    assert {k: stats[k] for k in ("tasks", "attempts", "verified", "schema_version")} == {
        "tasks": 2,
        "attempts": 3,
        "verified": 1,
        "schema_version": 2,
    }


def test_show_prints_the_trajectory_tree_by_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_store(tmp_path)
    code, out, _ = run(capsys, "show", "ab12", "--store", str(tmp_path))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("aten.mm(512x512xf32)")
    tree = [line for line in lines if "attempt-" in line and not line.startswith("hardware")]
    assert tree[0].startswith("*") and "verified" in tree[0] and "12.5 us" in tree[0]
    assert all("└─" in line for line in tree[1:]) and {"mismatch", "compile_error"} <= set(
        out.split()
    )
    code, _, err = run(capsys, "show", "ab", "--store", str(tmp_path))
    assert code == 2 and "names 2 tasks" in err
    code, _, err = run(capsys, "show", "zz", "--store", str(tmp_path))
    assert code == 2 and "no task key starts with 'zz'" in err


def test_context_prints_exactly_what_would_be_injected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_store(tmp_path)
    code, out, _ = run(capsys, "context", "ab12", "--budget", "200", "--store", str(tmp_path))
    assert code == 0
    head, text = out.split("---- injected text " + "-" * 50 + "\n")
    assert EstimatingCounter().count(text.rstrip("\n")) <= 200
    assert "best known kernel of this task" in head and "module { // best }" in text
    code, out, _ = run(
        capsys, "context", KEY, "--budget", "200", "--json", "--store", str(tmp_path)
    )
    data = json.loads(out)
    assert data["text"] == text.rstrip("\n") and all(
        "why" in i and "score" in i for i in data["items"]
    )


@pytest.mark.parametrize("fmt", ["json", "graphml", "dot"])
def test_export_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    store = make_store(tmp_path / "s")
    target = tmp_path / f"out.{fmt}"
    code, _, _ = run(
        capsys, "export", "--format", fmt, "-o", str(target), "--store", str(tmp_path / "s")
    )
    assert code == 0
    if fmt == "dot":
        assert target.read_text().count(" -> ") == len(list(store.iter_edges()))
        return
    records, edges = (read_json if fmt == "json" else read_graphml)(target)
    assert sorted(r.id for r in records) == sorted(r.id for r in store.iter_records())
    assert sorted(edges) == sorted(store.iter_edges())


def test_prune_drops_old_failed_kernels_and_keeps_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_store(tmp_path)
    attempts = store.attempts(KEY)
    code, out, _ = run(capsys, "prune", "--older-than", "30", "--dry-run", "--store", str(tmp_path))
    assert code == 0 and out.startswith("would remove 1 artifacts")
    assert all(store.get_artifact(a.artifact) for a in attempts)
    code, out, _ = run(capsys, "prune", "--older-than", "30", "--store", str(tmp_path))
    assert out.startswith("removed 1 artifacts")
    after = ExperienceStore(tmp_path).attempts(KEY)
    assert after == attempts  # the graph's history stays
    assert [store.get_artifact(a.artifact) is not None for a in after] == [True, False, True]


def test_kope_command_line_has_memory(tmp_path: Path) -> None:
    make_store(tmp_path)
    env = {**os.environ, "KOPE_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "kope.tools.cli", "memory", "stats", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["store"] == str(tmp_path)


def test_tasks_lists_labels_keys_attempts_and_best_speedup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_store(tmp_path)
    code, out, _ = run(capsys, "tasks", "--store", str(tmp_path))
    assert code == 0
    lines = out.splitlines()
    # A figure of unknown quality (recorded without one) is no speedup: not printed as one.
    assert lines[0].split()[-3:] == ["best", "not", "clean"] and "2.60x" not in lines[0]
    assert lines[1].split()[-1] == "-"  # no verified attempt
    assert lines[-1] == "tasks 1-2 of 2"
    # What `tasks` prints is what `show` takes.
    code, out, _ = run(capsys, "show", lines[0].split()[0], "--store", str(tmp_path))
    assert code == 0 and out.startswith("aten.mm(512x512xf32)")


def test_tasks_pages_and_speaks_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_store(tmp_path)
    code, out, _ = run(capsys, "tasks", "--limit", "1", "--store", str(tmp_path))
    assert code == 0 and out.splitlines()[-1] == "tasks 1-1 of 2; --offset 1 for the next page"
    code, out, _ = run(
        capsys, "tasks", "--limit", "1", "--offset", "1", "--json", "--store", str(tmp_path)
    )
    page = json.loads(out)
    assert code == 0 and page["total"] == 2 and page["offset"] == 1
    assert [t["label"] for t in page["tasks"]] == ["aten.mm(256x256xf32)"]
    assert page["tasks"][0]["attempts"] == 0 and page["tasks"][0]["best_speedup_vs_eager"] is None
    code, _, err = run(capsys, "tasks", "--limit", "0", "--store", str(tmp_path))
    assert code == 2 and "--limit 0" in err


def test_stats_and_unknown_keys_point_to_the_task_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_store(tmp_path)
    _, out, _ = run(capsys, "stats", "--store", str(tmp_path))
    assert "kope memory tasks" in out
    code, _, err = run(capsys, "show", "ffff", "--store", str(tmp_path))
    assert code == 2 and "kope memory tasks" in err
