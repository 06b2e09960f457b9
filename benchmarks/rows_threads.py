"""Rows operators of middling work: does the agent find their thread count within its budget?

    python benchmarks/rows_threads.py [--budget 8] [--ops layer_norm,gelu,...]

Each operator (32k-64k elements: half of the heuristic agent's `BIG_WORK` to it, where one
thread or two may win) is `kope precompile`d alone into a fresh store at `--budget`; printed:
the winner, its speedup over eager, and how many of the store's records (attempts and
confirmations) ran on one thread and on more.
The figures are the precompile's own clean confirmations (kernel and eager timed interleaved
in one worker). Run it on a quiet machine (`../shared/tools/quiet-check.sh`).
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from kope.frontend.compiler import store_at, target_for
from kope.tools.precompile import geomean, precompile
from kope.tuner.optimize import Budget


class Rows(torch.nn.Module):
    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


OPS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[int, ...]]] = {
    "layer_norm": (lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]), (64, 768)),
    "gelu": (torch.nn.functional.gelu, (64, 768)),
    "softmax": (lambda x: torch.softmax(x, -1), (48, 1024)),
    "rms_norm": (_rms, (64, 768)),
    "row_sum": (lambda x: x.sum(-1), (40, 1024)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated")
    args = parser.parse_args()
    target = target_for("cpu", 1, 60.0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, budget {args.budget}")
    speedups = []
    for name in args.ops.split(","):
        fn, shape = OPS[name]
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory(prefix="kope-rows-") as home:
            store = store_at(Path(home))
            report = precompile(
                Rows(fn),
                (torch.randn(*shape),),
                target=target,
                store=store,
                budget=Budget(attempts=args.budget),
                progress=False,
            )
            (row,) = report["operators"]
            tried = [a.config.get("threads", 1) for a in store.attempts(row["key"]) if a.config]
        speed = row["speedup_vs_eager"] or 1.0
        speedups.append(speed)
        print(
            f"{name:<11} {'x'.join(map(str, shape)):>8}  {row['winner']:<6} {speed:5.2f}x eager"
            f"  records on 1 / 2+ threads: {tried.count(1)} / {len(tried) - tried.count(1)}"
            f"  {row.get('best_decision', '')[:80]}"
        )
    print(f"geomean {geomean(speedups) or 0:.2f}x eager")


if __name__ == "__main__":
    main()
