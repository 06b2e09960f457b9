"""Cross-model transfer: does what one model taught speed up the next one's optimization?

    python benchmarks/transfer.py [--first gpt2_mlp] [--second llm_block] [--budget 4]
                                  [--seeds 0] [--report out.json]

`kope bench`'s memory ablation on a two-model suite (models of `benchmarks/e2e.py`): the
`memory_on` arm precompiles the first model and then the second on one store (warm), the
`memory_off` arm the second on an empty store, at equal budget; the winners of the second
model's operators are re-timed together. Printed: the second model's per-operator speedups
and attempts in each arm, its geomean speedup, and attempts to reach 90% of the best kernel.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e import MODELS  # noqa: E402 (the models live beside this script)

from kope.frontend.compiler import target_for  # noqa: E402
from kope.tools.bench import (  # noqa: E402
    BenchConfig,
    attempts_to_reach,
    format_bench,
    run_bench,
    scratch_dir,
    write_json,
)
from kope.tools.precompile import geomean  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", default="gpt2_mlp", choices=sorted(MODELS))
    parser.add_argument("--second", default="llm_block", choices=sorted(MODELS))
    parser.add_argument("--budget", type=int, default=4)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--report")
    args = parser.parse_args()
    target = target_for("cpu", 1, 60.0)
    config = BenchConfig(
        target, args.budget, [int(s) for s in args.seeds.split(",")], ablate="memory"
    )
    suite = {args.first: MODELS[args.first], args.second: MODELS[args.second]}
    report = run_bench(suite, config, scratch_dir("kope-transfer-"), "transfer")
    print(format_bench(report))
    second = [r for r in report["operators"] if r["name"] == args.second]
    print(f"\nthe second model ({args.second}), after {args.first} on the warm store:")
    reach = attempts_to_reach(second, args.budget)
    for arm in config.arms:
        rows = [r for r in second if r["arm"] == arm]
        needed = [reach[k] for k in reach if k[0] == arm]
        speed = geomean([r["speedup_vs_eager"] for r in rows])
        attempts = statistics.mean(r["attempts"] for r in rows)
        print(
            f"  {arm}: geomean {speed or 0:.2f}x eager over {len(rows)} operators, "
            f"{attempts:.1f} attempts per operator, "
            f"{statistics.mean(needed) if needed else float('nan'):.2f} attempts to 90% of the "
            "best kernel either arm found"
        )
    if args.report:
        write_json(report, Path(args.report))
    target.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
