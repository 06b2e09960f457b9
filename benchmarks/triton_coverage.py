"""Which operators of real models get a verified Triton kernel, on the cuda and ascend targets.

    python benchmarks/triton_coverage.py [--targets cuda,ascend] [--models mlp,cnn,...]
                                         [--e2e] [--budget 3] [--json out.json]

For each model (the built-in examples; with --e2e also benchmarks/e2e.py's six) and target,
`kope precompile` with the heuristic agent into a fresh store, then per operator: verified
Triton kernels, or the reason there is none. Without the device this runs under Triton's
interpreter, so it measures correctness coverage, not speed (nothing is timed). The share is
of distinct operators (Tasks) with at least one verified kernel.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kope.agents.triton_kernels import unsupported_reason
from kope.memory.store import ExperienceStore
from kope.optimize import Budget
from kope.precompile import precompile, trace_tasks
from kope.targets import get_target
from kope.zoo import ZOO


def models(with_e2e: bool) -> dict[str, Any]:
    found: dict[str, Any] = dict(ZOO)
    if with_e2e:
        sys.path.insert(0, str(Path(__file__).parent))
        from e2e import MODELS

        found.update(MODELS)
    return found


def coverage(name: str, factory: Any, target_name: str, budget: int) -> dict[str, Any]:
    model, inputs = factory()
    target = get_target(target_name, workers=1, timeout_s=120.0)
    with tempfile.TemporaryDirectory() as home:
        started = time.monotonic()
        report = precompile(
            model,
            inputs,
            target=target,
            store=ExperienceStore(Path(home)),
            budget=Budget(attempts=budget),
            progress=False,
        )
        wall_s = time.monotonic() - started
    tasks = {t.key: t for t in trace_tasks(model, inputs, target)}
    target.close()
    rows = []
    for row in report["operators"]:
        verified = row["verdicts"].get("verified", 0)
        why = ""
        if not verified:
            task = tasks.get(row["key"])
            reason = task and unsupported_reason(
                task.payload, task.spec.inputs, task.spec.outputs, target.capabilities()
            )
            why = reason or ", ".join(f"{k}:{v}" for k, v in row["verdicts"].items()) or "none"
        rows.append({"label": row["label"], "verified": verified, "why": why})
    covered = sum(1 for r in rows if r["verified"])
    return {
        "model": name,
        "target": target_name,
        "operators": len(rows),
        "covered": covered,
        "eager": report["eager"],
        "rows": rows,
        "wall_s": wall_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="cuda,ascend")
    parser.add_argument("--models", default="")
    parser.add_argument("--e2e", action="store_true", help="add benchmarks/e2e.py's models")
    parser.add_argument("--budget", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    known = models(args.e2e)
    names = args.models.split(",") if args.models else list(known)
    results = []
    for target_name in args.targets.split(","):
        for name in names:
            result = coverage(name, known[name], target_name, args.budget)
            results.append(result)
            print(
                f"{target_name:7} {name:22} {result['covered']}/{result['operators']} operators "
                f"with a verified Triton kernel ({result['wall_s']:.0f} s)"
            )
            for row in result["rows"]:
                if not row["verified"]:
                    print(f"        no kernel: {row['label'][:70]}: {row['why'][:100]}")
    for target_name in args.targets.split(","):
        mine = [r for r in results if r["target"] == target_name]
        covered, total = sum(r["covered"] for r in mine), sum(r["operators"] for r in mine)
        print(f"{target_name}: {covered}/{total} operators ({covered / max(total, 1):.0%})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
