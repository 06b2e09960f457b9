"""The target interface: what every target offers the compiler, and the plain data it exchanges.

A target builds a candidate kernel for one operator, runs it in an isolated worker, verifies it
against an oracle, times it against eager ATen, and loads verified kernels into the calling
process for dispatch. Failures are data (`Evaluation.verdict`, `Evaluation.error`), never
exceptions that escape to the caller.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

# Verdicts, in the order a candidate can fail.
COMPILE_ERROR = "compile_error"
RUNTIME_ERROR = "runtime_error"
TIMEOUT = "timeout"
MISMATCH = "mismatch"
VERIFIED = "verified"
VERDICTS = (COMPILE_ERROR, RUNTIME_ERROR, TIMEOUT, MISMATCH, VERIFIED)


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one kernel argument; kernels are specialised on static shapes."""

    shape: tuple[int, ...]
    dtype: str  # a torch dtype name: "float32", "int64", "bool", ...

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        return cls(tuple(int(s) for s in t.shape), str(t.dtype).removeprefix("torch."))

    def __str__(self) -> str:
        dims = "x".join(str(s) for s in self.shape)
        short = _SHORT_DTYPE.get(self.dtype, self.dtype)
        return f"{dims}x{short}" if dims else short


_SHORT_DTYPE = {
    "float64": "f64",
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "bool": "i1",
}


@dataclass(frozen=True)
class InputRef:
    """Stands for the kernel's i-th input inside an `OpCall`'s arguments."""

    index: int


@dataclass(frozen=True)
class OpCall:
    """How to run an operator eagerly: an ATen overload by name, tensor arguments as `InputRef`s.

    This is the baseline every kernel is timed against and the oracle of the reference lowering.
    It is plain data so that it can cross into a worker process.
    """

    op: str  # e.g. "aten.mm.default"
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()

    def resolve(self) -> Callable[..., Any]:
        namespace, name, overload = self.op.split(".")
        return getattr(getattr(getattr(torch.ops, namespace), name), overload)

    def bind(self, inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
        """A zero-argument callable running the op on `inputs` (for timing loops)."""
        fn = self.resolve()
        args = _substitute(self.args, inputs)
        kwargs = {k: _substitute(v, inputs) for k, v in self.kwargs}
        return lambda: fn(*args, **kwargs)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        out = self.bind(inputs)()
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


@dataclass(frozen=True)
class StepRef:
    """Stands for the result of an earlier step of a `Program` (its `index`-th, if several)."""

    step: int
    index: int | None = None


@dataclass(frozen=True)
class Program:
    """A few ATen calls in order: the eager baseline of a fused group of operators."""

    steps: tuple[OpCall, ...]
    outputs: tuple[StepRef, ...]

    @property
    def op(self) -> str:
        return "+".join(step.op for step in self.steps)

    def bind(self, inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
        calls = [(step.resolve(), step) for step in self.steps]

        def run() -> tuple[torch.Tensor, ...]:
            values: list[Any] = []
            for fn, step in calls:
                args = _substitute(step.args, inputs, values)
                kwargs = {k: _substitute(v, inputs, values) for k, v in step.kwargs}
                values.append(fn(*args, **kwargs))
            return tuple(_substitute(ref, inputs, values) for ref in self.outputs)

        return run

    def __call__(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return self.bind(inputs)()


def _substitute(value: Any, inputs: Sequence[torch.Tensor], values: Sequence[Any] = ()) -> Any:
    if isinstance(value, InputRef):
        return inputs[value.index]
    if isinstance(value, StepRef):
        result = values[value.step]
        return result if value.index is None else result[value.index]
    if isinstance(value, (list, tuple)):
        return type(value)(_substitute(v, inputs, values) for v in value)
    return value


@dataclass(frozen=True)
class TaskSpec:
    """One operator as a target sees it: its signature and its eager baseline."""

    label: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    eager: OpCall | Program


@dataclass(frozen=True)
class Kernel:
    """A candidate kernel as MLIR text.

    `source` holds either `func.func @main` on tensors (a linalg payload; the target wraps it in
    its calling convention) or `func.func @kope_kernel` on memrefs, inputs then outputs, with
    outputs as destinations (already in the calling convention).
    """

    source: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


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

    @property
    def verified(self) -> bool:
        return self.verdict == VERIFIED


class Target(ABC):
    """A hardware target: builds, isolates, verifies, times and loads kernels."""

    name: ClassVar[str]

    @abstractmethod
    def key(self) -> str:
        """Everything about the target that can change a kernel's result or speed."""

    @abstractmethod
    def evaluate(
        self,
        task: TaskSpec,
        kernel: Kernel,
        *,
        oracle: Kernel | None = None,
        measure: bool = True,
        seed: int = 0,
    ) -> Evaluation:
        """Build, verify and (if verified and `measure`) time `kernel` in an isolated worker.

        The oracle is `oracle` when given, else eager ATen (in float64 where the op allows).
        Never raises for a bad candidate: the verdict says what went wrong.
        """

    @abstractmethod
    def load(self, task: TaskSpec, kernel: Kernel) -> Callable[..., tuple[torch.Tensor, ...]]:
        """Build a verified kernel into this process: a callable from input to output tensors."""

    def capabilities(self) -> dict[str, Any]:
        """What kernels may use here (vector width, threads, ...), for the agents."""
        return {}

    def close(self) -> None:  # noqa: B027 (an optional hook: a target may hold nothing)
        """Release workers and other resources."""
