"""The experience store at scale: open time, retrieval latency, concurrent appends, size.

Builds a synthetic store (default: 1M attempts over 50k tasks, each attempt with a 2-8 KB
kernel text; refinement chains, transfers between similar tasks, similar-task edges and
insights with their evidence edges), writes its snapshot, then measures in fresh processes:

- open: `ExperienceStore(path)` from the snapshot plus a log tail (goal < 3 s);
- retrieval: `retrieve(store, key, budget)` for random tasks, p50/p95/max (goal p95 < 50 ms),
  and the first call apart (it builds the rustworkx graph);
- appends: 4 writer processes at once, each recording attempts one at a time with their
  kernels (each durable when recorded), then a check that every one of them is there;
- disk (log, snapshot, artifacts) and RAM (resident set of the process that opened it).

    python benchmarks/memory_scale.py                       # full size (long: build ~ 15 min)
    python benchmarks/memory_scale.py --attempts 100000 --tasks 5000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kope.memory.schema import (
    CONTRADICTS,
    SUPPORTS,
    AttemptRecord,
    EdgeRecord,
    InsightRecord,
    TaskRecord,
)
from kope.memory.similarity import op_family
from kope.memory.store import ExperienceStore

OPS = [
    "aten.mm.default",
    "aten.bmm.default",
    "aten.addmm.default",
    "aten.convolution.default",
    "aten._softmax.default",
    "aten.native_layer_norm.default",
    "aten.sum.dim_IntList",
    "aten.amax.default",
    "aten.add.Tensor",
    "aten.mul.Tensor",
    "aten.gelu.default",
    "aten.tanh.default",
]
DTYPES = ["float32", "float32", "float32", "float16", "bfloat16"]
HARDWARE = ["cpu|Intel Xeon avx512f 2c", "cpu|AMD EPYC avx2 16c"]
DECISIONS = [
    f"{t} + {v}"
    for t in (
        "tile 8x32x4",
        "tile 4x16x8",
        "tile 16x16x1",
        "block-pack 8x32x8",
        "tile 64 + parallel",
        "interchange k-outer",
        "pad to 8",
        "fuse producer",
    )
    for v in ("vectorize", "vectorize + fma", "unroll 4", "no vectorize", "hoist")
]
VERDICTS = (
    ["verified"] * 11
    + ["compile_error"] * 3
    + ["runtime_error"] * 2
    + ["timeout"]
    + ["mismatch"] * 3
)
LINES = [
    '    %{i} = linalg.generic {{indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]}} ins(%arg0 : tensor<{m}x{n}xf32>) outs(%{j} : tensor<{m}xf32>) {{',
    "    %tiled_{i}, %loops_{i}:3 = transform.structured.tile_using_for %mm tile_sizes [{a}, {b}, {c}] : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)",
    "      %{i} = arith.mulf %in, %in_{j} : f32",
    "      %{i} = vector.contract {{indexing_maps = [#map2, #map3, #map4], kind = #vector.kind<add>}} %{j}, %{k}, %acc : vector<8x{a}xf32>, vector<{a}x32xf32> into vector<8x32xf32>",
    '    transform.apply_patterns to %func {{ transform.apply_patterns.vector.lower_contraction lowering_strategy = "outerproduct" }} : !transform.any_op',
    "    %{i} = tensor.empty() : tensor<{m}x{n}xf32>",
]


def kernel_corpus(rng: random.Random) -> str:
    """64 KB of MLIR-like lines to cut kernel texts from."""
    out, size = [], 0
    while size < 65536:
        line = rng.choice(LINES).format(
            i=rng.randint(0, 99),
            j=rng.randint(0, 99),
            k=rng.randint(0, 99),
            m=rng.choice([64, 128, 512]),
            n=rng.choice([64, 256, 1024]),
            a=rng.choice([4, 8, 16]),
            b=rng.choice([16, 32]),
            c=rng.choice([1, 4, 8]),
        )
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)


def build(root: Path, attempts: int, tasks: int, seed: int, batch: int) -> dict[str, float]:
    """Write the synthetic store; returns timings."""
    rng = random.Random(seed)
    corpus = kernel_corpus(rng)
    store = ExperienceStore(root)
    start = time.perf_counter()
    now = time.time()
    per_task = max(1, attempts // tasks)
    by_op: dict[str, list[str]] = {}
    all_attempts: list[tuple[str, str, str, str]] = []  # (id, family, dtype, verdict) sample
    pending: list[object] = []
    artifacts: dict[str, str] = {}
    written = kernels_bytes = 0

    def flush() -> None:
        nonlocal pending, artifacts
        if pending:
            store.add_records(pending, artifacts)
        pending, artifacts = [], {}

    for t in range(tasks):
        op = rng.choice(OPS)
        rank = rng.choice([2, 2, 3, 4])
        shape = [
            rng.choice([1, 3, 8, 16, 64, 96, 128, 256, 384, 512, 1024, 4096]) for _ in range(rank)
        ]
        dtype = rng.choice(DTYPES)
        key = hashlib.sha256(f"{seed}-task-{t}".encode()).hexdigest()
        created = now - 180 * 86400 + t * (170 * 86400 / tasks)
        pending.append(
            TaskRecord(
                key,
                op,
                f"{op}({'x'.join(map(str, shape))}x{dtype})",
                key[:32],
                [[shape, dtype], [shape, dtype]],
                [[shape, dtype]],
                "cpu",
                f"{rng.choice(HARDWARE)}|torch-2.13.0|kope-0.1.0",
                created=created,
            )
        )
        peers = by_op.setdefault(op, [])
        if peers:
            pending.append(EdgeRecord(key, rng.choice(peers[-50:]), "similar"))
        peers.append(key)
        parent = None
        count = per_task + (1 if t < attempts - per_task * tasks else 0)
        for i in range(count):
            aid = f"attempt-{rng.getrandbits(128):032x}"
            source = "eager" if i == 0 else ("reference" if i == 1 else "agent")
            verdict = "verified" if source != "agent" else rng.choice(VERDICTS)
            ok = verdict == "verified"
            latency = rng.uniform(5, 5000)
            decision = rng.choice(DECISIONS) if source == "agent" else ""
            size = rng.randint(2048, 8192)
            offset = rng.randint(0, len(corpus) - size)
            artifacts[aid] = f"// {aid} {decision}\n{corpus[offset : offset + size]}\n"
            kernels_bytes += size
            transferred = None
            if source == "agent" and all_attempts and rng.random() < 0.05:
                transferred = rng.choice(all_attempts[-2000:])[0]
            pending.append(
                AttemptRecord(
                    task=key,
                    source=source,
                    verdict=verdict,
                    id=aid,
                    decision=decision,
                    agent="heuristic" if source == "agent" else "",
                    tokens_in=rng.randint(500, 6000),
                    tokens_out=rng.randint(100, 1500),
                    wall_s=rng.uniform(0.5, 20),
                    error=None if ok else f"kernel.mlir:{rng.randint(1, 200)}:5: error: {verdict}",
                    latency_us=latency if ok else None,
                    spread_us=latency * 0.02 if ok else None,
                    repeats=15 if ok else 0,
                    threads=1,
                    eager_us=latency * rng.uniform(0.3, 3),
                    speedup_vs_eager=rng.uniform(0.2, 4) if ok else None,
                    speedup_vs_reference=rng.uniform(1, 60) if ok else None,
                    parent=parent if source == "agent" else None,
                    transferred_from=transferred,
                    created=created + i * 30.0,
                )
            )
            if source == "agent":
                all_attempts.append((aid, op_family(op), dtype, verdict))
                parent = aid if ok and rng.random() < 0.7 else parent
            written += 1
        if len(pending) >= batch:
            flush()
    flush()
    built = time.perf_counter() - start
    # Insights: one per (family, dtype, decision) seen, with evidence edges to a sample.
    groups: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
    for aid, family, dtype, verdict in rng.sample(all_attempts, min(len(all_attempts), 20000)):
        groups.setdefault((family, dtype, rng.choice(DECISIONS)), []).append((aid, verdict))
    records: list[object] = []
    for (family, dtype, decision), evidence in sorted(groups.items()):
        iid = "insight-" + hashlib.sha256(f"{family}|{dtype}|{decision}".encode()).hexdigest()[:32]
        support = sum(1 for _, v in evidence if v == "verified")
        records.append(
            InsightRecord(
                iid,
                family,
                dtype,
                decision,
                f"{decision} on {dtype} {family}",
                support,
                len(evidence) - support,
                (support + 1) / (len(evidence) + 2),
            )
        )
        records.extend(
            EdgeRecord(iid, aid, SUPPORTS if v == "verified" else CONTRADICTS)
            for aid, v in evidence
        )
    store.add_records(records)
    start = time.perf_counter()
    store.compact()
    compact_s = time.perf_counter() - start
    return {
        "build_s": built,
        "compact_s": compact_s,
        "attempts": written,
        "tasks": tasks,
        "insights": len(groups),
        "kernel_bytes": kernels_bytes,
    }


PROBE = """
import json, random, resource, statistics, sys, time
t0 = time.perf_counter()
from kope.memory.store import ExperienceStore
from kope.memory.retrieval import retrieve
t1 = time.perf_counter()
store = ExperienceStore(sys.argv[1])
t2 = time.perf_counter()
def rss_mb():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1]) / 1024
rss_open = rss_mb()
rng = random.Random(int(sys.argv[2]))
keys = [store.id_of(r) for r in rng.sample(store.rows_of_kind(0), int(sys.argv[3]))]
t3 = time.perf_counter()
first = retrieve(store, keys[0], int(sys.argv[4]))
t4 = time.perf_counter()
times = []
for key in keys[1:]:
    s = time.perf_counter()
    ctx = retrieve(store, key, int(sys.argv[4]))
    times.append((time.perf_counter() - s) * 1e3)
    assert ctx.tokens <= int(sys.argv[4])
