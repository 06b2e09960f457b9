"""Timing: warm-up, calibrated inner loops, interleaved repeats, median and spread.

Candidates and baselines are timed in the same process, on the same inputs, in rotating order
within each round, so that machine noise falls on all of them alike.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kope.targets.base import Timing


@dataclass(frozen=True)
class MeasureConfig:
    repeats: int = 15
    sample_s: float = 2e-3  # each sample loops the callable for about this long
    warmup_s: float = 5e-3
    budget_s: float = 2.0  # a slow kernel gets fewer repeats, never fewer than `min_repeats`
    min_repeats: int = 3


def measure_interleaved(
    fns: dict[str, Callable[[], Any]],
    config: MeasureConfig = MeasureConfig(),
    threads: dict[str, int] | None = None,
) -> dict[str, Timing]:
    """Time each zero-argument callable; returns per-call Timing (microseconds) by name."""
    loops: dict[str, int] = {}
    per_call: dict[str, float] = {}
    for name, fn in fns.items():
        loops[name], per_call[name] = _calibrate(fn, config)
    round_s = sum(loops[n] * per_call[n] for n in fns)
    repeats = config.repeats
    if round_s * repeats > config.budget_s:
        repeats = max(config.min_repeats, int(config.budget_s / max(round_s, 1e-9)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn, n = fns[name], loops[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - start) / n * 1e6)
    threads = threads or {}
    return {name: _timing(values, threads.get(name, 1)) for name, values in samples.items()}


def _calibrate(fn: Callable[[], Any], config: MeasureConfig) -> tuple[int, float]:
    """Warm up, then pick the loop count that makes one sample last about `sample_s`."""
    start = time.perf_counter()
    calls = 0
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= config.warmup_s and calls >= 2:
            break
    per_call = elapsed / calls
    return max(1, int(config.sample_s / max(per_call, 1e-9))), per_call


def _timing(values: list[float], threads: int) -> Timing:
    ordered = sorted(values)
    median = statistics.median(ordered)
    if len(ordered) >= 4:
        q = statistics.quantiles(ordered, n=4)
        spread = q[2] - q[0]
    else:
        spread = ordered[-1] - ordered[0]
    return Timing(median_us=median, spread_us=spread, repeats=len(values), threads=threads)


def eager_threads() -> int:
    return torch.get_num_threads()
