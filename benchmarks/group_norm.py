"""Group norm (+ SiLU) kernels with and without their reshapes regrouped, against eager.

    python benchmarks/group_norm.py [--cases 4x32x32x32/8,1x64x32x32/32,...] [--act silu|none]

Per case (NCHW shape / groups): the fused Task of `silu(group_norm(x))` (or group norm alone),
one rows configuration (all threads, one row a step, vectors of 64, polynomial math, f64
intermediates in f32) built on the payload as it is and on the payload with its regrouping
reshapes refined (`kope-refine-reshapes`: the `regroup` decision), each checked against
eager, then eager and both kernels timed interleaved (`measure_interleaved`: medians, µs).
Run it on a quiet machine (`../shared/tools/quiet-check.sh`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kope.frontend.partition import partition
from kope.passes.analysis import analyze, prepare_payload
from kope.spaces.kernels import kernel_source
from kope.spaces.schedules import REGROUP
from kope.targets.cpu import CpuTarget
from kope.targets.measure import MeasureConfig, measure_interleaved
from kope.vocabulary.kernels import Kernel

CASES = "4x32x32x32/8,1x64x32x32/32,4x64x16x16/8,8x32x16x16/8,4x36x15x15/6,2x128x28x28/32"


def _case(text: str) -> tuple[tuple[int, ...], int]:
    shape, groups = text.split("/")
    return tuple(int(v) for v in shape.split("x")), int(groups)


def _calls(target: CpuTarget, text: str, act: str, threads: int) -> dict[str, Callable[[], object]]:
    """Eager, the plain kernel and the regrouped one for one case, each checked."""
    shape, groups = _case(text)
    x, w, b = torch.randn(*shape), torch.randn(shape[1]), torch.randn(shape[1])

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = F.group_norm(x, groups, w, b)
        return F.silu(y) if act == "silu" else y

    (task,) = partition(make_fx(fn, tracing_mode="fake")(x, w, b), target).tasks
    calls: dict[str, Callable[[], object]] = {"eager": lambda: fn(x, w, b)}
    for name, regroup in (("plain", False), ("regrouped", True)):
        config = {
            "family": "rows",
            "threads": threads,
            "rows": 1,
            "vector": 64,
            "approximate_math": act == "silu",
            "narrow_f64": True,
            REGROUP: regroup,
        }
        payload = prepare_payload(
            task.payload, approximate_math=act == "silu", narrow_f64=True, refine_reshapes=regroup
        )
        kernel = target.build(task.spec, Kernel(kernel_source(payload, analyze(payload), config)))
        torch.testing.assert_close(kernel(x, w, b)[0], fn(x, w, b), rtol=1e-4, atol=1e-4)
        calls[name] = lambda kernel=kernel: kernel(x, w, b)
    return calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=CASES, help=f"shape/groups, comma-separated ({CASES})")
    parser.add_argument("--act", choices=["silu", "none"], default="silu")
    parser.add_argument("--rounds", type=int, default=2, help="each case timed this often")
    args = parser.parse_args()
    torch.manual_seed(0)
    target = CpuTarget()
    threads = torch.get_num_threads()
    print(f"{'case':>18s} {'eager':>8s} {'plain':>8s} {'regrouped':>10s}   (µs, medians)")
    for text in args.cases.split(","):
        calls = _calls(target, text, args.act, threads)
        for _ in range(args.rounds):
            measured = measure_interleaved(calls, MeasureConfig(), dict.fromkeys(calls, threads))
            times = [measured[name].median_us for name in ("eager", "plain", "regrouped")]
            print(f"{text:>18s} {times[0]:8.1f} {times[1]:8.1f} {times[2]:10.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