times.sort()
print(json.dumps({"import_s": t1 - t0, "open_s": t2 - t1, "rss_open_mb": rss_open,
                  "first_retrieve_s": t4 - t3, "retrieve_ms_p50": statistics.median(times),
                  "retrieve_ms_p95": times[int(0.95 * (len(times) - 1))], "retrieve_ms_max": times[-1],
                  "items_last": len(ctx.items), "rss_after_mb": rss_mb(),
                  "stats": store.stats()}))
"""

WRITER = """
import sys, time, random
from kope.memory.store import ExperienceStore
from kope.memory.schema import AttemptRecord, TaskRecord
root, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
store = ExperienceStore(root)
opened = time.perf_counter() - t0
store.add_task(TaskRecord("writer-" + tag, "aten.mm.default", "mm", "w", [[[64, 64], "float32"]] * 2,
                          [[[64, 64], "float32"]], "cpu", "cpu|bench"))
rng = random.Random(tag)
t1 = time.perf_counter()
for i in range(n):
    a = AttemptRecord(task="writer-" + tag, source="agent", verdict="verified", decision="tile",
                      latency_us=rng.uniform(1, 100))
    store.add_attempt(a, artifact=f"// {tag} {i}\\n" + "x" * rng.randint(2048, 8192))
print(opened, time.perf_counter() - t1)
"""


def writers(root: Path, count: int, per_writer: int) -> dict[str, float]:
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), f"w{i}", str(per_writer)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    outs = [p.communicate()[0].split() for p in procs]
    wall = time.perf_counter() - start
    assert all(p.returncode == 0 for p in procs), "a writer failed"
    store = ExperienceStore(root)
    lost = sum(per_writer - len(store.attempts(f"writer-w{i}")) for i in range(count))
    appends = [float(o[1]) for o in outs]
    return {
        "writers": count,
        "records": count * per_writer,
        "wall_s": wall,
        "open_s_max": max(float(o[0]) for o in outs),
        "append_s_max": max(appends),
        "records_per_s": count * per_writer / max(appends),
        "lost": lost,
    }


def du(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--queries", type=int, default=200, help="retrievals timed")
    parser.add_argument("--budget", type=int, default=4000, help="token budget per retrieval")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--per-writer", type=int, default=250, help="attempts each writer records")
    parser.add_argument(
        "--batch", type=int, default=20000, help="records per bulk append while building"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dir", type=Path, help="store directory (default: a temporary one, removed)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the store afterwards")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="kope-scale-"))
    figures: dict[str, object] = {"store": str(root)}
    try:
        print(
            f"building {args.attempts} attempts over {args.tasks} tasks in {root} ...", flush=True
        )
        figures["build"] = build(root, args.attempts, args.tasks, args.seed, args.batch)
        print(json.dumps(figures["build"]), flush=True)
        figures["disk_bytes"] = {
            "log": (root / "experience.log").stat().st_size,
            "snapshot": (root / "snapshot.kope").stat().st_size,
            "artifacts": du(root / "artifacts"),
        }
        print(json.dumps(figures["disk_bytes"]), flush=True)
        probe = [
            sys.executable,
            "-c",
            PROBE,
            str(root),
            str(args.seed),
            str(args.queries + 1),
            str(args.budget),
        ]
        runs = [
            json.loads(subprocess.run(probe, capture_output=True, text=True, check=True).stdout)
            for _ in range(3)
        ]
        figures["open_s_median_of_3"] = statistics.median(r["open_s"] for r in runs)
        figures["probe"] = runs[-1]
        print(json.dumps(figures["probe"]), flush=True)
        figures["append"] = writers(root, args.writers, args.per_writer)
        print(json.dumps(figures["append"]), flush=True)
        # The writers' records are now a tail after the snapshot: open once more.
        tail = json.loads(
            subprocess.run(
                probe[:5] + ["3", str(args.budget)], capture_output=True, text=True, check=True
            ).stdout
        )
        figures["open_s_with_tail"] = tail["open_s"]
        print(json.dumps({k: v for k, v in figures.items() if not isinstance(v, dict)}, indent=2))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
