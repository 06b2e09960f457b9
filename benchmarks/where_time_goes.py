"""Where a model's time goes under KOPE, against eager: each gap named and measured.

For each model (the e2e models and the unseen ones of `benchmarks/unseen_models.py`),
precompiled at `--precompile N` into one store, then timed in one process:

    kope - eager = frame + kernels + rest

- **frame**: what dynamo's frame and guards cost around KOPE's graph (`kope` against the
  graph KOPE returned to dynamo, called directly on the arguments dynamo passed it). The
  `dynamo` column is the same frame around eager's own graph (`backend="eager"`).
- **kernels**: the graph against the same graph with each kernel call running its
  operator's eager code in its place: what the kernels save (negative) or lose where they
  run.
- **rest**: that graph with eager code in its kernels' place, against eager: what the
  decomposition, rewrites and fast paths taken apart cost or save, and what no
  graph pays at all: eager's `nn.Module` calls (dynamo inlines them), which is why `rest`
  is negative even where KOPE runs eager's own graph, and `frame` larger than `dynamo`'s
  (dynamo less eager: its frame less those module calls).

Eager, dynamo, KOPE, KOPE's graph called directly, and that graph with its kernels switched
to eager code are timed interleaved (`kope.targets.measure`), so that the three terms add up
to the gap exactly: frame = kope - graph, kernels = graph - graph with eager code in their
place, rest = that graph - eager. A clock around each kernel call (a few tenths of a µs)
says what the kernels themselves take, on and off. A model whose whole-graph check kept
eager's graph has no kernel calls: its gap is the frame and the graph's own code.

    python benchmarks/where_time_goes.py [--precompile 4] [--models a,b] [--json out.json]

Run it on a quiet machine (`../shared/tools/quiet-check.sh`), with nothing else running.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import e2e
import torch
import unseen_models


def _kernel_clock() -> tuple[dict[str, Any], Callable[[], None]]:
    """A clock around every KOPE kernel call (`KernelCall`) while `eager` is set (None: off),
    and a switch (`eager` true) that runs each one's eager code instead; returns the clock's
    state (seconds and calls, per setting of the switch) and a function that takes it off."""
    from kope.frontend.compiler import KernelCall

    state: dict[str, Any] = {"eager": None, "s": [0.0, 0.0], "calls": [0, 0]}
    original = KernelCall.__call__

    def timed(self: Any, *inputs: torch.Tensor) -> Any:
        if state["eager"] is None:  # a call outside the timed graph (through dynamo's frame)
            return original(self, *inputs)
        eager = state["eager"]
        start = time.perf_counter()
        if eager:
            outputs = self.eager(inputs)
            result = outputs[0] if self.single else outputs
        else:
            result = original(self, *inputs)
        state["s"][eager] += time.perf_counter() - start
        state["calls"][eager] += 1
        return result

    KernelCall.__call__ = timed  # type: ignore[method-assign]

    def restore() -> None:
        KernelCall.__call__ = original  # type: ignore[method-assign]

    return state, restore


def breakdown(name: str, store: Path, budget: int, sample_s: float) -> dict[str, Any]:
    from kope.frontend.backend import kope_backend
    from kope.targets.measure import MeasureConfig, measure_interleaved

    model, inputs = e2e._model(name)
    row: dict[str, Any] = {"model": name}
    if budget:
        e2e.precompile_into(store, model, inputs, budget)
    options = {"store": str(store)}
    with torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="kope", options=options)
        compiled(*inputs)  # the whole-graph decisions, recorded for the capture below too
        graphs: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

        def capture(gm: torch.fx.GraphModule, example: list[Any]) -> Callable[..., Any]:
            fn = kope_backend(gm, example, options)
            index = len(graphs)

            def first_call(*args: Any) -> Any:
                if len(graphs) == index:
                    graphs.append((fn, args))
                return fn(*args)

            return first_call

        torch.compile(model, backend=capture)(*inputs)
        dynamo = torch.compile(model, backend="eager")
        dynamo(*inputs)
        state, restore = _kernel_clock()
        calls = [0, 0]

        def graph(eager: bool) -> None:
            state["eager"] = eager
            calls[eager] += 1
            for fn, args in graphs:
                fn(*args)
            state["eager"] = None

        fns = {
            "eager": lambda: model(*inputs),
            "dynamo": lambda: dynamo(*inputs),
            "kope": lambda: compiled(*inputs),
            "graph": lambda: graph(False),
            "graph_off": lambda: graph(True),
        }
        threads = {n: torch.get_num_threads() for n in fns}
        try:
            timed = measure_interleaved(fns, MeasureConfig(sample_s=sample_s), threads)
        finally:
            restore()
    row.update({f"{n}_us": t.median_us for n, t in timed.items()})
    row["clean"] = all(t.clean for t in timed.values())
    row["graphs"] = len(graphs)
    # The clock's figures are means over every sample, disturbed ones too: they say what the
    # kernels take, not the gap (which the interleaved, clean medians below give).
    row["kernel_calls"] = state["calls"][False] / max(calls[False], 1)
    row["kernels_us"] = state["s"][False] / max(calls[False], 1) * 1e6
    row["as_eager_us"] = state["s"][True] / max(calls[True], 1) * 1e6
    row["frame_us"] = row["kope_us"] - row["graph_us"]
    row["dynamo_frame_us"] = row["dynamo_us"] - row["eager_us"]
    row["kernels_gain_us"] = row["graph_us"] - row["graph_off_us"]
    row["rest_gain_us"] = row["graph_off_us"] - row["eager_us"]
    return row


def _print(row: dict[str, Any]) -> None:
    eager = row["eager_us"]
    mark = "" if row["clean"] else " ~"
    print(
        f"{row['model']:<20} {eager:8.1f} {row['kope_us']:8.1f} {eager / row['kope_us']:6.2f}x"
        f"{mark:2} {row['frame_us']:+8.1f} {row['dynamo_frame_us']:+8.1f} "
        f"{row['kernel_calls']:4.0f} {row['kernels_us']:8.1f} {row['as_eager_us']:8.1f} "
        f"{row['kernels_gain_us']:+8.1f} {row['rest_gain_us']:+8.1f}"
    )


def main() -> None:
    models = {**e2e.MODELS, **unseen_models.UNSEEN}
    e2e.EXTRA_MODELS.update(unseen_models.UNSEEN)
    parser = e2e.model_parser(__doc__ or "", default_budget=4)
    parser.add_argument(
        "--models", default=",".join(models), help="comma-separated (default: all of them)"
    )
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument(
        "--sample-ms", type=float, default=e2e.SAMPLE_MS, help="each timing sample (ms)"
    )
    args = parser.parse_args()
    store = e2e.store_and_header(args, "kope-where-")
    print(
        f"{'model':<20} {'eager':>8} {'kope':>8} {'ratio':>7}  {'frame':>8} {'dyn.fr':>8} "
        f"{'kern':>4} {'kernels':>8} {'as eager':>8} {'k gain':>8} {'rest':>8}   (µs a call)"
    )
    rows = []
    for name in args.models.split(","):
        rows.append(breakdown(name, store, args.precompile, args.sample_ms / 1e3))
        _print(rows[-1])
        sys.stdout.flush()
    print(
        "frame: kope less its graph called directly (dyn.fr: dynamo less eager); kern: kernel "
        "calls per model call; kernels / as eager: their time where they run, and their "
        "operators' eager code in the same place; k gain: the graph less the graph with eager "
        "code in its kernels' place; rest: that graph less eager. "
        "kope - eager = frame + k gain + rest; "
        "~: a timing the machine's load disturbed"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
