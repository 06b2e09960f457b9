"""A target's hooks: what each target supplies, and the handles every target keeps.

The shared evaluation (`kope.targets.evaluation`) calls a target only through these hooks, and
`Target` (`kope.targets.base`) adds the evaluation to them: this module sits below both, so the
evaluation needs nothing of `Target` and `Target` can call the evaluation.

A target supplies only what differs: what it accepts (torch device, dtypes, kernel forms),
how it builds a kernel into something callable (`build`, run in the worker and, for a verified
kernel, in the calling process by `load`), the threads a built kernel uses, how its timer
waits for the device (`synchronize`), its key, and its description for the agents
(`capabilities`, `describe`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from kope.targets.triton_rules import TritonRules
from kope.vocabulary.evidence import Evaluation
from kope.vocabulary.kernels import FORM_MLIR, Kernel
from kope.vocabulary.specs import DTYPES, TaskSpec, dtype_name

if TYPE_CHECKING:
    from kope.targets.measure import Work


class BuildError(Exception):
    """A kernel that does not parse, does not fit the operator, or does not build."""


class BuiltKernel(Protocol):
    """A kernel built for one operator, callable on the target's device tensors."""

    def run(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        """Compute the operator into `outputs` (destinations of the outputs' specs)."""

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Compute the operator into fresh outputs."""


def for_site(kernel: BuiltKernel) -> BuiltKernel:
    """A handle on `kernel` for one call site. A kernel that keeps state between calls (the
    CPU target's packed copy of a strided weight) defines `bind()`, so that the state belongs
    to the site and not to every site that runs the kernel; one that keeps none need not."""
    bind = getattr(kernel, "bind", None)
    return bind() if bind is not None else kernel


class TargetHooks(ABC):
    """What a hardware target supplies (class attributes, `key`, `build`, ...) and keeps (its
    workers, its loaded kernels). A target subclasses `kope.targets.base.Target`."""

    name: ClassVar[str]
    device: ClassVar[str] = "cpu"  # the torch device type of its tensors
    dtypes: ClassVar[frozenset[str]] = frozenset(DTYPES)  # dtype names its kernels take
    kernel_forms: ClassVar[tuple[str, ...]] = (FORM_MLIR,)  # what `build` accepts, preferred first
    # Waits until the device has finished the work launched so far; timers call it after each
    # timed call. None: calls return when their work is done (the CPU).
    synchronize: ClassVar[Callable[[], None] | None] = None
    # The Ray resource a task asks for to run on this target's device (`kope.tools.cluster`);
    # None: any node runs it (the CPU).
    ray_resource: ClassVar[str | None] = None
    # The script that runs an exported kernel pack on the device's machine (`kope export`).
    check_script: ClassVar[str] = "benchmarks/device_check.sh"

    def __init__(self, workers: int = 1, timeout_s: float = 60.0):
        self.workers = workers
        self.timeout_s = timeout_s
        self._pool: Any = None
        self._loaded: dict[tuple[str, str], BuiltKernel] = {}

    # How candidates are timed (a `kope.targets.measure.MeasureConfig`; None: its defaults);
    # a test or a caller may set a stricter one on an instance.
    measure_config: Any = None

    # -- what a target supplies ---------------------------------------------------------------
    @abstractmethod
    def key(self) -> str:
        """Everything about the target that can change a kernel's result or speed."""

    @classmethod
    @abstractmethod
    def build(cls, task: TaskSpec, kernel: Kernel) -> BuiltKernel:
        """Build `kernel` for `task` in this process; `BuildError` says why it cannot be.

        Called in the worker for every candidate and in the calling process for a verified
        kernel (`load`), so it must not rely on the target instance's state."""

    def build_verified(self, task: TaskSpec, kernel: Kernel) -> BuiltKernel:
        """Build a verified kernel into the calling process (`load`): `build`, unless the
        target keeps what it built on disk for the next process (and builds it there in a
        worker)."""
        return self.build(task, kernel)

    @classmethod
    def build_oracle(cls, task: TaskSpec, kernel: Kernel) -> BuiltKernel:
        """Build the kernel a candidate is verified against (the reference lowering). A
        target whose own form is not the reference's builds it elsewhere (on the host) and
        hands its outputs back in device memory."""
        return cls.build(task, kernel)

    @classmethod
    def memory_device(cls) -> str:
        """The torch device of the tensors its kernels take in this process: `device`, or
        the host where the device is absent and its kernels are interpreted."""
        return cls.device

    @classmethod
    def timed(cls) -> bool:
        """Whether a figure measured in this process says how fast the kernel is on the
        target (False: kernels are interpreted; attempts are verified, never timed)."""
        return True

    @classmethod
    def untimed_reason(cls) -> str:
        """Why nothing is timed when `timed` is False (a note on each attempt)."""
        return "untimed"

    @classmethod
    def timing_method(cls) -> str:
        """How its figures are taken, as the note on each timed attempt says."""
        return "host clock (perf_counter) per call, interleaved rounds"

    @classmethod
    def unavailable(cls) -> str | None:
        """Why a compiled model cannot run its kernels on this target in this process (the
        device or its toolchain is missing), or None when it can."""
        return None

    @classmethod
    def kernel_threads(cls, built: BuiltKernel, eager_threads: int) -> int:
        """The threads a built kernel runs with (what its figure means): eager's count when it
        runs parallel loops, else one."""
        return eager_threads if getattr(built, "parallel", False) else 1

    @classmethod
    def worker_env(cls) -> dict[str, str]:
        """Environment variables its workers start with (read by libraries at import)."""
        return {}

    @classmethod
    def prepare_worker(cls, eager_threads: int) -> None:
        """Set up a worker before it builds and times (thread pools, device selection)."""
        torch.set_num_threads(eager_threads)

    def capabilities(self) -> dict[str, Any]:
        """What kernels may use here (vector width, threads, ...), for the agents."""
        return {}

    def kernel_rules(self) -> TritonRules | None:
        """The rules of the Triton kernels written for this target (`kope.spaces.triton`);
        None where it builds none."""
        return None

    def describe(self, task: TaskSpec | None = None) -> str:
        """The kernel forms this target builds and their rules (for `task`, when given: its
        signature in each form), for an agent's prompt."""
        return f"{self.name} kernels in form {', '.join(self.kernel_forms)}"

    def refuses(self, tensor: torch.Tensor) -> str | None:
        """Why an operator with this tensor cannot be a Task here (a phrase), or None."""
        device = self.memory_device()
        if tensor.device.type != device:
            return f"runs on {tensor.device}; the {self.name} target takes {device} tensors here"
        if dtype_name(tensor.dtype) not in self.dtypes:
            return f"uses dtype {tensor.dtype}, which {self.name} kernels do not support"
        if tensor.layout != torch.strided:
            return f"uses layout {tensor.layout}"
        return None

    def compile_for_devices(
        self, task: TaskSpec, kernel: Kernel, result: Evaluation, work: Work
    ) -> None:
        """For a verified `result`: compile `kernel` for the devices the target names but this
        process may lack (`result.device_compile`), and make what cannot run there a failure.
        Most targets build for the machine they run on and have nothing to add."""
        return None

    def builds(self, kernel: Kernel) -> bool:
        return kernel.form in self.kernel_forms

    def builds_oracle(self, kernel: Kernel) -> bool:
        """Whether `build_oracle` takes `kernel` (the reference lowering) as an oracle."""
        return self.builds(kernel)

    # -- what every target keeps -------------------------------------------------------------
    def load(self, task: TaskSpec, kernel: Kernel) -> BuiltKernel:
        """Build a verified kernel into this process (once per operator signature and kernel);
        each load is a handle of its own (`for_site`), for one call site."""
        key = (repr((task.inputs, task.outputs)), kernel.digest)
        if key not in self._loaded:
            self._loaded[key] = self.build_verified(task, kernel)
        return for_site(self._loaded[key])

    @property
    def pool(self) -> Any:
        """The target's isolated workers (a `kope.targets.worker.WorkerPool`), started lazily
        with the target's module preloaded."""
        if self._pool is None:
            from kope.targets.worker import WorkerPool

            self._pool = WorkerPool(
                self.workers, preload=type(self).__module__, env=self.worker_env()
            )
        return self._pool

    def close(self) -> None:
        """Release workers and other resources."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
