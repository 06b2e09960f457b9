"""Dispatch overhead of the kope backend, and the zoo's end-to-end latency.

1. A chain of 50 small elementwise ops on a 64x64 tensor under kernels="reference" and
   fuse=False: every op runs its own JIT-ed kernel, so (t_kope - t_eager) / 50 is what KOPE
   adds per op (goal: <= 10 µs). With fusion (the default) the chain is one kernel: shown too.
   aot_eager (torch's own aot_autograd path with eager kernels) is shown beside it, to separate
   what any aot_autograd backend pays from what KOPE's kernel calls add.
2. The model zoo under kernels="auto" vs eager vs inductor, timed side by side in one run.
   With --precompile N, each zoo model is first `kope precompile`d (heuristic agent, budget N)
   into the same store, so `auto` runs the agent's kernels where they won.

    python benchmarks/dispatch_overhead.py [--repeat 200] [--no-inductor] [--precompile 8]

Medians of interleaved calls; the store is a fresh temporary directory unless --store is given.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

CHAIN = 50


def chain(x: torch.Tensor) -> torch.Tensor:
    ops: list[Callable[[torch.Tensor], torch.Tensor]] = [
        lambda t: t + 0.5,
        lambda t: t * 0.75,
        torch.neg,
        torch.relu,
        lambda t: t - 0.25,
    ]
    for i in range(CHAIN):
        x = ops[i % len(ops)](x)
    return x


def interleaved(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Median µs per call of each callable, called in rotation."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(5):
            fn()
    names = list(fns)
    for r in range(repeat):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            fns[name]()
            samples[name].append((time.perf_counter() - start) * 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}


def dispatch_overhead(repeat: int, store: str) -> None:
    import kope

    x = torch.randn(64, 64)
    kope.reset_report()
    with torch.no_grad():
        kope_fn = torch.compile(
            chain, backend="kope", options={"kernels": "reference", "store": store, "fuse": False}
        )
        torch.testing.assert_close(kope_fn(x), chain(x))
        torch._dynamo.reset()
        fused_fn = torch.compile(
            chain, backend="kope", options={"kernels": "reference", "store": store}
        )
        torch.testing.assert_close(fused_fn(x), chain(x), rtol=1e-4, atol=1e-4)
        aot_fn = torch.compile(chain, backend="aot_eager")
        aot_fn(x)
        t = interleaved(
            {
                "eager": lambda: chain(x),
                "kope": lambda: kope_fn(x),
                "aot_eager": lambda: aot_fn(x),
                "fused": lambda: fused_fn(x),
            },
            repeat,
        )
    graph = kope.report().graphs[0]  # the unfused compile
    jit = sum(1 for task in graph.tasks if task.jit)
    kernel_sum = sum(task.kernel_us or 0 for task in graph.tasks)
    eager_sum = sum(task.eager_us or 0 for task in graph.tasks)
    print(
        f"## Dispatch overhead: {CHAIN} elementwise ops on 64x64 f32, kernels=reference, "
        f"fuse=False ({jit}/{len(graph.tasks)} ops on JIT kernels)"
    )
    print(
        f"threads: eager {torch.get_num_threads()}, kernels 1; median of {repeat} interleaved calls"
    )
    print(f"  eager        {t['eager']:9.1f} µs")
    print(
        f"  aot_eager    {t['aot_eager']:9.1f} µs   "
        f"({(t['aot_eager'] - t['eager']) / CHAIN:+.2f} µs/op)"
    )
    print(f"  kope         {t['kope']:9.1f} µs   ({(t['kope'] - t['eager']) / CHAIN:+.2f} µs/op)")
    print(
        f"overhead per op = (t_kope - t_eager) / {CHAIN} = "
        f"{(t['kope'] - t['eager']) / CHAIN:.2f} µs "
        "(goal <= 10 µs)"
    )
    print(
        f"  of which kernel compute vs eager compute, as timed in the worker: "
        f"{(kernel_sum - eager_sum) / max(len(graph.tasks), 1):+.2f} µs/op"
    )
    print(
        f"  with fusion (default): the chain is one kernel: {t['fused']:.1f} µs "
        f"({t['eager'] / t['fused']:.2f}x eager)\n"
    )


def precompile_zoo(store: str, budget: int) -> None:
    from kope.frontend.compiler import store_at, target_for
    from kope.tools.precompile import precompile
    from kope.tools.zoo import ZOO
    from kope.tuner.optimize import Budget

    target = target_for("cpu", 1, 120.0)
    for name, factory in ZOO.items():
        model, inputs = factory()
        report = precompile(
            model,
            inputs,
            target=target,
            store=store_at(Path(store)),
            budget=Budget(attempts=budget),
            progress=False,
        )
        s = report["summary"]
        print(
            f"precompiled {name}: {s['operators']} operators, {s['agent_wins']} agent wins, "
            f"{s['wall_s']:.0f} s"
        )
    print()


def zoo_latency(repeat: int, store: str, inductor: bool) -> None:
    from kope.tools.zoo import ZOO

    print("## End-to-end latency, kernels=auto vs eager vs inductor (median µs per call)")
    header = (
        f"{'model':<18} {'eager':>9} {'kope':>9} {'inductor':>9} "
        f"{'kope/eager':>10} {'inductor/eager':>14}"
    )
    print(header)
    for name, factory in ZOO.items():
        model, inputs = factory()
        with torch.no_grad():
            fns: dict[str, Callable[[], Any]] = {"eager": functools.partial(model, *inputs)}
            kope_model = torch.compile(model, backend="kope", options={"store": store})
            kope_model(*inputs)
            fns["kope"] = functools.partial(kope_model, *inputs)
            if inductor:
                ind = torch.compile(model, backend="inductor")
                ind(*inputs)
                fns["inductor"] = functools.partial(ind, *inputs)
            t = interleaved(fns, repeat)
        ind_t = t.get("inductor")
        ind_col = f"{ind_t:9.1f}" if ind_t else f"{'-':>9}"
        ind_ratio = f"{t['eager'] / ind_t:13.2f}x" if ind_t else f"{'-':>14}"
        print(
            f"{name:<18} {t['eager']:9.1f} {t['kope']:9.1f} {ind_col} "
            f"{t['eager'] / t['kope']:9.2f}x {ind_ratio}"
        )
    print("(ratios are eager time / backend time: above 1 is faster than eager)")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--store", help="experience store (default: a fresh temporary directory)")
    parser.add_argument("--no-inductor", action="store_true", help="skip the inductor column")
    parser.add_argument(
        "--precompile",
        type=int,
        default=0,
        metavar="N",
        help="precompile each zoo model with budget N before timing it",
    )
    args = parser.parse_args()
    store = args.store or tempfile.mkdtemp(prefix="kope-bench-")
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, store {store}\n")
    dispatch_overhead(args.repeat, store)
    if args.precompile:
        precompile_zoo(store, args.precompile)
    zoo_latency(args.repeat, store, not args.no_inductor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
