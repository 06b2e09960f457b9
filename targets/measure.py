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

import dataclasses
import itertools
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch_mlir import ir

from kope.passes.analysis import analyze
from kope.vocabulary.evidence import TIMING_CLEAN, TIMING_CONTAMINATED, TIMING_UNKNOWN, Timing
from kope.vocabulary.specs import TaskSpec

log = logging.getLogger("kope.targets.measure")

# The slowest rates at which a kernel of KOPE's CPU target is expected to run: the reference
# lowering (naive loops, one thread, O3) ran 0.5-0.9 G loop iterations/s here (mm 256^3, a sum
# of 16M floats); a tenth of that leaves room for a machine shared with other work.
ITERATIONS_PER_S = 1e8
BYTES_PER_S = 5e8


@dataclass(frozen=True)
class MeasureConfig:
    """How candidates are timed, and when a timing counts as undisturbed."""

    repeats: int = 15
    sample_s: float = 2e-3  # each sample loops the callable for about this long
    # ... and at least this many times. A whole graph's first call after another graph's runs
    # on caches that one left: if the two keep different copies of a weight (a kernel's packed
    # one, eager's), it fetches its own from memory. That costs once per switch, not once per
    # call of a loop, so graphs are timed over several calls (`kope.frontend.whole_graph`).
    min_calls: int = 1
    # ... while that many calls take at most this long: a switch costs microseconds to
    # milliseconds, and ten calls of a 1 s graph (a 512 MB instance norm) made its first
    # compile's timing take a minute.
    min_calls_s: float = 0.05
    warmup_s: float = 5e-3
    budget_s: float = 2.0  # a slow kernel gets fewer repeats, never fewer than `min_repeats`
    min_repeats: int = 3
    # A candidate slower than this per call is verified but not timed (eager always is): it
    # would need 2 + min_repeats calls, and eager-speed kernels of the largest operators
    # (a 2048x8192x4096 matmul: ~1.5 s here) must still be timed.
    max_call_s: float = 5.0
    # ... and so is one slower than `hopeless_s` per call and more than `hopeless_factor` times
    # eager: it cannot win, and its timing would take seconds (a naive 256x1024x1024 matmul
    # reference, 1.9 s a call against eager's 7 ms, took 10 s of a model's first compile).
    hopeless_s: float = 0.5
    hopeless_factor: float = 20.0
    # A figure is clean with at least max(min_clean, repeats // 2) undisturbed rounds, or with
    # all planned rounds when a slow kernel gets fewer (it may get only `min_repeats`).
    min_clean: int = 5
    # Disturbed rounds are run again: at most this many times the planned rounds in all, in at
    # most `retry_s` beyond what the planned rounds were expected to take, after a sleep of
    # `backoff_s` doubling up to `max_backoff_s` between disturbed rounds (a competing process
    # gets time to finish; its time slices are milliseconds).
    max_round_factor: int = 3
    retry_s: float = 2.0
    backoff_s: float = 0.01
    max_backoff_s: float = 0.5
    # A sample is disturbed when the run-queue wait of the process's threads, summed, exceeds
    # the larger of `wait_floor_s` and `wait_share_limit` of its wall time. A sum, not a max:
    # eager's OpenMP threads are one process and wait for each other at barriers, so delays of
    # different threads at different barriers add to the wall time; the sum bounds the delay
    # from above (overlapping waits count twice), so a sample under it is undisturbed, and a
    # false alarm costs only a re-run. An idle OpenMP worker that spins and waits counts too:
    # no CPU was free. Competing processes take a CPU for scheduler slices of milliseconds
    # (waits here came in multiples of ~4 ms), a quiet machine's kernel threads for
    # microseconds; the 2% share (within the few percent KOPE's figures move by anyway) rules
    # samples longer than 5 ms, one call of a slow kernel.
    # Measured on this 2-core machine, samples of 0.2-2 ms (eager mm 8x96x256 on 2 threads, a
    # relu, a Python loop; 1,500-3,000 samples each): at load 0.8 none of 4,500 was flagged
    # (largest wait 49 µs); at load 0.9-1.6 (other tests running) 2% of single-threaded and
    # 15% of eager mm samples were, and false positives (flagged, yet within 3% of the clean
    # median) were 0.0-0.4% of all samples.
    wait_floor_s: float = 100e-6
    wait_share_limit: float = 0.02
    # Timing rotates the data operand among this many input sets (fresh inputs per call).
    input_sets: int = 3

    @property
    def calls_per_timing(self) -> int:
        """The fewest calls timing one slow callable makes: two to calibrate, then repeats."""
        return 2 + self.min_repeats

    def clean_needed(self, planned: int) -> int:
        """Clean rounds a figure needs when `planned` rounds fit the budget."""
        return min(planned, max(self.min_clean, self.repeats // 2))


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
    `calls_per_timing` calls each, a possible re-measurement of eager and the kernel (an
    implausible speedup), and the oracle once per timing input set (the check after timing).
    Building and the fixed timing budget (`budget_s`, `retry_s`) are not included."""
    verify_s = trials * 2 * work.call_s
    if not measure:
        return verify_s
    timing_s = config.calls_per_timing * (3 + 2) * work.call_s
    return verify_s + timing_s + config.input_sets * work.call_s


# The share of the machine's CPU time that other processes may take while it still counts as
# quiet (`others_busy_share`): one busy neighbour on two cores takes half.
QUIET_SHARE = 0.1


def others_busy_share(window_s: float = 0.1) -> float | None:
    """The share of all cores' time that processes other than this one kept busy over the next
    `window_s` (from `/proc/stat` and this process's own CPU time); None where `/proc/stat`
    cannot be read. A cheap look at the machine before a measurement that is worth making
    only on a quiet one."""

    def machine() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]) - idle, sum(fields[:8])

    def own_ticks() -> int:
        times = os.times()
        return round((times.user + times.system) * os.sysconf("SC_CLK_TCK"))

    before, own_before = machine(), own_ticks()
    time.sleep(window_s)
    after, own_after = machine(), own_ticks()
    if before is None or after is None or after[1] <= before[1]:
        return None
    busy = (after[0] - before[0]) - (own_after - own_before)
    return max(0.0, busy / (after[1] - before[1]))


def machine_quiet() -> bool:
    """Whether other processes leave the machine quiet enough to time on now (a tenth of a
    second's look; False where it cannot be told)."""
    busy = others_busy_share()
    return busy is not None and busy < QUIET_SHARE


# The run-queue wait of threads, in ns by thread id; None where it cannot be read.
WaitProbe = Callable[[], Mapping[int, int] | None]


class SchedstatProbe:
    """Reads the run-queue wait (second field of `/proc/self/task/<tid>/schedstat`, ns) of
    every thread of this process. Files stay open and are re-read with `pread`: ~12 µs for four
    threads, where opening them each time took ~100 µs. None where schedstat is missing (a
    kernel without CONFIG_SCHED_INFO): the timing's quality is then unknown."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}

    def __call__(self) -> dict[int, int] | None:
        try:
            tids = [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:
            return None
        waits: dict[int, int] = {}
        for tid in tids:
            try:
                fd = self._fds.get(tid)
                if fd is None:
                    fd = self._fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
                waits[tid] = int(os.pread(fd, 128, 0).split()[1])
            except (OSError, IndexError, ValueError):
                # A thread that ended in between: nothing of it to count.
                self._forget(tid)
        if tids and not waits:
            return None
        for tid in [t for t in self._fds if t not in waits]:
            self._forget(tid)
        return waits

    def _forget(self, tid: int) -> None:
        fd = self._fds.pop(tid, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for tid in list(self._fds):
            self._forget(tid)


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def rotating(calls: Sequence[Callable[[], Any]]) -> tuple[Callable[[], None], list[Any]]:
    """One zero-argument callable running `calls` in turn, one per call, and the latest result
    of each (for checking after timing what the timed calls returned)."""
    latest: list[Any] = [None] * len(calls)
    turn = itertools.cycle(range(len(calls))).__next__

    def call() -> None:
        index = turn()
        latest[index] = calls[index]()

    return call, latest


def measure_interleaved(
    fns: dict[str, Callable[[], Any]],
    config: MeasureConfig = MeasureConfig(),
    threads: dict[str, int] | None = None,
    probe: WaitProbe | None = None,
) -> dict[str, Timing]:
    """Time each zero-argument callable; returns per-call Timing (microseconds) by name.

    A round is one sample of every callable, in an order that rotates from round to round. A
    round in which any sample waited for a CPU (`probe`, by default the run-queue wait of all
    threads of this process) beyond `config`'s threshold is disturbed: it is discarded and run
    again, with back-off, at most `max_round_factor` times the planned rounds and within
    `retry_s`. The figure is the median of the clean rounds when there are enough of them
    (`TIMING_CLEAN`), else the median of all rounds, marked `TIMING_CONTAMINATED`.
    """
    load = _load_average()
    own_probe = SchedstatProbe() if probe is None else None
    wait_of = probe or own_probe
    assert wait_of is not None
    try:
        return _measure(fns, config, threads or {}, wait_of, load)
    finally:
        if own_probe is not None:
            own_probe.close()


@dataclass
class _Round:
    """One sample of every callable: per-call microseconds, wall and wait seconds per name."""

    per_call_us: dict[str, float] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)
    wait_s: dict[str, float | None] = field(default_factory=dict)
    disturbed: bool = False


def _measure(
    fns: dict[str, Callable[[], Any]],
    config: MeasureConfig,
    threads: dict[str, int],
    probe: WaitProbe,
    load: float | None,
) -> dict[str, Timing]:
    loops: dict[str, int] = {}
    per_call: dict[str, float] = {}
    for name, fn in fns.items():
        loops[name], per_call[name] = _calibrate(fn, config)
    round_s = sum(loops[n] * per_call[n] for n in fns)
    planned = config.repeats
    if round_s * planned > config.budget_s:
        planned = max(config.min_repeats, int(config.budget_s / max(round_s, 1e-9)))
    needed = config.clean_needed(planned)
    names = list(fns)
    rounds: list[_Round] = []
    clean = 0
    backoff = config.backoff_s
    started = time.perf_counter()
    # Re-runs may add `retry_s` to what the planned rounds were expected to take; a round is
    # started only if it is expected to end by then, so a slow kernel is never cut short.
    deadline = started + planned * round_s + config.retry_s
    most = config.max_round_factor * planned
    while clean < planned and len(rounds) < most:
        if len(rounds) >= planned and time.perf_counter() + round_s > deadline:
            break
        shift = len(rounds) % len(names)
        sample = _round(fns, loops, names[shift:] + names[:shift], probe, config)
        rounds.append(sample)
        if not sample.disturbed:
            clean += 1
            backoff = config.backoff_s
            continue
        if len(rounds) >= most:
            break
        if time.perf_counter() + backoff + round_s > deadline:
            if len(rounds) >= planned:
                break
            continue  # the planned rounds run whatever the time, as they always did
        # Another process held a CPU: give it time to go, longer after each disturbed round.
        time.sleep(backoff)
        backoff = min(2 * backoff, config.max_backoff_s)
    known = all(w is not None for r in rounds for w in r.wait_s.values())
    kept = [r for r in rounds if not r.disturbed] if known else rounds
    if not known:
        quality = TIMING_UNKNOWN
    elif len(kept) >= needed:
        quality = TIMING_CLEAN
    else:
        quality = TIMING_CONTAMINATED
        kept = rounds
    if quality != TIMING_CLEAN:
        log.debug(
            "%s timing: %d of %d rounds clean (%d needed), load %s",
            quality,
            clean,
            len(rounds),
            needed,
            load,
        )
    timings = {}
    for name in names:
        wall = sum(r.wall_s[name] for r in rounds)
        waits = [r.wait_s[name] for r in rounds]
        share = sum(w for w in waits if w is not None) / wall if known and wall > 0 else None
        timings[name] = _timing(
            [r.per_call_us[name] for r in kept],
            threads.get(name, 1),
            rounds=len(rounds),
            clean_rounds=clean if known else 0,
            wait_share=share,
            load=load,
            quality=quality,
        )
    return timings


def _round(
    fns: dict[str, Callable[[], Any]],
    loops: dict[str, int],
    order: list[str],
    probe: WaitProbe,
    config: MeasureConfig,
) -> _Round:
    """One sample of each callable in `order`; the probe is read outside the timed loop."""
    result = _Round()
    for name in order:
        fn, n = fns[name], loops[name]
        before = probe()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        wall = time.perf_counter() - start
        after = probe()
        wait = _wait_s(before, after)
        result.per_call_us[name] = wall / n * 1e6
        result.wall_s[name] = wall
        result.wait_s[name] = wait
        if wait is not None and wait > max(config.wait_floor_s, config.wait_share_limit * wall):
            result.disturbed = True
    return result


def _wait_s(before: Mapping[int, int] | None, after: Mapping[int, int] | None) -> float | None:
    """Seconds of run-queue wait of all threads between two probe readings (None: unknown).

    A thread that started in between counts from zero; one that ended is not counted."""
    if before is None or after is None:
        return None
    return sum(max(0, ns - before.get(tid, 0)) for tid, ns in after.items()) / 1e9


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
    floor = min(config.min_calls, max(1, int(config.min_calls_s / max(per_call, 1e-9))))
    return max(floor, int(config.sample_s / max(per_call, 1e-9))), per_call


def _timing(values: list[float], threads: int, **quality: Any) -> Timing:
    """The median and interquartile spread of `values`, with how far they can be trusted.

    The median, not a low quantile or the minimum: once disturbed rounds are gone, what is left
    varies a few percent (caches, clock), and a low quantile would reward the candidate whose
    timings vary most (its lucky samples) over a steadier one of the same typical speed. The
    median is also what figures recorded before quality was judged are, so they stay comparable.
    """
    ordered = sorted(values)
    median = statistics.median(ordered)
    if len(ordered) >= 4:
        q = statistics.quantiles(ordered, n=4)
        spread = q[2] - q[0]
    else:
        spread = ordered[-1] - ordered[0]
    return Timing(
        median_us=median, spread_us=spread, repeats=len(values), threads=threads, **quality
    )


def eager_threads() -> int:
    return torch.get_num_threads()


# A kernel's clean speedup over eager above this is re-measured before it is believed.
# KernelBench flags speedups over 10x as suspect; KOPE's fused elementwise chains legitimately
# reach ~7x here (one pass over memory instead of one per op), so 10x stays above what KOPE's
# kernels have honestly reached while catching the order-of-magnitude wins that public
# benchmarks traced to skipped work, cached results or a disturbed baseline. A false alarm
# costs one more measurement.
IMPLAUSIBLE_SPEEDUP = 10.0


def speedup(kernel: Timing | None, eager: Timing | None) -> float | None:
    """Eager's median over the kernel's, or None when either is missing."""
    if kernel is None or eager is None or kernel.median_us <= 0:
        return None
    return eager.median_us / kernel.median_us


def recheck_implausible(
    timings: dict[str, Timing],
    remeasure: Callable[[], dict[str, Timing]],
    notes: list[str],
) -> dict[str, Timing]:
    """`timings` with an implausible clean speedup of "kernel" over "eager" checked.

    Above IMPLAUSIBLE_SPEEDUP, `remeasure` times the two again (a fresh interleaved
    measurement). A win that is not clean the second time, or falls below half of the first,
    did not reproduce: the kernel's timing becomes contaminated (it never pins a choice). A win
    that reproduces keeps the measurement with the lower speedup. `notes` gets why.
    """
    kernel, eager = timings.get("kernel"), timings.get("eager")
    first = speedup(kernel, eager)
    if kernel is None or eager is None or first is None or first <= IMPLAUSIBLE_SPEEDUP:
        return timings
    if not (kernel.clean and eager.clean):
        return timings  # already a figure that pins nothing
    again = remeasure()
    second = speedup(again.get("kernel"), again.get("eager"))
    clean = all(t.clean for t in (again.get("kernel"), again.get("eager")) if t is not None)
    if second is None or not clean or second < first / 2:
        shown = "no figure" if second is None else f"{second:.1f}x"
        notes.append(
            f"implausible speedup {first:.1f}x over eager not reproduced by re-measurement "
            f"({shown}{'' if clean else ', not clean'}): the kernel's timing is contaminated"
        )
        log.info("%s", notes[-1])
        return {**timings, "kernel": dataclasses.replace(kernel, quality=TIMING_CONTAMINATED)}
    notes.append(
        f"implausible speedup confirmed by re-measurement: {first:.1f}x, then {second:.1f}x "
        "(the lower is kept)"
    )
    if second < first:
        return {**timings, "kernel": again["kernel"], "eager": again["eager"]}
    return timings
