"""What a call costs where a model makes it, against what it costs alone.

Two things the per-operator timings of a precompile do not see, measured in one process:

1. dynamo's frame: a module called eagerly, through `torch.compile(backend="eager")` (no
   backend work at all), and the graph dynamo captured called directly, for one linear
   layer and one ReLU; beside them the same eager call after a busy wait and after a sleep
   of the frame's length (an idle core takes time to come back).
2. a matmul kernel in context: KOPE's first packed kernel for an addmm (the static prior's
   pick) against `torch.addmm`, each call timed alone: in a hot loop (what a precompile's
   timing sees), right after a ViT block's forward (as inside a model), and right after 4 MB
   were written (a cache flush).

    python benchmarks/context_cost.py [--shape 130x192x192] [--calls 300]

Run it on a quiet machine (`../shared/tools/quiet-check.sh`), with nothing else running.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

sys.path.insert(0, str(Path(__file__).parent))
import unseen_models  # noqa: E402  (the ViT block)

from kope.passes.analysis import analyze, prepare_payload  # noqa: E402
from kope.spaces.cpu import schedule_space  # noqa: E402
from kope.spaces.kernels import kernel_source  # noqa: E402
from kope.targets.cpu import CpuTarget  # noqa: E402
from kope.targets.measure import MeasureConfig, measure_interleaved  # noqa: E402
from kope.vocabulary.kernels import Kernel  # noqa: E402


def frame_cost() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(384, 2048, bias=False)
    _frame_cost("linear 2x64x384 -> 2048", linear, torch.randn(2, 64, 384))
    _frame_cost("relu 2x64x2048", nn.ReLU(), torch.randn(2, 64, 2048))


def _frame_cost(name: str, model: nn.Module, x: torch.Tensor) -> None:
    model.eval()
    captured: list[torch.fx.GraphModule] = []

    def grab(gm: torch.fx.GraphModule, _: Any) -> Callable[..., Any]:
        captured.append(gm)
        return gm.forward

    with torch.no_grad():
        dynamo = torch.compile(model, backend="eager")
        dynamo(x)
        torch.compile(model, backend=grab)(x)
        graph = captured[0]
        params = iter(model.parameters())
        placeholders = [n.name for n in graph.graph.nodes if n.op == "placeholder"]
        args = [next(params) if "parameters" in p else x for p in placeholders]
        fns: dict[str, Callable[[], Any]] = {
            "eager": lambda: model(x),
            "dynamo": lambda: dynamo(x),
            "graph": lambda: graph(*args),
            "busy 30us + eager": lambda: (_busy(30e-6), model(x)),
            "sleep 30us + eager": lambda: (time.sleep(30e-6), model(x)),
        }
        timed = measure_interleaved(fns, MeasureConfig(min_calls=20), {n: 2 for n in fns})
    eager = timed["eager"].median_us
    print(f"{name}:")
    for label, t in timed.items():
        gap = 30.0 if "30us" in label else 0.0
        print(
            f"  {label:20} {t.median_us:8.1f} us  {t.median_us - gap - eager:+7.1f} us "
            f"beyond eager{' and the gap' if gap else ''}  [{t.quality}]"
        )


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def matmul_in_context(m: int, k: int, n: int, calls: int) -> None:
    torch.manual_seed(0)
    target = CpuTarget()
    w = nn.Parameter(torch.randn(n, k), requires_grad=False)
    b, x = torch.randn(n), torch.randn(m, k)

    def addmm(bias: torch.Tensor, a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.addmm(bias, a, weight.t())

    (task,) = _tasks(addmm, (b, x, w), target)
    payload = prepare_payload(task.payload)
    info = analyze(payload)
    space, _ = schedule_space(info, target.capabilities())
    config = max(space, key=lambda point: point[1])[0]
    kernel = target.build(task.spec, Kernel(kernel_source(payload, info, config))).bind()
    model, inputs = unseen_models.UNSEEN["vit_block"]()
    model.eval()
    flush = torch.randn(1 << 20)  # 4 MB
    ops: dict[str, Callable[[], Any]] = {
        "torch.addmm": lambda: torch.addmm(b, x, w.t()),
        "KOPE kernel": lambda: kernel.call(b, x, w.t()),
    }
    contexts: dict[str, Callable[[], Any] | None] = {
        "hot loop": None,
        "after a ViT block": lambda: model(*inputs),
        "after 4 MB written": lambda: flush.mul_(1.0),
    }
    samples: dict[tuple[str, str], list[float]] = {}
    with torch.no_grad():
        torch.testing.assert_close(ops["KOPE kernel"]()[0], ops["torch.addmm"]())
        gc.disable()
        try:
            for _ in range(calls):
                for op_name, op in ops.items():
                    for context_name, context in contexts.items():
                        if context is None:
                            op()
                            start = time.perf_counter()
                            op(), op(), op()
                            seconds = (time.perf_counter() - start) / 3
                        else:
                            context()
                            start = time.perf_counter()
                            op()
                            seconds = time.perf_counter() - start
                        samples.setdefault((op_name, context_name), []).append(seconds * 1e6)
        finally:
            gc.enable()
    print(f"addmm {m}x{k}x{n}, the KOPE kernel: {config}")
    print(f"  {'':14}" + "".join(f"{c:>20}" for c in contexts))
    for op_name in ops:
        row = [statistics.median(samples[op_name, c]) for c in contexts]
        print(f"  {op_name:14}" + "".join(f"{v:17.1f} us" for v in row))
    target.close()


def _tasks(fn: Callable[..., Any], args: tuple[Any, ...], target: CpuTarget) -> list[Any]:
    from kope.frontend.partition import partition

    return partition(make_fx(fn, tracing_mode="fake")(*args), target).tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="130x192x192", help="the addmm's M x K x N")
    parser.add_argument("--calls", type=int, default=300, help="single calls per cell")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    frame_cost()
    m, k, n = (int(v) for v in args.shape.split("x"))
    matmul_in_context(m, k, n, args.calls)


if __name__ == "__main__":
    main()
