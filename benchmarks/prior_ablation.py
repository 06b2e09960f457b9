"""Does experience replace hand knowledge? Issue 44's goals on the held-out suite.

    python benchmarks/prior_ablation.py [--warm-store DIR] [--budget 4] [--seeds 0,1,2]
                                        [--memory] [--cost 16] [--cost-seeds 0,1,2]
                                        [--no-prior]
                                        [--report out.json]

1. The warm store: `kope precompile FILE --prior flat --budget 4 --store DIR` over every file
   of `benchmarks/suite/` (skipped when `--warm-store DIR` already holds a store, so a second
   run measures against the same experience).
2. `kope bench --suite benchmarks/heldout --ablate prior --warm-store DIR`: the static prior and
   the flat prior, each from an empty store per operator, against the flat prior starting
   from a copy of the warm store (`flat_warm`), on operators the agent was not developed on.
   Goal: flat_warm >= 0.97x static's geomean speedup over eager.
3. With `--memory`, also `kope bench --suite benchmarks/heldout --ablate memory --warm-store
   DIR` (static prior): goal memory_on >= 1.2x memory_off, pass rate not lower.
4. With `--cost N`, also the memory ablation at budget N (16: the goal's) and one seed per
   `--cost-seeds` (default 0): whether the warm arm after N / 4 attempts reaches the cold
   arm's geomean after all N. Two readings: (a) each arm's best kernel at those points
   re-timed against eager in one interleaved round per operator (`kope bench --checkpoint`),
   warm / cold >= 1.0 meets the goal; (b) the curves by each attempt's own clean figure, and
   the attempts after which the warm curve reaches the cold curve's end. (b) compares the
   best of N noisy figures against the best of N / 4: it reads the cold search high.

Run it on a quiet machine (`shared/tools/quiet-check.sh`) with nothing else running: every
arm's winners are re-timed together, but the search itself reads the figures it measures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kope.tools.cli import main as kope
from kope.tools.precompile import geomean

HERE = Path(__file__).resolve().parent
SUITE, HELD_OUT = HERE / "suite", HERE / "heldout"
GOAL_PRIOR, GOAL_MEMORY = 0.97, 1.2


def gather(store: Path, budget: int) -> float:
    """Precompile every suite file into `store` with the flat prior; the wall time."""
    start = time.monotonic()
    for path in sorted(SUITE.glob("[!_]*.py")):
        argv = ["precompile", str(path), "--prior", "flat", "--budget", str(budget)]
        if kope([*argv, "--store", str(store)]) != 0:
            print(f"warm store: {path.name} failed; the store keeps what it recorded")
    return time.monotonic() - start


def bench(ablate: str, warm: Path, budget: int, seeds: str, report: Path, *more: str) -> dict:
    argv = ["bench", "--suite", str(HELD_OUT), "--ablate", ablate, "--warm-store", str(warm)]
    kope([*argv, "--budget", str(budget), "--seeds", seeds, "--report", str(report), *more])
    return json.loads(report.read_text())


def curve(report: dict, arm: str, budget: int) -> list[float]:
    """The arm's geomean over operators (and seeds) of the best speedup so far after each
    attempt: 1.0 where no kernel beats eager yet (eager runs)."""
    rows = [r for r in report["operators"] if r["arm"] == arm]
    points = []
    for i in range(budget):
        best = []
        for r in rows:
            seen = [s for s in r["trajectory"][: i + 1] if s]
            best.append(max([1.0, *seen]))
        points.append(geomean(list(best)) or 1.0)
    return points


def cost_figures(warm: Path, budget: int, seed: str, report: Path) -> dict:
    """The memory ablation at `budget`, one seed, with each arm's best after budget / 4
    attempts re-timed with the winners (see the module docstring, item 4)."""
    checkpoint = max(budget // 4, 1)
    path = report.with_suffix(f".cost{seed}.json")
    cost = bench("memory", warm, budget, seed, path, "--checkpoint", str(checkpoint))
    cold, hot = curve(cost, "memory_off", budget), curve(cost, "memory_on", budget)
    warm_early = cost["arms"]["memory_on"]["geomean_after_checkpoint"]
    cold_final = cost["arms"]["memory_off"]["geomean_speedup_vs_eager"]
    return {
        "seed": seed,
        "checkpoint": checkpoint,
        "warm_at_checkpoint": warm_early,
        "cold_final": cold_final,
        "warm/cold": warm_early / cold_final,
        "cold": cold,
        "warm": hot,
        "warm_attempts_to_cold_final": next(
            (i + 1 for i, g in enumerate(hot) if g >= cold[-1]), None
        ),
    }


def ratio(report: dict, arm: str, base: str) -> float:
    arms = report["arms"]
    return arms[arm]["geomean_speedup_vs_eager"] / arms[base]["geomean_speedup_vs_eager"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm-store", type=Path, help="the warm store (gathered if empty)")
    parser.add_argument("--budget", type=int, default=4)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--memory", action="store_true", help="also the memory ablation")
    parser.add_argument("--cost", type=int, metavar="N", help="also the cost at budget N")
    parser.add_argument("--cost-seeds", default="0", help="the seeds of --cost, one run each")
    parser.add_argument("--no-prior", action="store_true", help="skip the prior ablation")
    parser.add_argument("--report", type=Path, default=Path("prior_ablation.json"))
    args = parser.parse_args()
    warm = args.warm_store or Path(f"kope-warm-store-b{args.budget}")
    if not (warm / "experience.log").is_file():
        took = gather(warm, args.budget)
        print(f"warm store: {warm}, gathered in {took:.0f} s")
    figures: dict = {"warm_store": str(warm), "budget": args.budget, "seeds": args.seeds}
    if not args.no_prior:
        path = args.report.with_suffix(".prior.json")
        prior = bench("prior", warm, args.budget, args.seeds, path)
        figures["flat_warm/static"] = ratio(prior, "flat_warm", "static")
        figures["flat/static"] = ratio(prior, "flat", "static")
        figures["arms"] = {a: prior["arms"][a] for a in prior["arms"]}
    if args.memory:
        memory = bench(
            "memory", warm, args.budget, args.seeds, args.report.with_suffix(".memory.json")
        )
        figures["memory_on/memory_off"] = ratio(memory, "memory_on", "memory_off")
        figures["memory_arms"] = {a: memory["arms"][a] for a in memory["arms"]}
    if args.cost:
        figures["cost"] = [
            cost_figures(warm, args.cost, seed, args.report) for seed in args.cost_seeds.split(",")
        ]
    args.report.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    if not args.no_prior:
        print(
            f"\nflat_warm / static: {figures['flat_warm/static']:.3f}x (goal >= {GOAL_PRIOR}); "
            f"flat / static: {figures['flat/static']:.3f}x"
        )
    if args.memory:
        print(
            f"memory_on / memory_off: {figures['memory_on/memory_off']:.3f}x "
            f"(goal >= {GOAL_MEMORY})"
        )
    for cost in figures.get("cost", []):
        print(
            f"cost, seed {cost['seed']}: the warm store after {cost['checkpoint']} attempts "
            f"against the cold agent after {args.cost}, re-timed together: "
            f"{cost['warm_at_checkpoint']:.3f}x vs {cost['cold_final']:.3f}x eager = "
            f"{cost['warm/cold']:.3f}x (goal >= 1.0); by own figures the cold curve ends at "
            f"{cost['cold'][-1]:.3f}x, reached by the warm one after "
            f"{cost['warm_attempts_to_cold_final'] or 'never'}; warm curve "
            + " ".join(f"{g:.2f}" for g in cost["warm"])
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
