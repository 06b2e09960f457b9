"""Timing: warm-up, calibrated inner loops, interleaved repeats, median and spread.

Candidates and baselines are timed in the same process, on the same inputs, in rotating order
within each round, so that machine noise falls on all of them alike.

How long an evaluation may take follows from the operator's work (`estimate_work`): its
verification runs the kernel and its oracle once per trial, so a 2048x8192x4096 matmul's
reference lowering (naive loops, minutes per call) gets minutes per trial, while a small
operator keeps the fixed limit. A candidate whose one call takes longer than
`MeasureConfig.max_call_s` is verified but not timed: timing needs several calls (calibration
and repeats), and a kernel that slow cannot be the one that wins.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch_mlir import ir

from kope.passes.analysis import analyze
from kope.targets.base import TaskSpec, Timing

log = logging.getLogger("kope.targets.measure")

# The slowest rates at which a kernel of KOPE's CPU target is expected to run: the reference
# lowering (naive loops, one thread, O3) ran 0.5-0.9 G loop iterations/s here (mm 256^3, a sum
# of 16M floats); a tenth of that leaves room for a machine shared with other work.
ITERATIONS_PER_S = 1e8
BYTES_PER_S = 5e8


@dataclass(frozen=True)
class MeasureConfig:
    repeats: int = 15
    sample_s: float = 2e-3  # each sample loops the callable for about this long
    warmup_s: float = 5e-3
    budget_s: float = 2.0  # a slow kernel gets fewer repeats, never fewer than `min_repeats`
    min_repeats: int = 3
    # A candidate slower than this per call is verified but not timed (eager always is): it
    # would need 2 + min_repeats calls, and eager-speed kernels of the largest operators
    # (a 2048x8192x4096 matmul: ~1.5 s here) must still be timed.
    max_call_s: float = 5.0

    @property
    def calls_per_timing(self) -> int:
        """The fewest calls timing one slow callable makes: two to calibrate, then repeats."""
        return 2 + self.min_repeats


@dataclass(frozen=True)
class Work:
    """What one call of an operator does: loop iterations of its linalg ops, bytes of its
    arguments, and the length of its longest reduction (for the verifier's tolerance)."""

    iterations: int
    bytes: int
    reduction: int

    @property
    def call_s(self) -> float:
        """A generous estimate of one call's duration at the slowest expected rates."""
        return self.iterations / ITERATIONS_PER_S + self.bytes / BYTES_PER_S


def estimate_work(task: TaskSpec, payload: str | None) -> Work:
    """The work of `task`, from its linalg payload when it parses, else from its shapes."""
    nbytes = sum(
        math.prod(s.shape) * torch.empty((), dtype=s.torch_dtype).element_size()
        for s in (*task.inputs, *task.outputs)
    )
    if payload is not None:
        try:
            info = analyze(payload)
        except (ir.MLIRError, ValueError, IndexError) as err:
            log.debug("no work estimate from the payload of %s: %s", task.label, err)
        else:
            iterations = sum(math.prod(max(1, r) for r in op.ranges) for op in info.ops)
            reduction = max(
                (math.prod(max(1, op.ranges[d]) for d in op.reduction_dims) for op in info.ops),
                default=1,
            )
            return Work(max(1, iterations), nbytes, max(1, reduction))
    # Without loops to read: every output element reads the inputs once, and a reduction's
    # length is at most elements in per element out.
    largest_in = max((math.prod(s.shape) for s in task.inputs), default=1)
    smallest_out = max(1, min((math.prod(s.shape) for s in task.outputs), default=1))
    outputs = sum(math.prod(s.shape) for s in task.outputs)
    return Work(max(1, largest_in + outputs), nbytes, max(1, largest_in // smallest_out))


def evaluation_limit_s(work: Work, trials: int, measure: bool, config: MeasureConfig) -> float:
    """Seconds the runs of one evaluation need at the slowest expected rates: the kernel and
    its oracle once per trial, then (if measured) eager, the kernel and the reference at least
    `calls_per_timing` calls each. Building and the fixed timing budget are not included."""
    verify_s = trials * 2 * work.call_s
    if not measure:
        return verify_s
    return verify_s + config.calls_per_timing * 3 * work.call_s


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
