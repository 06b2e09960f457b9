"""What computing convolutions channels-last (`kope.frontend.rewrites.channels_last`) moves,
by depth.

For stacks of 1, 2 and 4 ResNet basic blocks (e2e's `ResNetBlock`, 1×32×28×28 by default),
the aten graph KOPE compiles is run four ways, called directly (no dynamo frame): as traced
("aten": batch norms separate), with batch norms folded ("folded"), and folded with its
convolutions computed on NHWC tensors, its layout copies (into the region and out of it) run
by ATen ("nhwc_aten_copies") or by KOPE transpose kernels ("nhwc_kope_copies": the heuristic
agent's first-ranked transpose schedule, built and checked here, the copy out with the add and
ReLU before it in one kernel, as the backend's partition fuses them; what `kope precompile`
finds at budget 8 is at least as fast). Every other operator runs eagerly. The four are timed
against each other, interleaved, by `kope.targets.measure.measure_interleaved` (clean-round
rules; `~` marks a figure whose rounds were disturbed), each sample ~20 ms. The ratios are
folded / nhwc: what the layout itself moves, with each kind of copy.

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

from kope.agents.heuristic import candidate_space
from kope.core.task import group_inputs, make_task
from kope.frontend import rewrites
from kope.frontend.backend import aten_inference_graph
from kope.frontend.dispatch import fast_operators, subgraph
from kope.frontend.partition import fused_groups
from kope.passes.analysis import analyze, prepare_payload
from kope.spaces.kernels import kernel_source
from kope.targets.cpu import CpuTarget, build_kernel
from kope.targets.measure import MeasureConfig, measure_interleaved
from kope.vocabulary.kernels import Kernel


class _Transpose:
    """A layout copy, with the elementwise ops the partitioner fuses before it, run by a KOPE
    kernel: the heuristic agent's first-ranked transpose schedule for it, checked against the
    same nodes run eagerly once."""

    def __init__(self, group: list[fx.Node], target: CpuTarget):
        task = make_task(group, target.key())
        info = analyze(prepare_payload(task.payload))
        space = candidate_space(info, target.capabilities())
        config = max(space, key=lambda point: point[1])[0]
        payload = prepare_payload(
            task.payload, approximate_math=bool(config.get("approximate_math"))
        )
        self.kernel = build_kernel(task.spec, Kernel(kernel_source(payload, info, config)))
        self.eager = subgraph(task.input_nodes, group, group[-1])
        self.shape = tuple(group[-1].meta["val"].shape)
        self.label = task.label
        self.checked = False
        self.__name__ = "kope_transpose"

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=inputs[0].dtype)
        self.kernel.run(list(inputs), [out])
        if not self.checked:
            torch.testing.assert_close(out, self.eager(*inputs))
            self.checked = True
        return out


def _kope_copies(gm: fx.GraphModule) -> None:
    """Run each layout copy (`clone(permute(x))` the rewrite made), with the elementwise ops
    fused before it as the backend's partition fuses them, by a KOPE kernel."""
    target = CpuTarget()
    for group in fused_groups(gm, target):
        if not any(node.meta.get(rewrites.REWRITE) for node in group):
            continue
        transpose = _Transpose(group, target)
        last = group[-1]
        with gm.graph.inserting_before(last):
            call = gm.graph.call_function(transpose, tuple(group_inputs(group)))
        call.meta["val"] = last.meta["val"]  # what a later group's kernel is built for
        last.replace_all_uses_with(call)
        for node in reversed(group):
            gm.graph.erase_node(node)


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
    for name in ("aten", "folded", "nhwc_aten_copies", "nhwc_kope_copies"):
        aten = aten_inference_graph(gm, inputs)
        if name != "aten":
            rewrites.fold_batch_norms(aten.graph)
        if name.startswith("nhwc"):
            assert rewrites.channels_last(aten.graph, convs_per_copy=0), "no region rewritten"
        if name == "nhwc_kope_copies":
            _kope_copies(aten)
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
        folded = timings["folded"].median_us
        ratios = ", ".join(
            f"{n.removeprefix('nhwc_')} {folded / t.median_us:.3f}x"
            for n, t in timings.items()
            if n.startswith("nhwc")
        )
        print(f"{depth} block(s), {2 * depth} convolutions:  {cells}\n  NHWC over folded: {ratios}")
        if depth == 1:
            _copies_alone(graphs["nhwc_kope_copies"][0])


def _copies_alone(gm: fx.GraphModule) -> None:
    """Each layout copy (with its fused ops) timed alone, on inputs that stay in cache: KOPE's
    kernel against the same nodes run eagerly."""
    for node in gm.graph.nodes:
        if not isinstance(node.target, _Transpose):
            continue
        copy = node.target
        xs = [torch.randn(arg.meta["val"].shape) for arg in node.args]
        fns = {"kope": lambda c=copy, xs=xs: c(*xs), "aten": lambda c=copy, xs=xs: c.eager(*xs)}
        threads = dict.fromkeys(fns, torch.get_num_threads())
        timings = measure_interleaved(fns, MeasureConfig(), threads)
        cells = "  ".join(
            f"{n} {t.median_us:.1f} µs{'' if t.clean else ' ~'}" for n, t in timings.items()
        )
        print(f"  {copy.label} alone:  {cells}")


if __name__ == "__main__":
    main()
