"""2-D convolutions of common CNN shapes: the direct schedules against im2col (full
convolutions) and against blocks of rows in registers (depthwise ones), each timed against
eager in the worker that verifies it.

    python benchmarks/conv_algorithms.py [--shapes resnet_s1,...] [--per-algorithm 4]

For each shape, the first `--per-algorithm` configurations of each algorithm in the static
prior's order (`kope.spaces.cpu.schedule_space`) are built, verified against the reference
lowering and timed, eager timed beside each (the same clean-rounds timing as a precompile);
printed: eager's median, each algorithm's best kernel and its ratio to eager, and the
configuration that gave it. Run it on a quiet machine (`../shared/tools/quiet-check.sh`).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kope.frontend.compiler import target_for
from kope.frontend.partition import partition
from kope.passes.analysis import analyze, prepare_payload
from kope.spaces.cpu import schedule_space
from kope.spaces.kernels import kernel_source
from kope.spaces.schedules import describe
from kope.vocabulary.kernels import Kernel

Shape = tuple[tuple[int, int, int, int], int, int, int, int, int]
# name: (input N x C x H x W, output channels, kernel, stride, padding, groups)
SHAPES: dict[str, Shape] = {
    "resnet_s1": ((1, 64, 56, 56), 64, 3, 1, 1, 1),
    "resnet_s2": ((1, 128, 28, 28), 128, 3, 1, 1, 1),
    "resnet_s3": ((1, 256, 14, 14), 256, 3, 1, 1, 1),
    "resnet_down": ((1, 64, 56, 56), 128, 3, 2, 1, 1),
    "resnet_stem": ((1, 3, 224, 224), 64, 7, 2, 3, 1),
    "unet_batch2": ((2, 32, 32, 32), 32, 3, 1, 1, 1),
    "small_37": ((1, 16, 37, 37), 32, 3, 1, 1, 1),
    # Depthwise: MobileNetV2's inverted residuals, EfficientNet's 5x5, ConvNeXt's 7x7.
    "dw_mbv2_112": ((1, 32, 112, 112), 32, 3, 1, 1, 32),
    "dw_mbv2_56": ((1, 144, 56, 56), 144, 3, 1, 1, 144),
    "dw_mbv2_28": ((1, 192, 28, 28), 192, 3, 1, 1, 192),
    "dw_mbv2_14": ((1, 384, 14, 14), 384, 3, 1, 1, 384),
    "dw_effnet_5x5": ((1, 240, 28, 28), 240, 5, 1, 2, 240),
    "dw_convnext_7x7": ((1, 96, 28, 28), 96, 7, 1, 3, 96),
    "dw_batch2_ragged": ((2, 64, 30, 30), 64, 5, 1, 2, 64),
    "dw_stride2": ((1, 96, 56, 56), 96, 3, 2, 1, 96),
}


def _task(shape: Shape, target: Any) -> Any:
    size, out, k, stride, padding, groups = shape
    args = (torch.randn(*size), torch.randn(out, size[1] // groups, k, k), torch.randn(out))

    def conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, b, stride=stride, padding=padding, groups=groups)

    (task,) = partition(make_fx(conv, tracing_mode="fake")(*args), target).tasks
    return task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated")
    parser.add_argument("--per-algorithm", type=int, default=4)
    args = parser.parse_args()
    target = target_for("cpu", 1, 300.0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    ratios: dict[str, list[float]] = {"direct": [], "im2col": [], "rows": []}
    try:
        for name in args.shapes.split(","):
            torch.manual_seed(0)
            task = _task(SHAPES[name], target)
            payload = prepare_payload(task.payload)
            info = analyze(payload)
            space, _ = schedule_space(info, target.capabilities())
            space.sort(key=lambda point: -point[1])
            eager: list[float] = []
            offered = {c.get("algorithm", "direct") for c, _ in space}
            for algorithm in [a for a in ratios if a in offered]:
                chosen = [c for c, _ in space if c.get("algorithm", "direct") == algorithm][
                    : args.per_algorithm
                ]
                best: tuple[float, str] | None = None
                for config in chosen:
                    source = kernel_source(payload, info, config)
                    result = target.evaluate(task.spec, Kernel(source), oracle=Kernel(task.payload))
                    if result.eager is not None:
                        eager.append(result.eager.median_us)
                    if result.verdict != "verified" or result.kernel is None:
                        print(f"  {name} {describe(config)}: {result.verdict}")
                        continue
                    if best is None or result.kernel.median_us < best[0]:
                        best = (result.kernel.median_us, describe(config))
                eager_us = sorted(eager)[len(eager) // 2] if eager else math.nan
                if best is None:
                    print(f"{name:12} {algorithm:7} no verified kernel")
                    continue
                ratio = eager_us / best[0]
                ratios[algorithm].append(ratio)
                print(
                    f"{name:12} {algorithm:7} eager {eager_us:9.1f} us  best {best[0]:9.1f} us"
                    f"  {ratio:5.2f}x eager  ({best[1]})"
                )
    finally:
        target.close()
    for algorithm, values in ratios.items():
        if values:
            geomean = math.exp(sum(math.log(v) for v in values) / len(values))
            print(f"{algorithm}: geomean {geomean:.2f}x eager over {len(values)} shapes")


if __name__ == "__main__":
    main()
