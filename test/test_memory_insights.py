"""Insights: verified lessons gather support across tasks; contradicting evidence lowers their
weight; distilling is idempotent and the lessons reach the retrieved context."""

from __future__ import annotations

from pathlib import Path

import pytest

from kope.memory.insights import distil_insights, evidence, insight_id
from kope.memory.retrieval import retrieve
from kope.memory.schema import CONTRADICTS, SUPPORTS, AttemptRecord, TaskRecord
from kope.memory.store import ExperienceStore

DECISION = "tile 8x32x4 + vectorize"


def add_matmul(store: ExperienceStore, key: str, n: int) -> None:
    store.add_task(
        TaskRecord(
            key,
            "aten.mm.default",
            f"aten.mm({n}x{n}xf32, {n}x{n}xf32)",
            "w",
            [[[n, n], "float32"]] * 2,
            [[[n, n], "float32"]],
            "cpu",
            "cpu|test",
        )
    )


def attempt(
    store: ExperienceStore,
    key: str,
    verdict: str,
    speedup: float | None = None,
    decision: str = DECISION,
) -> AttemptRecord:
    return store.add_attempt(
        AttemptRecord(
            task=key,
            source="agent",
            verdict=verdict,
            decision=decision,
            speedup_vs_eager=speedup,
            latency_us=100 / speedup if speedup else None,
            error=None if verdict == "verified" else "mismatch at [0, 0]",
        )
    )


def test_evidence_rules() -> None:
    assert (
        evidence(AttemptRecord(task="t", source="agent", verdict="verified", speedup_vs_eager=2.6))
        == SUPPORTS
    )
    assert (
        evidence(AttemptRecord(task="t", source="agent", verdict="verified", speedup_vs_eager=0.5))
        == CONTRADICTS
    )
    assert (
        evidence(AttemptRecord(task="t", source="agent", verdict="verified", speedup_vs_eager=1.01))
        is None
    )
    assert evidence(AttemptRecord(task="t", source="agent", verdict="compile_error")) == CONTRADICTS
    disturbed = AttemptRecord(
        task="t", source="agent", verdict="verified", speedup_vs_eager=537.0,
        timing_quality="contaminated",
    )  # fmt: skip
    assert evidence(disturbed) is None  # a figure the machine's load disturbed says nothing


def test_a_verified_speedup_becomes_an_insight_and_gathers_support(tmp_path: Path) -> None:
    store = ExperienceStore(tmp_path)
    add_matmul(store, "mm512", 512)
    best = attempt(store, "mm512", "verified", 2.6)
    attempt(store, "mm512", "verified", 0.9, decision="vectorize only")  # neither way
    [insight] = [i for i in distil_insights(store, "mm512") if i.decision == DECISION]
    assert insight.id == insight_id("matmul", "float32", "Tile 8x32x4  + vectorize")
    assert (insight.support, insight.contradict) == (1, 0)
    assert insight.text.startswith(
        "tile 8x32x4 + vectorize gave 2.60x over eager on float32 matmul"
    )
    assert "512x512" in insight.text and insight.best_attempt == best.id
    assert store.has_edge(insight.id, best.id, SUPPORTS)
    # Idempotent: nothing new is written the second time.
    size = (tmp_path / "experience.log").stat().st_size
    assert distil_insights(store, "mm512") and (tmp_path / "experience.log").stat().st_size == size
    # The same decision on another matmul adds support to the same node.
    add_matmul(store, "mm256", 256)
    attempt(store, "mm256", "verified", 1.8)
    again = [i for i in distil_insights(store, "mm256") if i.decision == DECISION][0]
    assert again.id == insight.id and again.support == 2 and again.weight > insight.weight
    assert ExperienceStore(tmp_path).record(insight.id).support == 2


def test_contradicting_evidence_lowers_the_weight(tmp_path: Path) -> None:
    store = ExperienceStore(tmp_path)
    add_matmul(store, "a", 512)
    attempt(store, "a", "verified", 2.6)
    attempt(store, "a", "verified", 2.2)
    before = distil_insights(store, "a")[0]
    add_matmul(store, "b", 96)
    attempt(store, "b", "mismatch")
    attempt(store, "b", "verified", 0.4)
    after = distil_insights(store, "b")[0]
    assert (after.support, after.contradict) == (2, 2)
    assert before.weight == pytest.approx(0.75) and after.weight == pytest.approx(0.5)
    assert ExperienceStore(tmp_path).insights()[0].weight == pytest.approx(0.5)


def test_insights_reach_the_context_of_a_new_task(tmp_path: Path) -> None:
    store = ExperienceStore(tmp_path)
    add_matmul(store, "mm512", 512)
    attempt(store, "mm512", "verified", 2.6)
    distil_insights(store, "mm512")
    add_matmul(store, "mm384", 384)
    context = retrieve(store, "mm384", 400)
    lines = [i for i in context.items if i.kind == "insight"]
    assert lines and "2.60x over eager on float32 matmul" in lines[0].text
    assert "weight" in lines[0].why


def test_unknown_task_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="no task"):
        distil_insights(ExperienceStore(tmp_path), "missing")
