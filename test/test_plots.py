"""The plots of `kope bench`: each writes a PNG and an SVG; the trajectory tree's graph."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from kope.core.errors import KopeError  # noqa: E402
from kope.memory.schema import AttemptRecord, TaskRecord  # noqa: E402
from kope.memory.store import ExperienceStore  # noqa: E402
from kope.tools.plots import (  # noqa: E402
    CONFIRMS,
    REFINES,
    STARTS,
    VERDICT_COLOURS,
    best_so_far,
    plot_report,
    speedup_bars,
    trajectory_graph,
    trajectory_tree,
    tree_positions,
)
from kope.vocabulary.evidence import VERDICTS  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
KEY = "task-mm"


def _row(arm: str, seed: int, name: str, label: str, trajectory: list[float | None]) -> dict:
    best = trajectory[-1] if trajectory else None
    return {
        "arm": arm,
        "seed": seed,
        "name": name,
        "key": f"{name}-{label}",
        "label": label,
        "verified": best is not None,
        "speedup_vs_eager": best,
        "speedup_vs_reference": best,
        "attempts": len(trajectory),
        "trajectory": trajectory,
        "tokens_in": 0,
        "tokens_out": 0,
        "store": "",
    }


def _report() -> dict[str, Any]:
    """Two arms, two seeds; `elementwise` yields two tasks, `rowmax` never verifies."""
    rows = []
    for seed in (0, 1):
        for arm, gain in (("memory_on", 1.2), ("memory_off", 1.0)):
            rows += [
                _row(arm, seed, "matmul_64", "aten.mm(64x64xf32)", [None, 1.1 * gain, 1.6 * gain]),
                _row(arm, seed, "softmax", "aten._softmax(8x128xf32)", [0.4, 0.6, 0.7 + seed / 10]),
                _row(arm, seed, "elementwise", "aten.add(4x4xf32)", [None, None, 2.0 * gain]),
                _row(arm, seed, "elementwise", "aten.mul(4x4xf32)", [1.3]),
                _row(arm, seed, "rowmax", "aten.amax(8x128xf32)", [None, None, None]),
            ]
    return {
        "suite": "opset",
        "target": "cpu",
        "agent": "heuristic",
        "budget": 3,
        "seeds": [0, 1],
        "ablate": "memory",
        "arms": {"memory_on": {}, "memory_off": {}},
        "operators": rows,
    }


def _store(root: Path) -> ExperienceStore:
    """A task with its reference and eager baselines, agent attempts refining one another with
    mixed verdicts, one with no parent, and a confirmation of the winner."""
    store = ExperienceStore(root)
    store.add_task(
        TaskRecord(
            KEY, "aten.mm.default", "aten.mm(4x4xf32, 4x4xf32)", "w", [], [], "cpu", "cpu|test"
        )
    )

    def attempt(source: str, verdict: str, speedup: float | None = None, **fields: Any) -> str:
        timed = {"latency_us": 10.0 / speedup, "eager_us": 10.0} if speedup else {}
        record = AttemptRecord(
            task=KEY, source=source, verdict=verdict, speedup_vs_eager=speedup, **timed, **fields
        )
        kernel = f"kernel of {fields.get('confirms') or record.id}"
        return store.add_attempt(record, kernel if source == "agent" else None).id

    reference = attempt("reference", "verified", 0.8)
    attempt("eager", "verified", 1.0)
    first = attempt("agent", "verified", 1.3, parent=reference)
    attempt("agent", "mismatch", parent=first)
    second = attempt("agent", "verified", 1.9, parent=first)
    attempt("agent", "compile_error", parent=second)
    attempt("agent", "timeout")  # no recorded parent: drawn under the reference
    attempt("agent", "verified", 1.85, confirms=second, timing_quality="clean")  # it runs
    return store


def _check_files(paths: list[Path]) -> None:
    assert [p.suffix for p in paths] == [".png", ".svg"]
    png, svg = paths
    assert png.read_bytes().startswith(PNG_SIGNATURE) and png.stat().st_size > 1000
    assert ET.parse(svg).getroot().tag.endswith("svg")


def test_speedup_bars_and_best_so_far_write_png_and_svg(tmp_path: Path) -> None:
    report = _report()
    _check_files(speedup_bars(report, tmp_path / "bars"))
    _check_files(best_so_far(report, tmp_path / "curve"))
    single = {**report, "arms": {"memory_on": {}}}
    single["operators"] = [r for r in report["operators"] if r["arm"] == "memory_on"]
    _check_files(speedup_bars(single, tmp_path / "single" / "bars"))


def test_trajectory_graph_is_the_tasks_attempts_under_its_baselines(tmp_path: Path) -> None:
    store = _store(tmp_path / "store")
    graph = trajectory_graph(store, KEY)
    assert graph.number_of_nodes() == len(store.attempts(KEY)) == 8
    kinds = [kind for _, _, kind in graph.edges(data="kind")]
    assert sorted(kinds) == sorted([REFINES] * 4 + [STARTS, CONFIRMS])
    roots = {graph.nodes[n]["role"] for n in graph if graph.in_degree(n) == 0}
    assert roots == {"eager", "reference"}
    by_index = {d["index"]: d for _, d in graph.nodes(data=True) if d["index"]}
    assert sorted(by_index) == [1, 2, 3, 4, 5]
    assert by_index[3]["label"] == "#3\n1.90×" and by_index[3]["depth"] == 2
    assert by_index[5]["depth"] == 1  # the parentless attempt hangs from the reference
    (runs,) = [d for _, d in graph.nodes(data=True) if d["runs"]]
    assert runs["role"] == "confirmation" and runs["depth"] == 3
    xy = tree_positions(graph)
    assert len(set(xy.values())) == len(xy)  # no two attempts drawn on one another
    for node in graph:  # a parent sits over its children, between the first and the last
        below = [xy[k][0] for k in graph.successors(node)]
        assert not below or min(below) <= xy[node][0] <= max(below)
    _check_files(trajectory_tree(store, KEY, tmp_path / "tree"))


def test_plot_report_names_its_files_and_draws_the_busiest_task(tmp_path: Path) -> None:
    store = _store(tmp_path / "store")
    report = _report()
    report["operators"][0]["key"] = KEY
    names = [p.name for p in plot_report(report, tmp_path / "plots", store)]
    tree = "tree-aten.mm_4x4xf32_4x4xf32"
    assert names == [
        f"{stem}.{ext}" for stem in ("speedup", "best_so_far", tree) for ext in ("png", "svg")
    ]


def test_a_missing_task_is_named(tmp_path: Path) -> None:
    store = _store(tmp_path / "store")
    with pytest.raises(KopeError, match="no-such-task"):
        trajectory_tree(store, "no-such-task", tmp_path / "tree")


def test_every_verdict_has_a_colour() -> None:
    assert set(VERDICT_COLOURS) == set(VERDICTS)
