"""What computing convolutions channels-last (`kope.rewrites.channels_last`) moves, by depth.

For stacks of 1, 2 and 4 ResNet basic blocks (e2e's `ResNetBlock`, 1×32×28×28 by default),
the aten graph KOPE compiles is run three ways, every operator eager, called directly (no
dynamo frame): as traced ("aten": batch norms separate), with batch norms folded ("folded"),
and folded with its convolutions computed on NHWC tensors ("channels_last": layout copies in
and out of the region included). The three are timed against each other, interleaved, by
`kope.targets.measure.measure_interleaved` (clean-round rules; `~` marks a figure whose rounds
were disturbed), each sample ~20 ms. The ratio is folded / channels_last: what the layout
itself moves. A stack whose region has fewer than `CONVS_PER_COPY` convolutions per layout copy
is not rewritten by the backend; this script rewrites every depth regardless, to show why.

    python benchmarks/channels_last.py [--blocks 1,2,4] [--channels 32] [--size 28]

Run it on a quiet machine (`../shared/tools/quiet-check.sh`), with nothing else running.
"""

from __future__ import annotations

import argparse
import platform
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from e2e import ResNetBlock

from kope import rewrites
from kope.backend import aten_inference_graph
from kope.dispatch import fast_operators
from kope.targets.measure import MeasureConfig, measure_interleaved


def _graphs(model: nn.Module, x: torch.Tensor) -> dict[str, tuple[fx.GraphModule, list[Any]]]:
    """The model's aten graph three ways, with the inputs dynamo hands it."""
    captured: dict[str, Any] = {}

    def capture(gm: fx.GraphModule, example: list[Any]) -> Any:
        captured["gm"], captured["inputs"] = gm, example
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=capture)(x)
    gm, inputs = captured["gm"], captured["inputs"]
    graphs = {}
    for name in ("aten", "folded", "channels_last"):
        aten = aten_inference_graph(gm, inputs)
        if name != "aten":
            rewrites.fold_batch_norms(aten.graph)
        if name == "channels_last":
            rewrites.channels_last(aten.graph, convs_per_copy=0)
        fast_operators(aten.graph)
        aten.recompile()
        graphs[name] = (aten, inputs)
    return graphs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--blocks", default="1,2,4", help="stack depths, comma-separated")
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--size", type=int, default=28, help="height and width")
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}; 1x{args.channels}x{args.size}x{args.size}"
    )
    for depth in (int(d) for d in args.blocks.split(",")):
        torch.manual_seed(0)
        model = nn.Sequential(*[ResNetBlock(args.channels) for _ in range(depth)]).eval()
        x = torch.randn(1, args.channels, args.size, args.size)
        with torch.no_grad():
            graphs = _graphs(model, x)
            want = model(x)
            for gm, inputs in graphs.values():
                torch.testing.assert_close(gm(*inputs)[0], want, rtol=1e-4, atol=1e-4)
            fns = {name: (lambda gm=gm, i=inputs: gm(*i)) for name, (gm, inputs) in graphs.items()}
            timings = measure_interleaved(
                fns, MeasureConfig(sample_s=20e-3), dict.fromkeys(fns, torch.get_num_threads())
            )
        cells = "  ".join(
            f"{n} {t.median_us:8.1f} µs{'' if t.clean else ' ~'}" for n, t in timings.items()
        )
        ratio = timings["folded"].median_us / timings["channels_last"].median_us
        print(f"{depth} block(s), {2 * depth} convolutions:  {cells}  channels-last {ratio:.3f}x")


if __name__ == "__main__":
    main()
