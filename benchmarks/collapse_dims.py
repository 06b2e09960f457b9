"""Rows kernels with and without their innermost loops collapsed (`kope-collapse-dims`).

    python benchmarks/collapse_dims.py [--cases silu:8x64x7x7,gn_silu:2x128x28x28/32,...]
                                       [--rounds 2]

Per case, the Task of one small function over an NCHW feature map, and one rows
configuration (all threads, one row a step, vectors of four machine vectors, polynomial math
where the payload has some, f64 intermediates in f32) built on the payload as it is and on
the payload with its innermost loops collapsed (the `collapse_dims` decision); group norms
also with their reshapes regrouped (`regroup`), with and without. Each kernel is checked
against eager, then eager and every kernel are timed interleaved (`measure_interleaved`:
medians, µs). Run it on a quiet machine (`../shared/tools/quiet-check.sh`).

Kinds: `silu` (an activation), `bn_relu` (batch norm in eval mode + ReLU: a per-channel
scale and shift), `add_relu` (a residual add + ReLU), `mean_hw` (a global average pool), `gn_silu`
(group norm + SiLU; `SHAPE/GROUPS`).
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
from kope.spaces.schedules import COLLAPSE, REGROUP
from kope.targets.cpu import CpuTarget
from kope.targets.measure import MeasureConfig, measure_interleaved
from kope.vocabulary.kernels import Kernel

CASES = ",".join(
    [
        "silu:8x64x7x7",
        "silu:2x64x28x28",
        "silu:2x32x56x56",
        "bn_relu:8x64x14x14",
        "add_relu:4x64x28x28",
        "mean_hw:8x256x7x7",
        "gn_silu:2x128x28x28/32",
        "gn_silu:4x36x15x15/6",
        "gn_silu:4x32x32x32/8",
    ]
)


def _function(kind: str, spec: str) -> tuple[Callable[..., torch.Tensor], list[torch.Tensor]]:
    shape_text, _, groups_text = spec.partition("/")
    shape = tuple(int(v) for v in shape_text.split("x"))
    x, c = torch.randn(*shape), shape[1]
    if kind == "silu":
        return lambda x: F.silu(x), [x]
    if kind == "bn_relu":
        # batch norm in eval mode as it runs: a per-channel scale and shift
        def bn_relu(x: torch.Tensor, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return F.relu(x * s.view(1, -1, 1, 1) + t.view(1, -1, 1, 1))

        return bn_relu, [x, torch.randn(c), torch.randn(c)]
    if kind == "add_relu":
        return lambda x, y: F.relu(x + y), [x, torch.randn(*shape)]
    if kind == "mean_hw":
        return lambda x: x.mean((2, 3)), [x]
    if kind == "gn_silu":
        groups = int(groups_text)
        return lambda x, w, b: F.silu(F.group_norm(x, groups, w, b)), [
            x,
            torch.randn(c),
            torch.randn(c),
        ]
    raise SystemExit(f"unknown kind {kind!r}: silu, bn_relu, add_relu, mean_hw or gn_silu")


def _calls(target: CpuTarget, case: str, threads: int) -> dict[str, Callable[[], object]]:
    """Eager and each variant's kernel for one case, each checked against eager."""
    kind, spec = case.split(":")
    fn, inputs = _function(kind, spec)
    (task,) = partition(make_fx(fn, tracing_mode="fake")(*inputs), target).tasks
    expected = fn(*inputs)
    lanes = target.capabilities()["vector_bits"] // 32
    calls: dict[str, Callable[[], object]] = {"eager": lambda: fn(*inputs)}
    variants = [("plain", False, False), ("collapsed", False, True)]
    if kind == "gn_silu":
        variants += [("regrouped", True, False), ("regrouped+collapsed", True, True)]
    for name, regroup, collapse in variants:
        approximate = kind in ("silu", "gn_silu")
        payload = prepare_payload(
            task.payload,
            approximate_math=approximate,
            narrow_f64=True,
            refine_reshapes=regroup,
            collapse_dims=collapse,
        )
        config = {"family": "rows", "threads": threads, "rows": 1, "vector": 4 * lanes}
        config |= {"approximate_math": approximate, REGROUP: regroup, COLLAPSE: collapse}
        kernel = target.build(task.spec, Kernel(kernel_source(payload, analyze(payload), config)))
        got = kernel(*inputs)[0]
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        calls[name] = lambda kernel=kernel: kernel(*inputs)
    return calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=CASES, help=f"kind:shape, comma-separated ({CASES})")
    parser.add_argument("--rounds", type=int, default=2, help="each case timed this often")
    args = parser.parse_args()
    torch.manual_seed(0)
    target = CpuTarget()
    threads = torch.get_num_threads()
    for case in args.cases.split(","):
        calls = _calls(target, case, threads)
        for _ in range(args.rounds):
            measured = measure_interleaved(calls, MeasureConfig(), dict.fromkeys(calls, threads))
            row = "  ".join(f"{name} {measured[name].median_us:7.1f}" for name in calls)
            print(f"{case:>24s}  {row}   (µs, medians)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
