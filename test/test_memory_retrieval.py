"""ACMI: task distance, ranking, and packing under a token budget (never over it, the same
every time, best kernel reserved, failures included, code skipped rather than truncated)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

from kope.memory.retrieval import retrieve
from kope.memory.schema import AttemptRecord, TaskRecord
from kope.memory.similarity import Features, distance, distances, features, op_family
from kope.memory.standing import winner
from kope.memory.store import ExperienceStore
from kope.memory.tokens import EstimatingCounter

HW = "cpu|Xeon avx512f 2c|torch-2.13.0"


def task(
    key: str,
    op: str,
    shape: list[int],
    dtype: str = "float32",
    target_key: str = HW,
    inputs: int = 2,
) -> TaskRecord:
    label = f"{op}({'x'.join(map(str, shape))}x{dtype})"
    return TaskRecord(
        key,
        op,
        label,
        "w",
        [[shape, dtype]] * inputs,
        [[shape, dtype]],
        "cpu",
        target_key,
        created=1000.0,
    )


def feats(t: TaskRecord) -> Features:
    return features(t.op, t.inputs, t.outputs, t.target, t.hardware)


def test_op_families() -> None:
    assert op_family("aten.mm.default") == op_family("aten.addmm.default") == "matmul"
    assert op_family("aten._softmax.default") == "softmax"
    assert op_family("aten.native_layer_norm.default") == "norm"
    assert op_family("aten.add_.Tensor") == "elementwise"
    assert op_family("aten.sum.dim_IntList") == "reduce"
    assert op_family("aten.frobnicate.default") == "frobnicate"


def test_distance_tiers_put_same_op_and_target_first() -> None:
    q = feats(task("q", "aten.mm.default", [512, 512]))
    same_shape = feats(task("a", "aten.mm.default", [512, 512]))
    half = feats(task("b", "aten.mm.default", [256, 256]))
    small = feats(task("c", "aten.mm.default", [64, 64]))
    f16 = feats(task("d", "aten.mm.default", [512, 512], dtype="float16"))
    other_hw = feats(
        task("e", "aten.mm.default", [512, 512], target_key="cpu|EPYC avx2 64c|torch-2.13.0")
    )
    bmm = feats(task("f", "aten.bmm.default", [512, 512]))
    softmax = feats(task("g", "aten._softmax.default", [512, 512], inputs=1))
    order = [same_shape, half, small, f16, other_hw, bmm, softmax]
    ds = [distance(q, f) for f in order]
    assert ds[0] == 0.0
    assert ds == sorted(ds) and len(set(ds)) == len(ds)
    assert ds[1] == pytest.approx(0.2)  # 512^3 vs 256^3: mean |log2 ratio| 0.8, / 4
    assert ds[3] < 4 <= ds[4] < 8 <= ds[5] < 16 <= ds[6]
    assert all(distance(f, q) == d for f, d in zip(order, ds, strict=True))  # symmetric


def test_vectorised_distance_equals_the_scalar_one(tmp_path: Path) -> None:
    rng = random.Random(0)
    store = ExperienceStore(tmp_path)
    ops = ["aten.mm.default", "aten.bmm.default", "aten._softmax.default", "aten.add.Tensor"]
    tasks = [
        task(
            f"t{i}",
            rng.choice(ops),
            [rng.choice([1, 7, 64, 512]) for _ in range(rng.randint(1, 4))],
            rng.choice(["float32", "float16"]),
            rng.choice([HW, "cuda|H100"]),
        )
        for i in range(40)
    ]
    for t in tasks:
        store.add_task(t)
    table = store.task_table()
    for q in tasks[:10] + [task("new", "aten.conv2d.default", [3, 3])]:
        got = distances(feats(q), store.codes_for(feats(q)), table)
        want = [distance(feats(q), feats(store.record_at(int(r)))) for r in table["row"]]
        np.testing.assert_allclose(got, want, rtol=1e-6)


def build(root: Path, seed: int = 0) -> ExperienceStore:
    """Matmuls of three sizes, a bmm and a softmax, each with an eager baseline and a refined
    trajectory of agent attempts, some failed, with kernels of realistic size."""
    rng = random.Random(seed)
    store = ExperienceStore(root)
    decisions = [
        "tile 8x32x4 + vectorize",
        "tile 4x16x8",
        "pack 8x32 + fma",
        "vectorize",
        "interchange + unroll 4",
        "tile 64 + parallel",
    ]
    specs = [
        ("mm512", "aten.mm.default", 512),
        ("mm256", "aten.mm.default", 256),
        ("mm64", "aten.mm.default", 64),
        ("bmm", "aten.bmm.default", 128),
        ("softmax", "aten._softmax.default", 512),
    ]
    clock = 2000.0
    for key, op, n in specs:
        store.add_task(task(key, op, [n, n]))
        store.add_attempt(
            AttemptRecord(
                task=key,
                source="eager",
                verdict="verified",
                latency_us=100.0,
                speedup_vs_eager=1.0,
                created=clock,
            )
        )
        parent = None
        for i in range(8):
            clock += 10.0
            verdict = rng.choice(["verified", "verified", "mismatch", "compile_error"])
            latency = rng.uniform(20, 200)
            ok = verdict == "verified"
            attempt = store.add_attempt(
                AttemptRecord(
                    task=key,
                    source="agent",
                    verdict=verdict,
                    decision=rng.choice(decisions),
                    latency_us=latency if ok else None,
                    speedup_vs_eager=100 / latency if ok else None,
                    error=None if ok else f"kernel.mlir:{i}:3: error: op does not dominate its use",
                    parent=parent,
                    agent="heuristic",
                    created=clock,
                ),
                artifact="".join(
                    f"  %{j} = arith.addf %a{j}, %b{j} : vector<8xf32>\n"
                    for j in range(rng.randint(20, 60))
                ),
            )
            parent = attempt.id if ok else parent
    return store


def fenced_blocks(text: str) -> list[str]:
    return re.findall(r"```mlir\n(.*?)\n```", text, flags=re.S)


@pytest.mark.parametrize("budget", [40, 90, 150, 300, 600, 1200, 2500, 10000])
def test_packing_never_exceeds_the_budget_and_is_deterministic(tmp_path: Path, budget: int) -> None:
    store = build(tmp_path)
    counter = EstimatingCounter()
    first = retrieve(store, "mm512", budget)
    assert counter.count(first.text) <= first.tokens <= budget
    assert retrieve(store, "mm512", budget).text == first.text
    store.compact()  # another open of the same store numbers its rows differently
    again = retrieve(ExperienceStore(tmp_path), "mm512", budget)
    assert again.text == first.text and [i.id for i in again.items] == [i.id for i in first.items]


def test_context_reserves_the_best_kernel_and_shows_failures(tmp_path: Path) -> None:
    store = build(tmp_path)
    best = winner(store.attempts("mm512")).best
    assert best is not None and best.source == "agent"
    context = retrieve(store, "mm512", 2000)
    assert context.items[0].kind == "best" and context.items[0].id == best.id
    assert context.items[0].level == "full"
    assert store.get_artifact(best.artifact).rstrip() in context.text
    assert sum(1 for i in context.items if i.kind == "failure") >= 2
    for item in context.items:
        assert item.why and item.score > 0 and item.tokens > 0 and item.text in context.text
    # Code is whole or absent: every fenced block is a complete stored kernel.
    kernels = {
        store.get_artifact(a.artifact).rstrip()
        for t in ("mm512", "mm256", "mm64", "bmm")
        for a in store.attempts(t)
        if a.artifact
    }
    assert fenced_blocks(context.text) and all(b in kernels for b in fenced_blocks(context.text))
    # A budget too small for the kernel still names the best attempt, in a line.
    small = retrieve(store, "mm512", 120)
    assert small.items[0].id == best.id and small.items[0].level != "full"
    assert not fenced_blocks(small.text)


def test_same_op_ranks_before_the_rest_of_the_family(tmp_path: Path) -> None:
    store = build(tmp_path)
    context = retrieve(store, "mm512", 10000, min_failures=0, min_insights=0)
    owners = [store.record(i.id).task for i in context.items if i.kind == "attempt"]
    assert "bmm" in owners and "softmax" not in owners
    first_bmm = owners.index("bmm")
    assert all(owners.index(mm) < first_bmm for mm in ("mm512", "mm256", "mm64"))


def test_an_unseen_task_gets_the_experience_of_similar_ones(tmp_path: Path) -> None:
    store = build(tmp_path)
    new = task("mm384", "aten.mm.default", [384, 384])
    context = retrieve(store, new, 800)
    assert context.items and context.tokens <= 800
    assert {store.record(i.id).task for i in context.items if i.kind != "insight"} <= {
        "mm512",
        "mm256",
        "mm64",
        "bmm",
    }
    with pytest.raises(KeyError, match="no task"):
        retrieve(store, "nope", 100)


def test_diversity_spreads_decisions(tmp_path: Path) -> None:
    store = build(tmp_path)
    context = retrieve(store, "mm512", 1500, min_failures=0, full_kernels=0)
    decisions = [store.record(i.id).decision for i in context.items if i.kind == "attempt"][:6]
    assert len(set(decisions)) >= 4


def test_a_kernel_that_is_its_reference_unchanged_is_a_line_not_a_copy(tmp_path: Path) -> None:
    """The prompt already holds this task's reference lowering; a copy of it is no lesson."""
    store = build(tmp_path)
    reference = "".join(f"  %{j} = arith.mulf %a{j}, %b{j} : f32\n" for j in range(80))
    record = task("mm128", "aten.mm.default", [128, 128])
    record.payload = store.put_artifact(reference)
    store.add_task(record)
    store.add_attempt(
        AttemptRecord(
            task="mm128",
            source="agent",
            verdict="verified",
            decision="keep the reference loops",
            latency_us=10.0,
            speedup_vs_eager=3.0,
            agent="llm",
            created=9000.0,
        ),
        artifact=reference.strip() + "\n\n",  # what a model sends back is not byte-identical
    )
    # A model that repeats itself: the same tiled kernel three times, the reference again.
    tiled = "".join(f"  %{j} = vector.fma %a{j}, %b{j}, %c{j} : vector<8xf32>\n" for j in range(40))
    for i, (text, latency) in enumerate(
        [(tiled, 5.0), (tiled, 5.5), (reference, 11.0), (tiled, 6)]
    ):
        store.add_attempt(
            AttemptRecord(
                task="mm128",
                source="agent",
                verdict="verified",
                decision="tile 8x8" if text == tiled else "keep the reference loops",
                latency_us=latency,
                speedup_vs_eager=30.0 / latency,
                agent="llm",
                created=9001.0 + i,
            ),
            artifact=text,
        )
    context = retrieve(store, "mm128", 4000)
    assert context.items[0].kind == "best" and context.items[0].level == "full"
    assert fenced_blocks(context.text).count(tiled.rstrip()) == 1
    mine = [i for i in context.items if i.task == "mm128"]
    assert len(mine) == 2  # the tiled kernel once, the reference's copy once
    (copy,) = [i for i in mine if i.kind != "best"]
    assert copy.level == "summary" and "the reference lowering, unchanged" in copy.text
    assert "arith.mulf" not in context.text
    assert len(fenced_blocks(context.text)) > 1  # other tasks' kernels are still shown in full
    # From a similar task, the copy of mm128's reference is a line there too.
    other = retrieve(store, "mm256", 10000, min_failures=0, min_insights=0)
    copies = [i for i in other.items if i.task == "mm128" and "unchanged" in i.text]
    assert len(copies) == 1 and copies[0].level == "summary" and "arith.mulf" not in other.text
