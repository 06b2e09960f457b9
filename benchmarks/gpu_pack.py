"""The kernel pack the first GPU runs: the e2e models' operators, precompiled for the cuda
target here, each operator's best-estimated kernels exported, and (with --rehearse) the
pack's runner run here under Triton's interpreter, as `benchmarks/gpu_check.sh` runs it there.

    python benchmarks/gpu_pack.py [--out gpu-pack] [--store DIR] [--budget 3] [--per-task 1]
                                  [--models llm_block,...] [--rehearse]

Every kernel in the pack verified under the interpreter and compiled for the architectures
of `KOPE_CUDA_ARCH` (default sm_80, sm_90) with nothing refused; `--per-task` keeps each
operator's best roofline estimates, so that the device run stays short (the device check
allows itself 8 minutes; the goal is 4). On the GPU's machine:

    bash benchmarks/gpu_check.sh gpu-pack          # then, back here:
    kope memory import-results gpu-pack/results.json --store DIR

The device's figures then replace the estimates, and `estimate_rank` below (run with
--check RESULTS) says how well the estimates ordered each operator's kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kope.memory.store import ExperienceStore
from kope.targets import get_target
from kope.targets.device_compile import estimate_of
from kope.tools.kernel_pack import export_pack
from kope.tools.precompile import precompile
from kope.tuner.optimize import Budget

sys.path.insert(0, str(Path(__file__).parent))
from e2e import MODELS, _model  # noqa: E402


def prepare(store: Path, models: list[str], budget: int) -> None:
    target = get_target("cuda", workers=1, timeout_s=120.0)
    try:
        for name in models:
            model, inputs = _model(name)
            started = time.monotonic()
            report = precompile(
                model,
                inputs,
                target=target,
                store=ExperienceStore(store),
                budget=Budget(attempts=budget),
                progress=False,
            )
            print(
                f"{name:22} {len(report['operators'])} operators precompiled for cuda "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    finally:
        target.close()


def rehearse(pack: Path) -> dict[str, Any]:
    """The pack's runner here, under Triton's interpreter, in this environment."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(pack / "runner.py"), str(pack), "--timeout-s", "120"],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
    )
    wall_s = time.monotonic() - started
    if done.returncode:
        raise SystemExit(f"the runner failed: {done.stderr[-2000:]}")
    results = json.loads((pack / "results.json").read_text())["results"]
    verdicts: dict[str, int] = {}
    for result in results:
        verdicts[result["verdict"]] = verdicts.get(result["verdict"], 0) + 1
    walls = sorted(r["wall_s"] for r in results)
    return {"wall_s": wall_s, "verdicts": verdicts, "median_kernel_s": walls[len(walls) // 2]}


def estimate_rank(pack: Path, results_path: Path) -> float | None:
    """Kendall's tau between each operator's roofline estimates and the device's timings of
    its kernels, pooled over operators with two or more timed kernels (None: too few)."""
    manifest = json.loads((pack / "manifest.json").read_text())
    results = json.loads(results_path.read_text())["results"]
    measured = {r["kernel"]: r["kernel_us"] for r in results if "kernel_us" in r}
    by_task: dict[str, list[tuple[float, float]]] = {}
    for entry in manifest["kernels"]:
        estimate = estimate_of(entry.get("device_compile"))
        if entry["digest"] in measured and estimate is not None:
            by_task.setdefault(entry["task"], []).append((estimate, measured[entry["digest"]]))
    concordant = discordant = 0
    for pairs in by_task.values():
        for i, (e1, m1) in enumerate(pairs):
            for e2, m2 in pairs[i + 1 :]:
                sign = (e1 - e2) * (m1 - m2)
                concordant += sign > 0
                discordant += sign < 0
    total = concordant + discordant
    return (concordant - discordant) / total if total else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-pack"))
    parser.add_argument("--store", type=Path, default=Path("gpu-store"))
    parser.add_argument("--budget", type=int, default=3)
    parser.add_argument("--per-task", type=int, default=1)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rehearse", action="store_true")
    parser.add_argument("--check", type=Path, help="a device's results.json: rank the estimates")
    args = parser.parse_args()
    if args.check:
        tau = estimate_rank(args.out, args.check)
        print("too few operators with two timed kernels" if tau is None else f"tau {tau:.2f}")
        return
    prepare(args.store, args.models.split(","), args.budget)
    summary = export_pack(ExperienceStore(args.store), "cuda", args.out, per_task=args.per_task)
    print(
        f"pack {summary.path}: {summary.kernels} kernels of {summary.tasks} operators, "
        f"{summary.bytes / 2**20:.1f} MiB; {len(summary.skipped)} left out"
    )
    for label, why in summary.skipped:
        print(f"    left out: {label[:60]}: {why[:100]}")
    if args.rehearse:
        found = rehearse(args.out)
        print(
            f"rehearsal under the interpreter: {found['wall_s']:.0f} s, verdicts "
            f"{found['verdicts']}, median {found['median_kernel_s']:.1f} s per kernel"
        )


if __name__ == "__main__":
    main()
