"""Training steps: eager vs `torch.compile(backend="kope")` vs inductor, timed in one process.

The e2e models (`benchmarks/e2e.py`) in train mode: one step is the forward, a loss
(the mean square of the output) and the backward, gradients accumulated into `.grad` as a
training loop does (zeroed between samples is not needed: accumulating costs every backend
the same). With `--precompile N` the models' operators are first optimized into a fresh store
(as `e2e.py` does; their inference graphs). KOPE compiles a training graph's forward and, at
the first call, times a whole step with it against dynamo's graph with eager's autograd, and
runs whichever is faster (`kope.frontend.whole_graph.settle_training_step`); the report line says
which.
Each model's backends are timed interleaved (`kope.targets.measure.measure_interleaved`),
`--repeat` times in a row: the figure is the median of the runs' medians. Ratios are eager
time / backend time. Gradients are checked against eager's first.

    python benchmarks/train_step.py [--precompile 8] [--models a,b] [--no-inductor] [--repeat 3]

Run it on a quiet machine (`../shared/tools/quiet-check.sh`), with nothing else running.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from e2e import (
    MODELS,
    SAMPLE_MS,
    _model,
    model_parser,
    precompile_into,
    store_and_header,
    time_backends,
)


def _step(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], None]:
    def run() -> None:
        model(*inputs).square().mean().backward()

    return run


def run(name: str, store: Path, budget: int, inductor: bool, repeat: int) -> dict[str, Any]:
    import kope
    from kope.targets.measure import MeasureConfig

    model, inputs = _model(name)
    if budget:
        precompile_into(store, model, inputs, budget)
    model.train()  # batch norm on the batch's statistics, as in training
    models = {"eager": model, "kope": copy.deepcopy(model), "dynamo": copy.deepcopy(model)}
    if inductor:
        models["inductor"] = copy.deepcopy(model)
    torch._dynamo.reset()
    kope.reset_report()
    calls: dict[str, Callable[..., Any]] = {"eager": model}
    calls["kope"] = torch.compile(models["kope"], backend="kope", options={"store": str(store)})
    calls["dynamo"] = torch.compile(models["dynamo"], backend="eager")
    if inductor:
        calls["inductor"] = torch.compile(models["inductor"], backend="inductor")
    fns = {n: _step(m, inputs) for n, m in calls.items()}
    for n, fn in fns.items():  # compiles, decides, and checks the gradients against eager's
        fn()
        for mine, want in zip(models[n].parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(mine.grad, want.grad, rtol=1e-3, atol=1e-4)
    row: dict[str, Any] = {"model": name}
    row["kope_runs"] = [g.training for g in kope.report().graphs]
    config = MeasureConfig(sample_s=SAMPLE_MS / 1e3, min_calls=5)
    row.update(time_backends(fns, config, repeat))
    return row


def main() -> None:
    parser = model_parser(__doc__)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="timings in a row (default 3)")
    args = parser.parse_args()
    store = store_and_header(args, "kope-train-")
    for name in args.models.split(","):
        r = run(name, store, args.precompile, not args.no_inductor, args.repeat)
        cells = [f"eager {r['eager_us']:8.1f} µs"]
        for n in ("dynamo", "kope", "inductor"):
            if f"{n}_us" in r:
                mark = "" if r[f"{n}_clean"] else "~"
                cells.append(f"{n} {mark}{r['eager_us'] / r[f'{n}_us']:.2f}x")
        print(f"{name:<20} " + "  ".join(cells))
        for line in r["kope_runs"]:
            print(f"{'':<20} kope: {line}")


if __name__ == "__main__":
    main()
