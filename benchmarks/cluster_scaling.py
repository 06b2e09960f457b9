"""Wall time of `kope precompile` on one machine and over 1 and 2 local Ray workers.

    python benchmarks/cluster_scaling.py [--model transformer_block] [--budget 2]
                                         [--target cpu] [--json out.json]

Arms, each into a fresh store, in turn: `single` (no cluster), `ray-1` (a local Ray cluster
with one CPU: tasks run one at a time) and `ray-2` (two CPUs: two tasks at once, each with
one thread). The cluster's start-up is timed apart from the run. The driver's overhead per
operator is (ray-1 run - single run) / operators: what dispatching, the scratch store and
streaming events cost. On a 2-core machine, ray-2 can at most halve build and verify time,
and timings are serialized per machine (two timings never share cores), so its speedup is
bounded well below 2x; it shows that the fan-out works, not how a cluster of many machines
scales. Run it on a quiet machine (../shared/tools/quiet-check.sh).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import torch

from kope.core.options import Options
from kope.memory.store import ExperienceStore
from kope.targets import get_target
from kope.tools.models import load_model
from kope.tools.precompile import precompile
from kope.tuner.optimize import Budget


def run_arm(model_name: str, target_name: str, budget: int, cpus: int | None) -> dict[str, Any]:
    model, inputs = load_model(model_name)
    target = get_target(target_name, workers=1, timeout_s=120.0)
    started_s = 0.0
    if cpus is not None:
        began = time.perf_counter()
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        started_s = time.perf_counter() - began
    try:
        with tempfile.TemporaryDirectory() as home:
            began = time.perf_counter()
            report = precompile(
                model,
                inputs,
                target=target,
                store=ExperienceStore(Path(home)),
                budget=Budget(attempts=budget),
                progress=False,
                cluster="ray" if cpus is not None else None,
                task_threads=1,
            )
            run_s = time.perf_counter() - began
    finally:
        target.close()
        if cpus is not None:
            ray.shutdown()
    attempts = sum(row["attempts"] for row in report["operators"])
    return {
        "operators": len(report["operators"]),
        "attempts": attempts,
        # Timing rounds the chosen figures needed: disturbed rounds are rerun, so work beside
        # a timing (the other task's builds) shows here as extra rounds.
        "rounds": sum(row.get("rounds", 0) for row in report["operators"]),
        "clean_rounds": sum(row.get("clean_rounds", 0) for row in report["operators"]),
        "run_s": run_s,
        "start_s": started_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="transformer_block")
    parser.add_argument("--budget", type=int, default=2)
    parser.add_argument("--target", default=Options.default("target"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as each cluster task measures: the arms compare like with like
    arms = {"single": None, "ray-1": 1, "ray-2": 2}
    results = {name: run_arm(args.model, args.target, args.budget, c) for name, c in arms.items()}
    for name, r in results.items():
        start = f", cluster start {r['start_s']:.1f} s" if r["start_s"] else ""
        print(
            f"{name:7} {r['operators']} operators, {r['attempts']} attempts: "
            f"{r['run_s']:.1f} s{start}; timing rounds {r['clean_rounds']} clean of "
            f"{r['rounds']}"
        )
    single, one, two = results["single"], results["ray-1"], results["ray-2"]
    overhead = (one["run_s"] - single["run_s"]) / max(one["operators"], 1)
    print(f"driver overhead per operator (ray-1 - single): {overhead:.2f} s")
    print(f"ray-2 vs ray-1: {one['run_s'] / two['run_s']:.2f}x faster")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
