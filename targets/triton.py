"""What the Triton targets share (`cuda`, `ascend`): kernels as Triton source, built in a
sandbox, run on the device or, without one, under Triton's interpreter.

A Triton kernel (`FORM_TRITON`) is a Python module: `@triton.jit` functions and a plain
`def launch(in0, ..., out0, ...)` that takes the operator's inputs, then its outputs
(contiguous, row-major, on the target's device), and fills the outputs. It is screened by an
allow-list (`kope.targets.triton_sandbox`), then executed with only the builtins a kernel needs
and an `__import__` that hands out `triton`, `triton.language` and `math` alone. It runs only
in the isolated worker (scratch working directory, no secrets in the environment, the
resource limits of `prepare_worker`): a kernel that spins, or writes out of bounds, is a
recorded failure there.

Without the device (no GPU here, none in CI) a Triton target *interprets*: the worker sets
`TRITON_INTERPRET=1`, tensors live in host memory, and candidates are verified against the
reference lowering (built by the CPU target) on CPU. Nothing is timed then: a figure from the
interpreter says nothing about the device, so such attempts are recorded verified-but-untimed
and never win selection.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from kope.targets import device_compile
from kope.targets.base import BuildError, BuiltKernel, Target
from kope.targets.device_compile import (
    ARCHITECTURES,
    COMPILE_ENV,
    CompileJob,
    parse_architectures,
)
from kope.targets.host import package_version
from kope.targets.triton_sandbox import BUILTINS, TL_NAMES, KernelRefused, load_launcher
from kope.targets.worker import SCRATCH_VARIABLE, WorkerPool, limit_resources
from kope.vocabulary.evidence import COMPILE_ERROR, TIMEOUT, Evaluation
from kope.vocabulary.kernels import FORM_MLIR, FORM_TRITON, Kernel
from kope.vocabulary.specs import DTYPES, TaskSpec

if TYPE_CHECKING:
    from kope.targets.measure import Work

# The dtypes Triton kernels take here (float64 has no `tl.dot`, but elementwise code runs).
TRITON_DTYPES = frozenset(
    {"float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8"}
    & set(DTYPES)
)


def triton_version() -> str:
    return package_version("triton")


def triton_target_key(target: str, device: str, triton: str, torch_version: str, kope: str) -> str:
    """A Triton target's key: the device as it names itself (or "interpreter") and the versions
    that change a kernel's result or speed. A kernel pack's results are keyed by it too."""
    return f"{target}|{device}|triton-{triton}|torch-{torch_version}|kope-{kope}"


class TritonKernel:
    """A screened, loaded Triton kernel module: `run` calls its `launch`."""

    parallel = False  # one launch on the device; thread counts do not describe it

    def __init__(self, launch: Callable[..., Any], task: TaskSpec, device: str):
        self._launch = launch
        self.task = task
        self.device = device

    def run(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        self._launch(*inputs, *outputs)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = tuple(
            torch.empty(s.shape, dtype=s.torch_dtype, device=self.device) for s in self.task.outputs
        )
        self.run(inputs, outputs)
        return outputs


class HostOracle:
    """The reference lowering (a CPU kernel) serving a device target as its oracle: inputs
    go to the host, outputs come back to the device."""

    parallel = False

    def __init__(self, kernel: BuiltKernel, device: str):
        self.kernel = kernel
        self.device = device

    def run(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        for out, got in zip(outputs, self(*inputs), strict=True):
            out.copy_(got)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        results = self.kernel(*(t.cpu() for t in inputs))
        return tuple(t.to(self.device) for t in results)


@functools.cache
def _scratch_directory() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="kope-triton-", ignore_cleanup_errors=True)


def _scratch() -> Path:
    """Where this process writes kernel sources (Triton reads a kernel's source from its file):
    a worker's own scratch directory, else one removed when this process exits (each worker
    that loaded a kernel used to leave one behind)."""
    return Path(os.environ.get(SCRATCH_VARIABLE) or _scratch_directory().name)


def load_kernel_module(source: str, task: TaskSpec, device: str) -> TritonKernel:
    """Screen and load `source` in the sandbox (`kope.targets.triton_sandbox`)."""
    try:
        return TritonKernel(load_launcher(source, _scratch()), task, device)
    except KernelRefused as err:
        raise BuildError(str(err)) from None


class TritonTarget(Target):
    """A Triton target: kernels in `FORM_TRITON`, the reference lowering as their oracle.

    A subclass names its device and flavour, says whether the device is present
    (`device_present`), and gives its capabilities and constraints for the agents."""

    kernel_forms = (FORM_TRITON,)
    dtypes: ClassVar[frozenset[str]] = TRITON_DTYPES
    flavour: ClassVar[str]
    extra: ClassVar[str]  # the `pip install 'kope[...]'` extra that brings its toolchain
    # The flavour's rules for kernels, appended to the prompt (`describe`).
    constraints: ClassVar[str] = ""

    def __init__(
        self,
        workers: int = 1,
        timeout_s: float = 60.0,
        architectures: Sequence[str] | None = None,
    ):
        super().__init__(workers, timeout_s)
        # The GPU architectures each verified kernel is compiled for by Triton's own compiler
        # (`kope.targets.device_compile`); () where the flavour's compiler cannot run here.
        self.architectures = (
            self.default_architectures()
            if architectures is None
            else (parse_architectures(architectures))
        )
        self._compile_pool: Any = None

    @classmethod
    def default_architectures(cls) -> tuple[str, ...]:
        """The architectures kernels are compiled for unless the caller names them."""
        return ()

    # -- the device ---------------------------------------------------------------------------
    @classmethod
    def device_present(cls) -> bool:
        """Whether this process can run kernels on the device."""
        return False

    @classmethod
    def device_absent_reason(cls) -> str:
        """Why `device_present` is False, as a phrase."""
        return f"no {cls.device} device"

    @classmethod
    def interpreting(cls) -> bool:
        """Kernels run under Triton's interpreter on the host (no device, or asked for)."""
        return os.environ.get("TRITON_INTERPRET") == "1" or not cls.device_present()

    @classmethod
    def memory_device(cls) -> str:
        return "cpu" if cls.interpreting() else cls.device

    @classmethod
    def timed(cls) -> bool:
        return not cls.interpreting()

    @classmethod
    def untimed_reason(cls) -> str:
        return (
            f"untimed: kernels run under Triton's interpreter here ({cls.device_absent_reason()});"
            f" an interpreter figure says nothing about the {cls.device} device"
        )

    @classmethod
    def timing_method(cls) -> str:
        return (
            f"host clock per call, waiting for the {cls.device} device after each "
            "(synchronize), interleaved rounds; kernel packs use triton.testing.do_bench"
        )

    @classmethod
    def unavailable(cls) -> str | None:
        if triton_version() == "unknown":
            return f"triton is not installed (pip install 'kope[{cls.extra}]')"
        if cls.device_present():
            return None
        return (
            f"{cls.device_absent_reason()}; `kope precompile --target {cls.name}` still verifies "
            "its kernels on this machine under Triton's interpreter"
        )

    # -- building -----------------------------------------------------------------------------
    @classmethod
    def build(cls, task: TaskSpec, kernel: Kernel) -> BuiltKernel:
        if kernel.form != FORM_TRITON:
            raise BuildError(f"the {cls.name} target builds triton kernels, not {kernel.form}")
        if triton_version() == "unknown":
            raise BuildError(f"triton is not installed (pip install 'kope[{cls.extra}]')")
        return load_kernel_module(kernel.source, task, cls.memory_device())

    def builds_oracle(self, kernel: Kernel) -> bool:
        return kernel.form in (FORM_TRITON, FORM_MLIR)

    @classmethod
    def build_oracle(cls, task: TaskSpec, kernel: Kernel) -> BuiltKernel:
        if kernel.form != FORM_MLIR:
            return cls.build(task, kernel)
        from kope.targets.cpu import CpuTarget

        built = CpuTarget.build(task, kernel)
        device = cls.memory_device()
        return built if device == "cpu" else HostOracle(built, device)

    @classmethod
    def worker_env(cls) -> dict[str, str]:
        # Read as triton decorates its own `@jit` functions (`tl.sum`, ...) at import, and as
        # each kernel's are: it must be set before anything imports triton.
        return {"TRITON_INTERPRET": "1"} if cls.interpreting() else {}

    @classmethod
    def prepare_worker(cls, eager_threads: int) -> None:
        torch.set_num_threads(eager_threads)
        if cls.interpreting():
            widen_interpreted_bf16_dot()
        limit_resources()

    # -- compiling for the device -------------------------------------------------------------
    def compile_for_devices(
        self, task: TaskSpec, kernel: Kernel, result: Evaluation, work: Work
    ) -> None:
        """Compile a verified kernel for each of `architectures` in a compile worker and
        record it (`result.device_compile`, with a roofline estimate where it compiled); a
        kernel that does not compile, or cannot run well, on any of them is a compile error."""
        if not self.architectures or kernel.form != FORM_TRITON:
            return
        if self._compile_pool is None:
            self._compile_pool = WorkerPool(
                self.workers, preload="kope.targets.device_compile", env=COMPILE_ENV
            )
        job = CompileJob(task, kernel.source, self.architectures)
        outcome = self._compile_pool.call(
            "kope.targets.device_compile:compile_job", job, self.timeout_s
        )
        if outcome.ok:
            records: dict[str, dict[str, Any]] = outcome.value
        else:
            detail = outcome.detail.splitlines()[0] if outcome.detail else outcome.failure
            why = (
                f"the compiler ran past {self.timeout_s:g} s"
                if outcome.failure == "timeout"
                else f"the compile worker failed: {detail}"
            )
            records = {arch: device_compile.failed(why) for arch in self.architectures}
        tensor_cores = "tl.dot" in kernel.source and any(
            s.dtype in ("float16", "bfloat16") for s in task.inputs
        )
        for arch, record in records.items():
            estimate = device_compile.estimate_us(record, ARCHITECTURES[arch], work, tensor_cores)
            record["estimate_us"] = None if estimate is None else round(estimate, 3)
        result.device_compile = records
        refused = [f"{arch}: {r['error']}" for arch, r in records.items() if not r["ok"]]
        if refused:
            result.verdict = TIMEOUT if outcome.failure == "timeout" else COMPILE_ERROR
            result.error = (
                "verified, but Triton's compiler refuses it for the device: " + "; ".join(refused)
            )

    def close(self) -> None:
        super().close()
        if self._compile_pool is not None:
            self._compile_pool.close()
            self._compile_pool = None

    # -- describing ---------------------------------------------------------------------------
    def key(self) -> str:
        device = self.device_name() if not self.interpreting() else "interpreter"
        return triton_target_key(
            self.name, device, triton_version(), package_version("torch"), package_version("kope")
        )

    def device_name(self) -> str:
        """The device's model and generation, as its key names it."""
        return self.device

    def describe(self, task: TaskSpec | None = None) -> str:
        return TRITON_PROMPT.format(
            signature=launch_signature(task),
            tl=", ".join(sorted(TL_NAMES)),
            builtins=", ".join(sorted(BUILTINS)),
            constraints=self.constraints,
        )


