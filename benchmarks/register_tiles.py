"""Packed products by register tile on this machine, against torch.mm, interleaved in one process.

    python benchmarks/register_tiles.py [--shapes 128x384x2048,256,...] [--tiles 6x2,8x2,4x4]
                                        [--threads 2]

Per shape (m x k x n, or one size for a cube): `x @ w` with `w` a parameter (so a packed
kernel lays it out once, as in a model), one packed contraction kernel per register tile
(rows x vectors of the machine's width; cache tile 64x256x256, k not unrolled), built with
`CpuTarget.build`, checked against torch, then all of them and torch.mm timed interleaved
(`measure_interleaved`: medians). Prints each one's speed relative to the machine's first
packed tile (the static prior's first pick: `schedule_space`), torch.mm's too. Run it on a
quiet machine (`../shared/tools/quiet-check.sh`).
"""

from __future__ import annotations

import argparse

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kope.frontend.partition import partition
from kope.passes.analysis import analyze, prepare_payload
from kope.spaces.cpu import schedule_space
from kope.spaces.kernels import kernel_source
from kope.targets.cpu import CpuTarget
from kope.targets.measure import MeasureConfig, measure_interleaved
from kope.vocabulary.kernels import Kernel

SHAPES = "128x384x2048,128x1024x384,130x192x768,256,512,64x1024x256"
TILES = "6x2,4x2,8x2,4x4,12x2,6x4,8x1"


def _shape(text: str) -> tuple[int, int, int]:
    m, k, n = (int(v) for v in text.split("x")) if "x" in text else (int(text),) * 3
    return m, k, n


def _config(threads: int, rows: int, width: int) -> dict[str, object]:
    return {
        "family": "contraction",
        "threads": threads,
        "cache": [64, 256, 256],
        "register": [rows, width, 1],
        "pack": True,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=SHAPES, help=f"comma-separated (default {SHAPES})")
    parser.add_argument(
        "--tiles", default=TILES, help=f"rows x vectors, comma-separated (default {TILES})"
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.manual_seed(0)
    target = CpuTarget()
    capabilities = target.capabilities()
    lanes = int(capabilities.get("vector_bits", 256)) // 32
    tiles = [tuple(int(v) for v in tile.split("x")) for tile in args.tiles.split(",")]
    print(f"vector width {lanes} floats, {args.threads} threads; speed relative to the first")
    for text in args.shapes.split(","):
        m, k, n = _shape(text)
        x, w = torch.randn(m, k), torch.nn.Parameter(torch.randn(k, n), requires_grad=False)
        (task,) = partition(make_fx(torch.mm, tracing_mode="fake")(x, w), target).tasks
        payload = prepare_payload(task.payload)
        info = analyze(payload)
        space = [(c, score) for c, score in schedule_space(info, capabilities)[0] if c.get("pack")]
        if not space:
            print(f"{m}x{k}x{n}: no packed point")
            continue
        first = max(space, key=lambda point: point[1])[0]["register"]
        names = [f"{first[0]}x{first[1] // lanes} (first)"]
        configs = [_config(args.threads, first[0], first[1])]
        for rows, vectors in tiles:
            if [rows, vectors * lanes] != first[:2]:
                names.append(f"{rows}x{vectors}")
                configs.append(_config(args.threads, rows, vectors * lanes))
        calls = {"torch.mm": lambda x=x, w=w: torch.mm(x, w)}
        for name, config in zip(names, configs, strict=True):
            kernel = target.build(task.spec, Kernel(kernel_source(payload, info, config)))
            torch.testing.assert_close(kernel(x, w)[0], x @ w, rtol=1e-3, atol=1e-3)
            calls[name] = lambda kernel=kernel, x=x, w=w: kernel(x, w)
        measured = measure_interleaved(calls, MeasureConfig(), dict.fromkeys(calls, args.threads))
        base = measured[names[0]].median_us
        ratios = ", ".join(f"{name} {base / m_.median_us:.2f}" for name, m_ in measured.items())
        print(f"{m}x{k}x{n} (first {base:.0f} µs): {ratios}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
