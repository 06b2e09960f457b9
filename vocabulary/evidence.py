"""What a measurement says, in the words every room uses: verdicts, timings and their quality,
evaluations, and where a kernel came from.

Targets produce these, the loop and selection read them, memory stores them as plain strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Verdicts. Snapshots store a verdict as its index in `VERDICTS`: new ones go at the end.
VERIFIED = "verified"
COMPILE_ERROR = "compile_error"
RUNTIME_ERROR = "runtime_error"
TIMEOUT = "timeout"
MISMATCH = "mismatch"
VERDICTS = (VERIFIED, COMPILE_ERROR, RUNTIME_ERROR, TIMEOUT, MISMATCH)
VERDICT_NAMES = {  # in words, for people
    VERIFIED: "verified",
    MISMATCH: "wrong result (mismatch)",
    COMPILE_ERROR: "build failed",
    RUNTIME_ERROR: "run failed",
    TIMEOUT: "timed out",
}

# Where a candidate came from. Snapshots store it as its index in `SOURCES`: new ones go at the end.
SOURCE_EAGER = "eager"  # eager ATen: the baseline
SOURCE_REFERENCE = "reference"  # the reference lowering (torch-mlir)
SOURCE_AGENT = "agent"  # an agent's rewrite
SOURCE_GRAPH = "graph"  # a whole compiled graph (its kernel choices), timed against eager's
SOURCES = (SOURCE_EAGER, SOURCE_REFERENCE, SOURCE_AGENT, SOURCE_GRAPH)

# The quality of a timing: whether the figure rests on rounds no other work disturbed.
TIMING_CLEAN = "clean"  # enough undisturbed rounds; the figure may pin a choice
TIMING_CONTAMINATED = "contaminated"  # too few undisturbed rounds; recorded, never pins
TIMING_UNKNOWN = "unknown"  # measured before KOPE judged timings (older stores)
TIMING_QUALITIES = (TIMING_CLEAN, TIMING_CONTAMINATED, TIMING_UNKNOWN)


@dataclass(frozen=True)
class Timing:
    """A latency distribution (median and interquartile spread of per-call samples) and how
    far it can be trusted: the rounds run and how many of them no other work disturbed, the
    share of the measuring threads' time spent waiting for a CPU, and the load average."""

    median_us: float
    spread_us: float
    repeats: int  # samples the median is taken over (clean rounds only)
    threads: int
    rounds: int = 0  # rounds run, disturbed ones included
    clean_rounds: int = 0
    wait_share: float | None = None  # run-queue wait / wall time of the measuring threads
    load: float | None = None  # 1-minute load average when the timing started
    quality: str = TIMING_UNKNOWN

    @property
    def clean(self) -> bool:
        return self.quality == TIMING_CLEAN


def quality_of(*timings: Timing | None) -> dict[str, Any]:
    """The quality fields of a figure resting on `timings` (None ones ignored): clean only if
    every one is, contaminated if any is; the fewest clean rounds, the largest wait share."""
    present = [t for t in timings if t is not None]
    if not present:
        return {}
    qualities = {t.quality for t in present}
    quality = (
        TIMING_CONTAMINATED
        if TIMING_CONTAMINATED in qualities
        else TIMING_CLEAN
        if qualities == {TIMING_CLEAN}
        else TIMING_UNKNOWN
    )
    waits = [t.wait_share for t in present if t.wait_share is not None]
    loads = [t.load for t in present if t.load is not None]
    return {
        "timing_quality": quality,
        "clean_rounds": min(t.clean_rounds for t in present),
        "rounds": max(t.rounds for t in present),
        "wait_share": max(waits) if waits else None,
        "load": max(loads) if loads else None,
    }


@dataclass
class Evaluation:
    """What happened to one candidate: verdict, error text, accuracy and timings."""

    verdict: str
    error: str | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    kernel: Timing | None = None
    eager: Timing | None = None
    reference: Timing | None = None  # the oracle kernel, timed alongside when there is one
    oracle: str = ""  # what the outputs were checked against
    trials: int = 0
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    # The thread count the figures mean: the measuring process's torch threads, which eager
    # runs with and parallel kernels use (0: not measured).
    threads: int = 0
    # A GPU kernel compiled for each architecture its target names, without the device
    # (`kope.targets.device_compile`): {"sm_90": {"ok", "registers", "spills",
    # "shared_bytes", "error", ..., "estimate_us"}}; None where nothing was compiled.
    device_compile: dict[str, dict[str, Any]] | None = None

    @property
    def verified(self) -> bool:
        return self.verdict == VERIFIED
