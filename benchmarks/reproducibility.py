"""Same seed, same machine: the same verdicts and winners, and speedups within their spread?

    python benchmarks/reproducibility.py [--ops a,b,...] [--budget 4] [--report out.json]

Runs `kope bench` on the suite (by default one operator per family) twice from fresh stores
with the same seed, then compares operator by operator: the agent's decisions and verdicts in
order, the winner, and the speedup over eager (the difference against the spread of the two
runs' own timings is what says whether a change is noise).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from context_ablation import DEFAULT_OPS, ROOT  # noqa: E402

from kope.frontend.compiler import target_for  # noqa: E402
from kope.tools.bench import BenchConfig, run_bench, scratch_dir, write_json  # noqa: E402
from kope.tools.suite import load_suite  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=DEFAULT_OPS)
    parser.add_argument("--budget", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report")
    parser.add_argument(
        "--compare", metavar="REPORT", help="print the comparison of a saved report"
    )
    args = parser.parse_args()
    if args.compare:
        runs = json.loads(Path(args.compare).read_text())["runs"]
    else:
        suite = load_suite(ROOT / "benchmarks" / "suite")
        suite = {n: suite[n] for n in args.ops.split(",")}
        target = target_for("cpu", 1, 60.0)
        config = BenchConfig(target, args.budget, [args.seed], progress=False)
        runs = [run_bench(suite, config, scratch_dir("kope-repro-")) for _ in range(2)]
        target.close()
    compare(runs)
    if args.report:
        write_json({"runs": runs}, Path(args.report))
    return 0


def compare(runs: list[dict[str, Any]]) -> None:
    """Operator by operator: the same decisions, verdicts and winner? And is the change of its
    speedup larger than the drift of its eager time between the runs (the same ATen call,
    timed the same way: what the machine alone moved)?"""
    first, second = ({(r["name"], r["key"]): r for r in run["operators"]} for run in runs)
    same_verdicts = same_winner = within = 0
    print(
        f"{'operator':58} {'decisions+verdicts':18} {'winner':10} "
        f"{'speedup 1st / 2nd':18} eager drift"
    )
    for key, a in first.items():
        b = second[key]
        verdicts = a["attempt_verdicts"] == b["attempt_verdicts"]
        decisions = a["attempt_decisions"] == b["attempt_decisions"]
        winner = a["winner"] == b["winner"] and _kernel(a) == _kernel(b)
        same_verdicts += verdicts and decisions
        same_winner += winner
        change = _change(a["speedup_vs_eager"], b["speedup_vs_eager"])
        drift = _change(a["eager_us"], b["eager_us"])
        within += change is not None and drift is not None and change <= max(drift, 0.05)
        print(
            f"{a['name'] + ': ' + a['label']:58.58} "
            f"{'same' if verdicts and decisions else 'DIFFERENT':18} "
            f"{'same' if winner else 'DIFFERENT':10} "
            f"{a['speedup_vs_eager'] or 0:.2f}x / {b['speedup_vs_eager'] or 0:.2f}x"
            f"{'':6} {'-' if drift is None else f'{drift:.0%}'}"
        )
    print(
        f"{same_verdicts} of {len(first)} operators with the same decisions and verdicts; "
        f"{same_winner} with the same winner; {within} whose speedup moved no more than their "
        "eager time drifted between the runs (or 5%)"
    )


def _kernel(row: dict[str, Any]) -> str:
    """The winning configuration, without the reason the search gave for trying it ("rows, 2
    threads (exploring)" and "rows, 2 threads (changes threads of the best so far)" are one
    kernel reached by two paths), nor the id of the attempt a confirmation re-measured."""
    decision = str(row["best_decision"] or "")
    decision = re.sub(r"^confirms attempt-[0-9a-f]+: ", "", decision)  # ids differ run to run
    return re.sub(r" \([^()]*\)$", "", decision)


def _change(a: float | None, b: float | None) -> float | None:
    """|log(b / a)| as a fraction (0.1: the larger is 10% above the smaller)."""
    if not a or not b:
        return None
    return math.exp(abs(math.log(b / a))) - 1.0


if __name__ == "__main__":
    sys.exit(main())
