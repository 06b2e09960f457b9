"""Experience graph records: every node and edge kind survives the log, a snapshot and every
export exactly; v1 records migrate; ids, not rustworkx indices, name nodes."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import networkx as nx
import pytest

from kope.memory.export import export, read_graphml, read_json
from kope.memory.log import encode
from kope.memory.schema import (
    CONFIRMS,
    CONTRADICTS,
    EDGE_KINDS,
    REFINES,
    SCHEMA_VERSION,
    SIMILAR,
    SUPPORTS,
    TRANSFERRED_FROM,
    AttemptRecord,
    InsightRecord,
    TaskRecord,
    from_json,
    hardware_of,
    to_json,
)
from kope.memory.store import ExperienceStore

TARGET_KEY = "cpu|Intel Xeon avx512f 2c|torch-2.13.0|torch-mlir-20261001|kope-0.1.0"


def task(key: str, op: str = "aten.mm.default", n: int = 64) -> TaskRecord:
    return TaskRecord(
        key,
        op,
        f"{op}({n}x{n}xf32)",
        "w-" + key,
        [[[n, n], "float32"], [[n, n], "float32"]],
        [[[n, n], "float32"]],
        "cpu",
        TARGET_KEY,
        created=1000.0,
    )


def populated(root: Path) -> ExperienceStore:
    """A store with every node kind and every edge kind, and awkward values."""
    store = ExperienceStore(root)
    store.add_task(task("t1"))
    store.add_task(task("t2", n=128))
    first = store.add_attempt(
        AttemptRecord(
            task="t1",
            source="agent",
            verdict="verified",
            decision="tile 8x32x4 + vectorize",
            agent="heuristic",
            model="none",
            tokens_in=1234,
            tokens_out=56,
            wall_s=0.1 + 0.2,
            max_abs_err=1e-300,
            max_rel_err=5e-324,
            latency_us=12.345678901234567,
            spread_us=0.1,
            repeats=15,
            threads=2,
            eager_us=32.1,
            reference_us=400.0,
            speedup_vs_eager=2.6000000000000001,
            speedup_vs_reference=32.4,
            created=1001.5,
        ),
        artifact="module { // café ✓ }\n",
    )
    child = store.add_attempt(
        AttemptRecord(
            task="t1",
            source="agent",
            verdict="mismatch",
            decision="tile 4x4",
            parent=first.id,
            error="max abs err 3.5 at [7, 0]\nsecond line",
            max_abs_err=math.inf,
            created=1002.0,
        )
    )
    moved = store.add_attempt(
        AttemptRecord(
            task="t2",
            source="agent",
            verdict="verified",
            transferred_from=first.id,
            latency_us=50.0,
            speedup_vs_eager=1.5,
            created=1003.0,
        )
    )
    confirmation = store.add_attempt(
        AttemptRecord(
            task="t1",
            source="agent",
            verdict="verified",
            artifact=first.artifact,
            latency_us=12.5,
            eager_us=32.0,
            speedup_vs_eager=2.56,
            threads=2,
            timing_quality="contaminated",
            clean_rounds=4,
            rounds=15,
            wait_share=0.375,
            load=14.25,
            confirms=first.id,
            created=1003.5,
        )
    )
    store.add_edge("t2", "t1", SIMILAR)
    insight = store.add_insight(
        InsightRecord(
            id="insight-x",
            family="matmul",
            dtype="float32",
            decision="tile 8x32x4 + vectorize",
            text="tile 8x32x4 + vectorize gave 2.60x",
            support=1,
            contradict=1,
            weight=0.5,
            best_speedup=2.6,
            best_attempt=first.id,
            created=1004.0,
            updated=1004.0,
        )
    )
    store.add_edge(insight.id, first.id, SUPPORTS)
    store.add_edge(insight.id, child.id, CONTRADICTS)
    assert moved.transferred_from == first.id
    assert store.has_edge(confirmation.id, first.id, CONFIRMS)  # implied by `confirms`
    return store


def snapshot_of(store: ExperienceStore) -> tuple[list[str], list[tuple[str, str, str]]]:
    records = sorted(json.dumps(to_json(r), sort_keys=True) for r in store.iter_records())
    return records, sorted(store.iter_edges())


def test_every_node_and_edge_kind_round_trips_through_the_log(tmp_path: Path) -> None:
    store = populated(tmp_path)
    before = snapshot_of(store)
    assert {kind for _, _, kind in before[1]} == set(EDGE_KINDS)
    again = ExperienceStore(tmp_path)
    assert snapshot_of(again) == before
    first = again.attempts("t1")[0]
    assert first.wall_s == 0.1 + 0.2 and first.max_rel_err == 5e-324
    assert first.latency_us == 12.345678901234567
    assert again.attempts("t1")[1].max_abs_err == math.inf
    assert again.get_artifact(first.artifact) == "module { // café ✓ }\n"
    assert again.task("t1").hardware == "cpu|Intel Xeon avx512f 2c"
    assert again.has_edge(again.attempts("t1")[1].id, first.id, REFINES)
    assert again.has_edge(again.attempts("t2")[0].id, first.id, TRANSFERRED_FROM)
    assert again.summary()["insights"] == 1 and again.insights()[0].best_speedup == 2.6


def test_round_trip_through_a_snapshot_and_the_tail_after_it(tmp_path: Path) -> None:
    store = populated(tmp_path)
    assert store.compact()
    store.add_task(task("t3", n=256))
    store.add_attempt(
        AttemptRecord(
            task="t3", source="agent", verdict="timeout", parent=store.attempts("t1")[0].id
        )
    )
    before = snapshot_of(store)
    again = ExperienceStore(tmp_path)
    assert again.snapshot_offset > 0  # opened from the snapshot, replayed only the tail
    assert snapshot_of(again) == before
    assert again.stats() == store.stats()
    assert again.graph.num_nodes() == store.graph.num_nodes() == 9
    assert again.graph.num_edges() == store.graph.num_edges() == len(before[1])
    # rustworkx indices differ between the two stores; ids and edges between ids do not.
    names = {again.graph[i] for i in again.graph.node_indices()}
    assert names == {r.id for r in store.iter_records()}


@pytest.mark.parametrize("fmt", ["json", "graphml"])
def test_exports_read_back_exactly(tmp_path: Path, fmt: str) -> None:
    store = populated(tmp_path / "store")
    path = tmp_path / f"graph.{fmt}"
    with open(path, "w") as out:
        export(store, fmt, out)
    records, edges = (read_json if fmt == "json" else read_graphml)(path)
    assert sorted(json.dumps(to_json(r), sort_keys=True) for r in records) == snapshot_of(store)[0]
    assert sorted(edges) == snapshot_of(store)[1]


def test_graphml_is_standard_and_keeps_floats_as_text(tmp_path: Path) -> None:
    store = populated(tmp_path / "store")
    path = tmp_path / "graph.graphml"
    with open(path, "w") as out:
        export(store, "graphml", out)
    graph = nx.read_graphml(path)
    assert graph.number_of_nodes() == 7 and graph.number_of_edges() == len(snapshot_of(store)[1])
    first = store.attempts("t1")[0]
    record = json.loads(graph.nodes[first.id]["record"])
    assert record["latency_us"] == 12.345678901234567 and record["wall_s"] == 0.1 + 0.2


def test_dot_names_every_node_and_edge(tmp_path: Path) -> None:
    store = populated(tmp_path)
    out = io.StringIO()
    export(store, "dot", out)
    text = out.getvalue()
    assert text.startswith("digraph kope {") and text.rstrip().endswith("}")
    assert text.count(" -> ") == len(snapshot_of(store)[1])
    assert all(f'"{r.id}" [label=' in text for r in store.iter_records())


def test_v1_records_migrate(tmp_path: Path) -> None:
    assert SCHEMA_VERSION == 2
    v1_task = {k: v for k, v in to_json(task("old")).items() if k != "hardware"}
    v1_task["v"] = 1
    v1_attempt = {**to_json(AttemptRecord(task="old", source="eager", verdict="verified")), "v": 1}
    del v1_attempt["transferred_from"]
    for added in ("timing_quality", "clean_rounds", "rounds", "wait_share", "load", "confirms"):
        del v1_attempt[added]  # written by KOPE before timings were judged
    del v1_task["eager"]
    (tmp_path / "experience.log").write_bytes(encode(v1_task) + encode(v1_attempt))
    store = ExperienceStore(tmp_path)
    assert store.task("old").hardware == hardware_of(TARGET_KEY) == "cpu|Intel Xeon avx512f 2c"
    # Fields added since (timing quality, confirmations, the eager call) take their defaults:
    # an old timing is of unknown quality, never a clean one.
    (old,) = store.attempts("old")
    assert old.timing_quality == "unknown" and old.rounds == old.clean_rounds == 0
    assert old.confirms is None and old.wait_share is None and store.task("old").eager is None
    assert store.attempts("old")[0].transferred_from is None
    assert from_json(v1_task).hardware == "cpu|Intel Xeon avx512f 2c"


def test_edges_must_name_known_nodes_and_kinds(tmp_path: Path) -> None:
    store = populated(tmp_path)
    with pytest.raises(KeyError, match="no node nope"):
        store.add_edge("t1", "nope", SIMILAR)
    with pytest.raises(ValueError, match="unknown edge kind"):
        store.add_edge("t1", "t2", "likes")
    store.add_edge("t2", "t1", SIMILAR)  # again: recorded once
    assert store.edges_from("t2", SIMILAR) == [("t1", SIMILAR)]
