"""KOPE's attention kernels against ATen's `scaled_dot_product_attention`, shape by shape.

For each shape (batch, heads, tokens, head depth, causal or not; f32), the attention Task
the backend makes (`kope.frontend.partition.attention_task`) is offered to the CPU space, the
static prior's first `--configs` configurations are built and checked against ATen's answer,
and each is timed interleaved with ATen's call in this process (`measure_interleaved`, both
on torch's thread count). The figure per shape is ATen's median over the best kernel's; the
geomean over the shapes is the one to quote (issue 45's goal: >= 1.2x).

    python benchmarks/attention.py [--shapes 2x8x256x64c,...] [--configs 4] [--views]

With `--views`, q, k and v are permuted out of one B x L x 3 x H x D projection and the
output is laid out B x L x H x D (as attention layers make and read them; ATen gets the same
views): the kernel reads them where they lie and writes its output so, where without the
strided layouts of `kope.vocabulary.layouts` its call would copy all four.

A shape is BxHxLxD, with a trailing `c` for causal. Run it on a quiet machine
(`../shared/tools/quiet-check.sh`), with nothing else running.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from kope.frontend.partition import attention_task
from kope.passes.analysis import analyze, prepare_payload
from kope.spaces.cpu import schedule_space
from kope.spaces.kernels import kernel_source
from kope.spaces.schedules import describe
from kope.targets.cpu import CpuTarget
from kope.targets.measure import MeasureConfig, measure_interleaved
from kope.vocabulary.kernels import Kernel

# Encoders and decoders of the sizes the issue names, a ViT's 197 tokens (ragged blocks).
DEFAULT_SHAPES = (
    "2x8x128x64,2x8x256x64,2x8x256x64c,4x12x128x64c,2x8x512x64c,4x8x512x64,2x12x197x64,2x8x256x32"
)


def parse_shape(text: str) -> tuple[tuple[int, int, int, int], bool]:
    causal = text.endswith("c")
    dims = tuple(int(v) for v in text.removesuffix("c").split("x"))
    if len(dims) != 4:
        raise argparse.ArgumentTypeError(f"{text!r}: expected BxHxLxD[c]")
    return (dims[0], dims[1], dims[2], dims[3]), causal


def operands(shape: tuple[int, ...], views: bool) -> list[torch.Tensor]:
    """q, k and v: three tensors, or (`views`) three views of one projection."""
    if not views:
        return [torch.randn(shape) for _ in range(3)]
    b, h, length, d = shape
    return list(torch.randn(b, length, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0))


def sdpa_node(shape: tuple[int, ...], causal: bool, views: bool = False) -> fx.Node:
    graph = fx.Graph()
    inputs = [graph.placeholder(name) for name in "qkv"]
    for node, value in zip(inputs, operands(shape, views), strict=True):
        node.meta["val"] = torch.empty_strided(value.shape, value.stride())
    call = graph.call_function(
        torch.ops.aten.scaled_dot_product_attention.default, tuple(inputs), {"is_causal": causal}
    )
    b, h, length, d = shape
    call.meta["val"] = torch.empty(b, length, h, d).transpose(1, 2) if views else torch.empty(shape)
    graph.output(call)
    return call


def one_shape(text: str, configs: int, target: CpuTarget, views: bool = False) -> float | None:
    shape, causal = parse_shape(text)
    task = attention_task(sdpa_node(shape, causal, views), target)
    if task is None:
        print(f"{text}: no attention Task")
        return None
    payload = prepare_payload(task.payload)
    info = analyze(payload)
    space, _ = schedule_space(info, target.capabilities())
    ranked = [config for config, _ in sorted(space, key=lambda p: -p[1])[:configs]]
    torch.manual_seed(0)
    q, k, v = operands(shape, views)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    fns: dict[str, Any] = {
        "ATen": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    }
    kernels = []  # kept alive while they are timed
    for index, config in enumerate(ranked):
        kernel = target.build(task.spec, Kernel(kernel_source(payload, info, config))).bind()
        got = kernel.call(q, k, v)
        torch.testing.assert_close(got[0] if isinstance(got, tuple) else got, want)
        kernels.append(kernel)
        fns[f"#{index}"] = lambda kernel=kernel: kernel.call(q, k, v)
    if views:  # what the call cost before: the contiguous kernel, its copies in and out
        plain = attention_task(sdpa_node(shape, causal), target)
        assert plain is not None
        plain_payload = prepare_payload(plain.payload)
        plain_info = analyze(plain_payload)
        source = kernel_source(plain_payload, plain_info, ranked[0])
        copied = target.build(plain.spec, Kernel(source)).bind()
        kernels.append(copied)
        fns["copied"] = lambda: copied.call(q, k, v)[0].transpose(1, 2).contiguous()
    threads = torch.get_num_threads()
    timed = measure_interleaved(fns, MeasureConfig(), {name: threads for name in fns})
    aten = timed["ATen"].median_us
    best = min(range(len(ranked)), key=lambda i: timed[f"#{i}"].median_us)
    kope = timed[f"#{best}"].median_us
    flops = 4 * math.prod(shape) * shape[2] * (0.5 if causal else 1.0)
    print(
        f"{text:14} ATen {aten:9.1f} us  KOPE {kope:9.1f} us  {aten / kope:5.2f}x  "
        f"({flops / kope / 1e3:.0f} GFLOP/s; {describe(ranked[best])}; "
        + ", ".join(f"#{i} {timed[f'#{i}'].median_us:.0f}" for i in range(len(ranked)))
        + (f"; #0 copying in and out {timed['copied'].median_us:.0f}" if views else "")
        + f") [{timed['ATen'].quality}/{timed[f'#{best}'].quality}]"
    )
    return aten / kope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="BxHxLxD[c],... (c: causal)")
    parser.add_argument(
        "--configs", type=int, default=4, help="the prior's first N configurations per shape"
    )
    parser.add_argument(
        "--views",
        action="store_true",
        help="q, k and v as views of one projection, the output heads inner (as layers have them)",
    )
    args = parser.parse_args()
    target = CpuTarget()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {target.key()}")
    ratios = [
        r for s in args.shapes.split(",") if (r := one_shape(s, args.configs, target, args.views))
    ]
    if ratios:
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"geomean over {len(ratios)} shapes: {geomean:.2f}x ATen's attention")
    target.close()


if __name__ == "__main__":
    main()
