"""How big is the heuristic agent's space, and how far does a long search beat its first pick?

    python benchmarks/space_report.py [--suite benchmarks/suite] [--budget 64] [--sizes-only]
                                      [--ops A,B] [--report space.json]

Per operator of the suite (each file's distinct Tasks, on this machine's CPU target): the
kernel family its schedules belong to and the size of its space (the core grid, the widened
points, and every point in all). Then, unless `--sizes-only`, a precompile of the suite at
`--budget` attempts per operator (static prior, one store per operator: no memory) and, per
operator, the best clean speedup over eager against the first attempt's: how far the space's
best found by a long search lies above the prior's first pick. Printed per family: operators,
the median and largest space, and the geomean of best / first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from functools import partial
from pathlib import Path

from kope.agents.search import Space
from kope.frontend.compiler import target_for
from kope.memory.store import ExperienceStore
from kope.passes.analysis import analyze, prepare_payload
from kope.spaces.cpu import renders, schedule_space
from kope.tools.precompile import geomean, precompile, trace_tasks
from kope.tools.suite import load_suite
from kope.tuner.optimize import Budget, is_proposal, task_view
from kope.vocabulary.evidence import TIMING_CLEAN, VERIFIED

HERE = Path(__file__).resolve().parent


def space_of(task, target) -> tuple[str, int, int, int]:
    """(family, core points, widened points, reachable configurations) of a Task's schedule
    space: reachable counts every combination of the decisions' values that renders, what
    the search's mutations can reach beyond the grid."""
    view = task_view(task, target)
    info = analyze(prepare_payload(view.payload))
    points, widened = schedule_space(info, view.capabilities)
    family = str(points[0][0]["family"]) if points else "none"
    space = Space(points, widened, partial(renders, info, view.capabilities))
    reachable = 0
    for schema in {tuple(sorted(k for k in config if k != "family")) for config, _ in points}:
        values = space.values()
        for combo in itertools.product(*(values[key] for key in schema)):
            config = {"family": family, **dict(zip(schema, combo, strict=True))}
            reachable += space.can_render(config)
    return family, len(points) - len(widened), len(widened), reachable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", type=Path, default=HERE / "suite")
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--ops", help="only these suite entries, comma-separated")
    parser.add_argument("--sizes-only", action="store_true", help="no search: the sizes alone")
    parser.add_argument("--report", type=Path, default=Path("space.json"))
    args = parser.parse_args()
    suite = load_suite(args.suite)
    if args.ops:
        suite = {n: f for n, f in suite.items() if n in args.ops.split(",")}
    target = target_for("cpu", 1, 60.0)
    work = Path(tempfile.mkdtemp(prefix="kope-space-"))
    rows: list[dict] = []
    seen: set[str] = set()
    for index, (name, factory) in enumerate(suite.items()):
        model, inputs = factory()
        tasks = [t for t in trace_tasks(model, inputs, target) if t.key not in seen]
        seen.update(t.key for t in tasks)
        store = ExperienceStore(work / f"{index:03d}")
        if not args.sizes_only and tasks:
            precompile(
                model, inputs, target=target, store=store, budget=Budget(args.budget),
                progress=False, decide_graph=False,
            )  # fmt: skip
        for task in tasks:
            family, core, wide, reachable = space_of(task, target)
            row = {"name": name, "label": task.label, "family": family, "core": core}
            row |= {"widened": wide, "size": core + wide, "reachable": reachable}
            attempts = [a for a in store.attempts(task.key) if is_proposal(a, "heuristic")]
            speeds = [
                a.speedup_vs_eager if a.verdict == VERIFIED and a.timing_quality == TIMING_CLEAN
                else None
                for a in attempts
            ]  # fmt: skip
            if speeds and speeds[0] and any(speeds):
                row["first"], row["best"] = speeds[0], max(s for s in speeds if s)
                row["best_at"] = speeds.index(row["best"]) + 1
            rows.append(row)
            print(json.dumps(row), flush=True)
    by_family: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_family[row["family"]].append(row)
    summary = {}
    print(
        f"\n{'family':<12} {'ops':>4} {'median size':>12} {'largest':>8} {'reachable':>10}  "
        "best / first"
    )
    for family, members in sorted(by_family.items()):
        sizes = [r["size"] for r in members]
        gain = geomean([r["best"] / r["first"] for r in members if "best" in r])
        summary[family] = {
            "operators": len(members),
            "median_size": statistics.median(sizes),
            "largest": max(sizes),
            "median_reachable": statistics.median(r["reachable"] for r in members),
            "best_over_first": gain,
        }
        shown = f"{gain:.3f}x" if gain else "-"
        median = statistics.median(sizes)
        reach = statistics.median(r["reachable"] for r in members)
        print(f"{family:<12} {len(members):>4} {median:>12} {max(sizes):>8} {reach:>10}  {shown}")
    overall = geomean([r["best"] / r["first"] for r in rows if "best" in r])
    if overall:
        print(f"all: best found in {args.budget} attempts / first pick, geomean {overall:.3f}x")
    args.report.write_text(json.dumps({"rows": rows, "families": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
