"""The CPU target: MLIR → LLVM through `kope-lower-cpu`, JIT by the ExecutionEngine in torch-mlir.

Candidates are built, verified and timed in isolated worker processes (`WorkerPool`); only
verified kernels are loaded into the calling process. Eager ATen is timed with the thread
count of the calling process (`torch.get_num_threads()`); kernels are single-threaded unless
their schedule runs parallel loops, which use OpenMP with that same thread count.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch_mlir import ir

from kope.targets import verify
from kope.targets.base import (
    COMPILE_ERROR,
    MISMATCH,
    RUNTIME_ERROR,
    TIMEOUT,
    TIMING_CONTAMINATED,
    VERIFIED,
    Evaluation,
    Kernel,
    Target,
    TaskSpec,
    TensorSpec,
    Timing,
)
from kope.targets.host import cpu_fingerprint, cpu_target_key
from kope.targets.jit import ENTRY, JitKernel, openmp_library, set_openmp_threads
from kope.targets.measure import (
    MeasureConfig,
    Work,
    estimate_work,
    evaluation_limit_s,
    measure_interleaved,
    recheck_implausible,
    rotating,
)
from kope.targets.worker import WorkerPool

log = logging.getLogger("kope.targets.cpu")

KERNEL_THREADS = 1
_MLIR_ELEMENT = {
    "float64": "f64",
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "i8",
    "bool": "i1",
}


class BuildError(Exception):
    """A kernel that does not parse, does not fit the operator, or does not lower."""


# What a kernel may be written in. Anything else (llvm, gpu, omp, ...) could reach outside the
# kernel (inline assembly, calls into libc), so it is refused before any pass runs. The LLM
# agent's prompt lists these, in this order, and its screen asks `screen_kernel`.
KERNEL_DIALECTS = (
    "builtin",
    "func",
    "arith",
    "math",
    "linalg",
    "tensor",
    "memref",
    "scf",
    "vector",
    "bufferization",
    "affine",
    "transform",
    "ub",
    "index",
    "complex",
    "cf",
)
# Operations of allowed dialects that are refused all the same: no kernel needs to call
# through a function value, and a screen is easier to trust with one fewer way to call.
_REFUSED_OPS = {"func.call_indirect": "an indirect call"}


def screen_kernel(module: ir.Module) -> str | None:
    """What in a parsed kernel may not be built here (a phrase after "it contains"), or None.

    The build and the LLM agent's screen both ask this, so what an agent may write and what
    the target accepts are one rule.
    """
    problems: list[str] = []
    declared: list[str] = []

    def check(op: ir.Operation) -> ir.WalkResult:
        dialect = op.name.split(".", 1)[0]
        if dialect not in KERNEL_DIALECTS:
            problems.append(
                f"operation {op.name} (dialect '{dialect}' is not allowed in kernels; allowed: "
                f"{', '.join(KERNEL_DIALECTS)})"
            )
            return ir.WalkResult.INTERRUPT
        if op.name in _REFUSED_OPS:
            problems.append(f"{_REFUSED_OPS[op.name]} ({op.name})")
            return ir.WalkResult.INTERRUPT
        if op.name == "func.func" and not op.regions[0].blocks:
            declared.append("@" + ir.StringAttr(op.attributes["sym_name"]).value)
        return ir.WalkResult.ADVANCE

    module.operation.walk(check)
    if declared:
        problems.append(
            f"declarations of external functions ({', '.join(declared)}); a kernel may call "
            "only functions it defines"
        )
    return problems[0] if problems else None


def memref_type(spec: TensorSpec) -> str:
    element = _MLIR_ELEMENT.get(spec.dtype)
    if element is None:
        raise BuildError(f"dtype {spec.dtype} has no CPU kernel support")
    dims = "".join(f"{d}x" for d in spec.shape)
    return f"memref<{dims}{element}>"


# -- building (in whichever process runs the kernel) --------------------------------------------


def lower_kernel(task: TaskSpec, kernel: Kernel) -> ir.Module:
    """Parse `kernel`, check it fits `task`, and lower it with `kope-lower-cpu`."""
    from kope.passes.abi import DestinationAbi, find_func, function_type
    from kope.passes.lower_cpu import LowerCpu
    from kope.passes.pipeline import PipelineError, run_pipeline

    context = ir.Context()
    context.enable_multithreading(False)
    try:
        module = ir.Module.parse(kernel.source, context)
    except ir.MLIRError as err:
        from kope.passes.pipeline import format_diagnostics

        raise BuildError(
            "kernel does not parse:\n" + "\n".join(format_diagnostics(err, "kernel.mlir"))
        ) from None
    refused = screen_kernel(module)
    if refused:
        raise BuildError(f"kernel refused: it contains {refused}")
    try:
        run_pipeline(module, [DestinationAbi()], description=f"abi {task.label}")
    except PipelineError as err:
        raise BuildError(str(err)) from None
    entry = find_func(module.operation, ENTRY)
    assert entry is not None
    got = [str(t) for t in function_type(entry).inputs]
    want = [memref_type(s) for s in (*task.inputs, *task.outputs)]
    if got != want or list(function_type(entry).results):
        raise BuildError(
            f"@{ENTRY} has signature ({', '.join(got)}) -> "
            f"({', '.join(str(t) for t in function_type(entry).results)}); the operator needs "
            f"({', '.join(want)}) -> (): inputs, then outputs as destinations"
        )
    try:
        run_pipeline(module, [LowerCpu()], description=f"lower {task.label}")
    except PipelineError as err:
        raise BuildError(str(err)) from None
    return module


def build_kernel(task: TaskSpec, kernel: Kernel) -> JitKernel:
    module = lower_kernel(task, kernel)
    try:
        return JitKernel(module, task.inputs, task.outputs)
    except RuntimeError as err:
        raise BuildError(f"JIT compilation failed: {err}") from None


# -- evaluation (inside a worker) ---------------------------------------------------------------


@dataclass(frozen=True)
class EvalJob:
    """One candidate to build, verify against `oracle` (eager when None) and maybe time.

    `reduction` is the length of the operator's longest reduction, which widens the verifier's
    tolerance (`verify.tolerance`)."""

    task: TaskSpec
    kernel: Kernel
    oracle: Kernel | None
    measure: bool
    seed: int
    eager_threads: int
    config: MeasureConfig = MeasureConfig()
    reduction: int = 1


_BUILT: dict[tuple[str, str], JitKernel] = {}


def _cached_build(task: TaskSpec, kernel: Kernel) -> JitKernel:
    key = (task.label + repr(task.inputs) + repr(task.outputs), kernel.digest)
    if key not in _BUILT:
        _BUILT[key] = build_kernel(task, kernel)
    return _BUILT[key]


def evaluate_job(job: EvalJob, phase: Callable[[str], None]) -> Evaluation:
    """Build, verify and time one candidate. Runs in a worker; may crash it."""
    start = time.perf_counter()
    torch.set_num_threads(job.eager_threads)
    set_openmp_threads(job.eager_threads)
    phase("build")
    try:
        kernel = _cached_build(job.task, job.kernel)
        oracle_kernel = _cached_build(job.task, job.oracle) if job.oracle else None
    except BuildError as err:
        return Evaluation(COMPILE_ERROR, error=str(err), wall_s=time.perf_counter() - start)
    phase("verify")
    calls: dict[str, float] = {}
    result = _verify(job, kernel, oracle_kernel, calls)
    if result.verified and job.measure:
        phase("measure")
        result = _measure(job, kernel, oracle_kernel, calls, result)
    result.wall_s = time.perf_counter() - start
    return result


def _measure(
    job: EvalJob,
    kernel: JitKernel,
    oracle_kernel: JitKernel | None,
    calls: dict[str, float],
    result: Evaluation,
    measure: Callable[..., dict[str, Timing]] = measure_interleaved,
) -> Evaluation:
    """Time eager, the kernel and the reference on rotating input sets, then check what the
    kernel's timed calls returned; `result` (verified) gets the timings, or becomes the
    failure found after timing. `measure` is `measure_interleaved` unless a test fakes it.

    Input sets are made before anything is timed; all candidates see the same rotation, so a
    data operand fresh in cache (or not) falls on all of them alike."""
    sets = verify.timing_inputs(job.task.inputs, job.seed, job.config.input_sets)
    copies: dict[int, torch.Tensor] = {}  # the shared inputs are copied once
    for tensor in (t for inputs in sets for t in inputs):
        if id(tensor) not in copies:
            copies[id(tensor)] = tensor.clone()
    pristine = [[copies[id(t)] for t in inputs] for inputs in sets]
    fns: dict[str, Callable[[], Any]] = {}
    latest: dict[str, list[Any]] = {}
    fns["eager"], _ = rotating([job.task.eager.bind(inputs) for inputs in sets])
    threads = {"eager": job.eager_threads}
    candidates = {"kernel": kernel}
    if oracle_kernel is not None:
        candidates["reference"] = oracle_kernel
    for name, candidate in candidates.items():
        # A candidate this slow cannot win, and timing it would take several of its calls:
        # it stays verified, untimed (no speedup), and the loop goes on without it.
        if calls[name] > job.config.max_call_s:
            result.notes.append(
                f"{name} too slow to time: one call took {calls[name]:.3g} s "
                f"(limit {job.config.max_call_s:g} s)"
            )
            continue
        fns[name], latest[name] = rotating([partial(candidate, *inputs) for inputs in sets])
        threads[name] = _threads(candidate, job)
    timings = measure(fns, job.config, threads)
    if "kernel" in fns:
        pair = {name: fns[name] for name in ("eager", "kernel")}
        timings = recheck_implausible(
            timings, lambda: measure(pair, job.config, threads), result.notes
        )
    result.kernel, result.eager = timings.get("kernel"), timings["eager"]
    result.reference = timings.get("reference")
    for name, timing in timings.items():
        if timing.quality == TIMING_CONTAMINATED:
            result.notes.append(
                f"{name} timing {timing.quality}: {timing.clean_rounds} of {timing.rounds} "
                f"rounds undisturbed (run-queue wait {_share(timing.wait_share)} of the time, "
                f"load {_load(timing.load)})"
            )
    if "kernel" in fns:
        # A reference too slow to time is too slow to run once per input set again (minutes
        # for the largest operators); eager ATen, the oracle of every kernel without one, is not.
        checker = oracle_kernel if "reference" in fns else None
        failure = _check_after_timing(job, checker, sets, pristine, latest["kernel"])
        if failure is not None:
            failure.notes = result.notes + failure.notes
            failure.trials = result.trials
            return failure
    return result


def _share(share: float | None) -> str:
    return "unknown" if share is None else f"{share:.1%}"


def _load(load: float | None) -> str:
    return "unknown" if load is None else f"{load:.2f}"


def _check_after_timing(
    job: EvalJob,
    oracle_kernel: JitKernel | None,
    sets: Sequence[Sequence[torch.Tensor]],
    pristine: Sequence[Sequence[torch.Tensor]],
    outputs: Sequence[Any],
) -> Evaluation | None:
    """None when the kernel's timed calls returned the oracle's outputs on every input set and
    left the inputs as they were; else the failure. A kernel that kept a result from an earlier
    call, or skipped work once it had passed verification, is caught here."""
    oracle_name = "reference lowering" if oracle_kernel else "eager ATen (float64 where it runs)"
    for index, (inputs, before) in enumerate(zip(sets, pristine, strict=True)):
        damage = verify.inputs_unchanged(before, inputs)
        if damage:
            return Evaluation(
                RUNTIME_ERROR,
                error=f"after timing, input set {index}: {damage}",
                oracle=oracle_name,
            )
    for index, (inputs, got) in enumerate(zip(sets, outputs, strict=True)):
        if got is None:
            continue  # not called on this set (no candidate is timed with fewer calls than sets)
        expected = _oracle_outputs(job.task, oracle_kernel, inputs)
        failed, max_abs, max_rel = _compare_outputs(job, got, expected)
        if failed is not None:
            return Evaluation(
                MISMATCH,
                error=(
                    f"wrong after timing: on timing input set {index} of {len(sets)} the timed "
                    f"calls returned other outputs than verification accepted ({failed.message}); "
                    "a kernel must compute every call, never reuse an earlier result"
                ),
                max_abs_err=max_abs,
                max_rel_err=max_rel,
                oracle=oracle_name,
            )
    return None


def _threads(kernel: JitKernel, job: EvalJob) -> int:
    return job.eager_threads if kernel.parallel else KERNEL_THREADS


def _verify(
    job: EvalJob,
    kernel: JitKernel,
    oracle_kernel: JitKernel | None,
    calls: dict[str, float] | None = None,
) -> Evaluation:
    """Run the kernel and its oracle once per trial and compare; `calls` gets the fastest call
    of the kernel ("kernel") and of an oracle kernel ("reference") seen, for timing decisions."""
    task = job.task
    calls = {} if calls is None else calls
    oracle_name = "reference lowering" if oracle_kernel else "eager ATen (float64 where it runs)"
    max_abs = max_rel = 0.0
    notes: list[str] = []
    trials = 0
    for trial in verify.trials_for(job.seed):
        inputs = verify.make_inputs(task.inputs, trial)
        try:
            began = time.perf_counter()
            expected = _oracle_outputs(task, oracle_kernel, inputs)
            if oracle_kernel is not None:
                _fastest(calls, "reference", time.perf_counter() - began)
        except Exception as err:  # the oracle itself rejects these inputs
            if trial.kind == "random":
                return Evaluation(
                    RUNTIME_ERROR,
                    error=f"the oracle ({oracle_name}) failed on random inputs: {err}",
                    oracle=oracle_name,
                )
            reason = str(err).splitlines()[0][:120]
            notes.append(f"{trial.kind} trial skipped: the oracle rejects it ({reason})")
            continue
        pristine = [t.clone() for t in inputs]
        outputs = verify.GuardedOutputs(task.outputs)
        began = time.perf_counter()
        kernel.run(inputs, outputs.views)
        _fastest(calls, "kernel", time.perf_counter() - began)
        trials += 1
        damage = outputs.check() or verify.inputs_unchanged(pristine, inputs)
        if damage:
            return Evaluation(
                RUNTIME_ERROR,
                error=f"{trial.kind} trial: {damage}",
                oracle=oracle_name,
                trials=trials,
            )
        failed, trial_abs, trial_rel = _compare_outputs(job, outputs.views, expected)
        if failed is not None:
            return Evaluation(
                MISMATCH,
                error=f"{trial.kind} trial (seed {trial.seed}): {failed.message}",
                max_abs_err=failed.max_abs_err,
                max_rel_err=failed.max_rel_err,
                oracle=oracle_name,
                trials=trials,
            )
        max_abs, max_rel = max(max_abs, trial_abs), max(max_rel, trial_rel)
    return Evaluation(
        VERIFIED,
        max_abs_err=max_abs,
        max_rel_err=max_rel,
        oracle=oracle_name,
        trials=trials,
        notes=notes,
    )


def _compare_outputs(
    job: EvalJob, got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]
) -> tuple[verify.Comparison | None, float, float]:
    """The first output of `got` that fails against `expected` (None if all pass), and the
    largest absolute and relative errors seen up to there."""
    largest_input = max((math.prod(s.shape) for s in job.task.inputs), default=0)
    max_abs = max_rel = 0.0
    for index, (out, want) in enumerate(zip(got, expected, strict=True)):
        # An output smaller than the largest input summarizes it: a statistics output.
        statistic = out.numel() < largest_input
        cmp = verify.compare(out, want, index, reduction=job.reduction, statistic=statistic)
        max_abs, max_rel = max(max_abs, cmp.max_abs_err), max(max_rel, cmp.max_rel_err)
        if not cmp.ok:
            return cmp, max_abs, max_rel
    return None, max_abs, max_rel


def _fastest(calls: dict[str, float], name: str, seconds: float) -> None:
    calls[name] = min(seconds, calls.get(name, seconds))


def _oracle_outputs(
    task: TaskSpec, oracle_kernel: JitKernel | None, inputs: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """The expected outputs: the oracle kernel's, else eager ATen's in float64 where the op has
    a float64 kernel (the verifier rounds them to the output dtype before comparing)."""
    if oracle_kernel is not None:
        return oracle_kernel(*inputs)
    if any(t.is_floating_point() for t in inputs):
        try:
            return verify.run_oracle(task.eager, verify.upcast(inputs))
        except Exception:  # the op has no float64 kernel: fall back to its own dtype
            pass
    return verify.run_oracle(task.eager, inputs)


# -- the target -----------------------------------------------------------------------------------


class CpuTarget(Target):
    """MLIR on the host CPU: lowered by `kope-lower-cpu`, JIT-compiled at opt_level 3."""

    name = "cpu"

    def __init__(self, workers: int = 1, timeout_s: float = 60.0):
        self.workers = workers
        self.timeout_s = timeout_s
        self._pool: WorkerPool | None = None
        self._loaded: dict[tuple[str, str], JitKernel] = {}

    def key(self) -> str:
        return cpu_target_key()

    def capabilities(self) -> dict[str, Any]:
        flags = cpu_fingerprint().split("|")[1].split("+")
        bits = 512 if "avx512f" in flags else 256 if "avx2" in flags or "avx" in flags else 128
        return {
            "vector_bits": bits,
            "isa": flags,
            "threads": torch.get_num_threads(),
            "openmp": openmp_library() is not None,
            "kernel_form": (
                "linalg-on-tensors @main plus a transform schedule, or @kope_kernel on memrefs"
            ),
        }

    @property
    def pool(self) -> WorkerPool:
        if self._pool is None:
            self._pool = WorkerPool(self.workers, preload="kope.targets.cpu")
        return self._pool

    # How candidates are timed; a test or a caller may set a stricter one on an instance.
    measure_config: MeasureConfig = MeasureConfig()

    def evaluate(
        self,
        task: TaskSpec,
        kernel: Kernel,
        *,
        oracle: Kernel | None = None,
        measure: bool = True,
        seed: int = 0,
        config: MeasureConfig | None = None,
    ) -> Evaluation:
        """Build, verify and time `kernel` in a worker, within a time limit scaled to its work.

        `timeout_s` covers building, start-up and an ordinary operator's runs. An operator
        whose estimated runs (the kernel and its oracle once per trial, then timing:
        `evaluation_limit_s`) need more than half of it gets those plus half of `timeout_s`
        for the rest, so a large operator's reference lowering is verified, not timed out."""
        config = config or self.measure_config
        # The reference payload describes the operator's loops; an agent kernel may not parse
        # as one (a memref @kope_kernel), so the oracle's text is read when there is one.
        work: Work = estimate_work(task, (oracle or kernel).source)
        trials = len(verify.trials_for(seed))
        runs_s = evaluation_limit_s(work, trials, measure, config)
        limit_s = max(self.timeout_s, self.timeout_s / 2 + runs_s)
        job = EvalJob(
            task,
            kernel,
            oracle,
            measure,
            seed,
            torch.get_num_threads(),
            config,
            reduction=work.reduction,
        )
        start = time.perf_counter()
        outcome = self.pool.call("kope.targets.cpu:evaluate_job", job, limit_s)
        if outcome.ok:
            result: Evaluation = outcome.value
            return result
        in_build = outcome.phase in ("start", "build")
        if outcome.failure == "timeout":
            verdict = TIMEOUT
        elif in_build:
            verdict = COMPILE_ERROR
        else:
            verdict = RUNTIME_ERROR
        what = {"crash": "crashed", "timeout": "timed out", "error": "raised"}[
            outcome.failure or "error"
        ]
        return Evaluation(
            verdict,
            error=f"the worker {what} during {outcome.phase}: {outcome.detail}",
            wall_s=time.perf_counter() - start,
        )

    def load(self, task: TaskSpec, kernel: Kernel) -> JitKernel:
        key = (repr((task.inputs, task.outputs)), kernel.digest)
        if key not in self._loaded:
            self._loaded[key] = build_kernel(task, kernel)
        return self._loaded[key]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


__all__ = ["BuildError", "CpuTarget", "MISMATCH", "VERIFIED", "build_kernel", "cpu_fingerprint"]
