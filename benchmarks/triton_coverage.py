"""Which operators of real models get a verified Triton kernel, on the cuda and ascend targets,
and on cuda whether Triton's real compiler takes it for the GPU architectures.

    python benchmarks/triton_coverage.py [--targets cuda,ascend] [--models mlp,cnn,...]
                                         [--e2e] [--suite DIR] [--budget 3] [--json out.json]

For each model (the built-in examples; with --e2e also benchmarks/e2e.py's six; with --suite
the operator files of DIR, e.g. benchmarks/suite) and target, `kope precompile` with the
heuristic agent into a fresh store, then per operator: verified Triton kernels, or the reason
there is none. Without the device this runs under Triton's interpreter, so it measures
correctness coverage, not speed (nothing is timed). The share is of distinct operators
(Tasks) with at least one verified kernel. On cuda each kernel the interpreter verified is
also compiled for the architectures of `KOPE_CUDA_ARCH` (default sm_80, sm_90): the second
share is of operators with a kernel that compiles and fits every one of them, with the
compiler's refusals counted by reason and the kernels' registers, spills and shared memory.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kope.memory.store import ExperienceStore
from kope.spaces.triton_kernels import unsupported_reason
from kope.targets import get_target
from kope.tools.precompile import precompile, trace_tasks
from kope.tools.suite import load_suite
from kope.tools.zoo import ZOO
from kope.tuner.optimize import Budget


def models(with_e2e: bool, suite: Path | None) -> dict[str, Any]:
    found: dict[str, Any] = {} if suite else dict(ZOO)
    if suite:
        found.update(load_suite(suite))
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
        store = ExperienceStore(Path(home))
        report = precompile(
            model,
            inputs,
            target=target,
            store=store,
            budget=Budget(attempts=budget),
            progress=False,
        )
        wall_s = time.monotonic() - started
        compiled = device_compiles(store)
    tasks = {t.key: t for t in trace_tasks(model, inputs, target)}
    target.close()
    rows = []
    for row in report["operators"]:
        verified = row["verdicts"].get("verified", 0)
        why = ""
        if not verified:
            task = tasks.get(row["key"])
            reason = task and unsupported_reason(
                task.payload, task.spec.inputs, task.spec.outputs, target.kernel_rules()
            )
            why = reason or ", ".join(f"{k}:{v}" for k, v in row["verdicts"].items()) or "none"
        mine = compiled.get(row["key"], {"interpreted": 0, "compiled": 0})
        counts = {"interpreted": mine["interpreted"], "compiled": mine["compiled"]}
        rows.append({"label": row["label"], "verified": verified, "why": why, **counts})
    covered = sum(1 for r in rows if r["verified"] or r["interpreted"])
    return {
        "model": name,
        "target": target_name,
        "operators": len(rows),
        "covered": covered,
        "device_compiled": sum(1 for r in rows if r["compiled"]),
        "kernels": [k for per in compiled.values() for k in per["kernels"]],
        "eager": report["eager"],
        "rows": rows,
        "wall_s": wall_s,
    }


def device_compiles(store: ExperienceStore) -> dict[str, dict[str, Any]]:
    """Per task: kernels the interpreter verified, those of them Triton's compiler took for
    every architecture, and each one's compile records."""
    found: dict[str, dict[str, Any]] = {}
    for task in store.tasks():
        per = found.setdefault(task.key, {"interpreted": 0, "compiled": 0, "kernels": []})
        for attempt in store.attempts(task.key):
            if attempt.source != "agent" or attempt.device_compile is None:
                continue
            per["interpreted"] += 1
            ok = all(r["ok"] for r in attempt.device_compile.values())
            per["compiled"] += ok
            per["kernels"].append(attempt.device_compile)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="cuda,ascend")
    parser.add_argument("--models", default="")
    parser.add_argument("--e2e", action="store_true", help="add benchmarks/e2e.py's models")
    parser.add_argument("--suite", type=Path, help="a suite directory, instead of the zoo")
    parser.add_argument("--budget", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    known = models(args.e2e, args.suite)
    names = args.models.split(",") if args.models else list(known)
    results = []
    for target_name in args.targets.split(","):
        for name in names:
            result = coverage(name, known[name], target_name, args.budget)
            results.append(result)
            compiled = (
                f", {result['device_compiled']} with one Triton's compiler takes"
                if result["kernels"]
                else ""
            )
            print(
                f"{target_name:7} {name:22} {result['covered']}/{result['operators']} operators "
                f"with a verified Triton kernel{compiled} ({result['wall_s']:.0f} s)",
                flush=True,
            )
            for row in result["rows"]:
                if not row["verified"]:
                    print(f"        no kernel: {row['label'][:70]}: {row['why'][:100]}")
    for target_name in args.targets.split(","):
        mine = [r for r in results if r["target"] == target_name]
        covered, total = sum(r["covered"] for r in mine), sum(r["operators"] for r in mine)
        print(f"{target_name}: {covered}/{total} operators ({covered / max(total, 1):.0%})")
        kernels = [k for r in mine for k in r["kernels"]]
        if kernels:
            summarize_compiles(target_name, mine, kernels)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def summarize_compiles(target: str, results: list[dict[str, Any]], kernels: list[Any]) -> None:
    """The compiler's verdicts over every kernel the interpreter verified."""
    compiled = sum(r["device_compiled"] for r in results)
    total = sum(r["operators"] for r in results)
    ok = [k for k in kernels if all(r["ok"] for r in k.values())]
    print(
        f"{target}: {compiled}/{total} operators ({compiled / max(total, 1):.0%}) with a kernel "
        f"Triton's compiler takes for {', '.join(sorted(kernels[0]))}; {len(ok)}/{len(kernels)} "
        "kernels"
    )
    reasons: Counter[str] = Counter()
    for kernel in kernels:
        for arch, record in sorted(kernel.items()):
            if not record["ok"]:
                reasons[f"{arch}: {_reason(record['error'] or '')}"] += 1
    for reason, count in reasons.most_common():
        print(f"    refused {count:3d}x  {reason}")
    for arch in sorted(kernels[0]):
        done = [k[arch] for k in kernels if k[arch].get("registers") is not None]
        if not done:
            continue
        registers = sorted(r["registers"] for r in done)
        spilling = sum(1 for r in done if r["spills"])
        print(
            f"    {arch}: registers median {registers[len(registers) // 2]}, max {registers[-1]}; "
            f"shared memory max {max(r['shared_bytes'] for r in done)} bytes; "
            f"{spilling} of {len(done)} compiled kernels spill"
        )


def _reason(error: str) -> str:
    """An error's kind, without the kernel's own names and numbers."""
    kind = error.split(": ", 1)[-1]
    return re.sub(r"\d+", "N", kind)[:90]


if __name__ == "__main__":
    main()
