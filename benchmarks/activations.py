"""What an activation's kernel costs: polynomial math against libm's, both against eager.

    python benchmarks/activations.py [--ops elu,softplus,...] [--shape 256x512] [--rounds 2]

Per activation (one rows Task on a `--shape` f32 tensor, a normal sample times 4; positive for
log and log1p): the static prior's first configuration with `kope-approximate-math` (exp,
expm1, erf, tanh, log and log1p as polynomials) and the same configuration with libm's calls,
each built with `CpuTarget.build` and timed interleaved with eager's call in this process
(`measure_interleaved`: medians). Printed per round: the three medians in µs. A kernel is
checked against eager first (`torch.testing.assert_close`). Run it on a quiet machine
(`../shared/tools/quiet-check.sh`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kope.frontend.partition import partition
from kope.passes.analysis import analyze, prepare_payload
from kope.spaces.cpu import schedule_space
from kope.spaces.kernels import kernel_source
from kope.targets.cpu import CpuTarget
from kope.targets.measure import MeasureConfig, measure_interleaved
from kope.vocabulary.kernels import Kernel

OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "exp": torch.exp,
    "sigmoid": torch.sigmoid,
    "silu": lambda x: F.silu(x),
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "tanh": torch.tanh,
    "elu": lambda x: F.elu(x),
    "selu": lambda x: F.selu(x),
    "softplus": lambda x: F.softplus(x),
    "mish": lambda x: F.mish(x),
    "logsigmoid": lambda x: F.logsigmoid(x),
    "log": torch.log,
    "log1p": torch.log1p,
    "expm1": torch.expm1,
}
POSITIVE = {"log", "log1p"}  # their inputs are |x|


def timings(
    target: CpuTarget, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> dict[str, float]:
    """Median µs of eager, the polynomial kernel and the libm kernel, timed interleaved."""
    (task,) = partition(make_fx(fn, tracing_mode="fake")(x), target).tasks
    space, _ = schedule_space(analyze(prepare_payload(task.payload)), target.capabilities())
    first = max(
        (item for item in space if item[0].get("approximate_math")), key=lambda item: item[1]
    )[0]
    calls: dict[str, Callable[[], object]] = {"eager": lambda: fn(x)}
    for name, approximate in (("polynomial", True), ("libm", False)):
        config = {**first}
        if not approximate:
            config.pop("approximate_math")
        payload = prepare_payload(task.payload, approximate_math=approximate)
        kernel = target.build(task.spec, Kernel(kernel_source(payload, analyze(payload), config)))
        torch.testing.assert_close(kernel(x)[0], fn(x), rtol=1e-5, atol=1e-5)
        calls[name] = lambda kernel=kernel: kernel(x)
    threads = {name: torch.get_num_threads() for name in calls}
    measured = measure_interleaved(calls, MeasureConfig(), threads)
    return {name: m.median_us for name, m in measured.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ops", default=",".join(OPS), help="comma-separated, of: " + ", ".join(OPS)
    )
    parser.add_argument("--shape", default="256x512", help="the input's shape, e.g. 4x32x32x32")
    parser.add_argument("--rounds", type=int, default=2, help="each operator timed this often")
    args = parser.parse_args()
    names = [name for name in args.ops.split(",") if name]
    unknown = sorted(set(names) - set(OPS))
    if unknown:
        parser.error(f"unknown operators {unknown}: choose from {', '.join(OPS)}")
    shape = tuple(int(d) for d in args.shape.split("x"))
    torch.manual_seed(0)
    sample = torch.randn(*shape) * 4
    target = CpuTarget()
    print(f"{'operator':12s} {'eager':>9s} {'polynomial':>11s} {'libm':>9s}   (µs, medians)")
    for _ in range(args.rounds):
        for name in names:
            x = sample.abs() if name in POSITIVE else sample
            t = timings(target, OPS[name], x)
            print(
                f"{name:12s} {t['eager']:9.1f} {t['polynomial']:11.1f} {t['libm']:9.1f}", flush=True
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
