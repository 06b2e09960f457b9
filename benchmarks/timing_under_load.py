"""How do timings look beside 2x load? A store's chosen kernels and eager, round by round.

    python benchmarks/timing_under_load.py STORE [--ops layer_norm,elementwise_chain]
        [--repeats 3] [--quiet] [--report out.json]

STORE is a store that `kope.suite` operators were precompiled into (e.g. the `quiet/default-seed0`
store `benchmarks/noisy_neighbour.py` leaves in its scratch folder). Each operator's chosen kernel
is evaluated against eager `--repeats` times in this process, beside `noisy_neighbour`'s competing
load (2 x cores busy processes; `--quiet`: without it). Printed per evaluation: the timing's
quality and clean rounds, the speedup of the medians, and per callable how many of its samples
no wait disturbed, with their median. The per-round samples, walls and waits go to `--report`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

import kope.targets.measure as measure
from kope.memory.store import ExperienceStore
from kope.targets import get_target
from kope.targets.cpu import CpuTarget
from kope.targets.evaluation import EvalJob, evaluate_job
from kope.tools.precompile import trace_tasks
from kope.tools.suite import OPSET
from kope.tuner.selection import choose

sys.path.insert(0, str(Path(__file__).parent))
from noisy_neighbour import competing_load  # noqa: E402


def undisturbed(rounds: list[Any], name: str, config: measure.MeasureConfig) -> list[float]:
    """The per-call µs of `name`'s samples that waited no longer than the detector allows."""
    kept = []
    for r in rounds:
        wait, wall = r.wait_s.get(name), r.wall_s.get(name)
        if wall is not None and wait is not None:
            if wait <= max(config.wait_floor_s, config.wait_share_limit * wall):
                kept.append(r.per_call_us[name])
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("--ops", default="layer_norm,elementwise_chain,matmul_512")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quiet", action="store_true", help="no competing load")
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    target = get_target("cpu")
    store = ExperienceStore(args.store)
    jobs = {}
    for name in args.ops.split(","):
        model, inputs = OPSET[name]()
        (task,) = trace_tasks(model, inputs, target)[:1]
        choice = choose(task, target, store, "auto")
        if choice.source is None:
            print(f"{name}: eager runs, nothing to time")
            continue
        threads = torch.get_num_threads()
        jobs[name] = EvalJob(CpuTarget, task.spec, choice.source, None, True, 0, threads)
    target.close()
    rounds: list[Any] = []
    original = measure._round

    def recorded(*a: Any, **k: Any) -> Any:
        result = original(*a, **k)
        rounds.append(result)
        return result

    measure._round = recorded  # type: ignore[assignment]
    report: dict[str, list[dict[str, Any]]] = {}
    load = contextlib.nullcontext() if args.quiet else competing_load()
    with load:
        for _ in range(args.repeats):
            for name, job in jobs.items():
                rounds.clear()
                evaluation = evaluate_job(job, lambda _: None)
                kernel, eager = evaluation.kernel, evaluation.eager
                if kernel is None or eager is None:
                    print(f"{name}: {evaluation.verdict}")
                    continue
                line = [
                    f"{name}: {kernel.quality} {kernel.clean_rounds}/{kernel.rounds} rounds, "
                    f"{eager.median_us / kernel.median_us:.2f}x (eager {eager.median_us:.1f} µs, "
                    f"kernel {kernel.median_us:.1f} µs)"
                ]
                for callee in ("eager", "kernel"):
                    kept = undisturbed(rounds, callee, job.config)
                    median = f"{statistics.median(kept):.1f} µs" if kept else "-"
                    line.append(
                        f"{callee} {len(kept)}/{len(rounds)} samples undisturbed ({median})"
                    )
                print("; ".join(line), flush=True)
                report.setdefault(name, []).append(
                    {
                        "quality": kernel.quality,
                        "speedup": eager.median_us / kernel.median_us,
                        "rounds": [[r.per_call_us, r.wall_s, r.wait_s] for r in rounds],
                    }
                )
    if args.report:
        args.report.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