@functools.cache
def widen_interpreted_bf16_dot() -> None:
    """Make the interpreter's `tl.dot` widen bfloat16 operands to float32 first: triton 3.9's
    multiplies their bit patterns (held as uint16) as integers, so a correct bf16 matmul
    would fail verification. The device computes bf16 dots in float32 accumulators too."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    dot = builder.create_dot

    def widen(handle: Any) -> Any:
        if handle.dtype != tl.bfloat16:
            return handle
        bits = handle.data.astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def widened(a: Any, b: Any, *rest: Any) -> Any:
        return dot(widen(a), widen(b), *rest)

    builder.create_dot = widened


def launch_signature(task: TaskSpec | None) -> str:
    """`def launch(...)` for `task`, each tensor with its shape and dtype in a comment."""
    if task is None:
        return "def launch(in0, ..., out0, ...)"
    params = [f"in{i}" for i in range(len(task.inputs))]
    params += [f"out{j}" for j in range(len(task.outputs))]
    shapes = [f"in{i}: {s}" for i, s in enumerate(task.inputs)]
    shapes += [f"out{j}: {s}" for j, s in enumerate(task.outputs)]
    return f"def launch({', '.join(params)}):  # {'; '.join(shapes)}"


TRITON_PROMPT = """\
Answer with ONE ```python code block holding a complete Triton kernel module:
- `import triton` and `import triton.language as tl` (and `import math` if needed) at the top,
- one or more `@triton.jit` functions,
- a plain launcher with exactly this signature:
  `{signature}`
  Its arguments are the operator's inputs, then its outputs, as contiguous row-major tensors
  already allocated on the device. It must fill every output element and return nothing;
  it launches the kernels with `kernel[grid](...)`. Shapes are fixed: you may write them as
  constants.
Only these names are allowed: `triton.jit`, `triton.cdiv`, `triton.next_power_of_2`, `math.*`,
the builtins {builtins}, on tensors in the launcher `.shape`, `.stride()`, `.numel()`,
`.element_size()`, and the language `tl.` {tl}.
No other imports, no torch, no libdevice (`tl.extra`), no inline assembly, no dunder names,
no try/with/class/lambda.
Use masks on every edge; accumulate reductions and dots in float32 and cast at the store.
{constraints}"""
