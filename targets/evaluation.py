"""The evaluation every target shares: build → verify → measure → verdict.

`evaluate` runs in the calling process: it checks the kernel's form, sizes the time limit to
the operator's work, hands an `EvalJob` to one of the target's isolated workers, and maps a
crash, a hang or an exception there to a verdict. `evaluate_job` runs in the worker: it builds
the candidate (and the oracle kernel) with the target's `build`, verifies it on fresh random
and edge inputs in the target's device buffers (poisoned outputs inside canaries, inputs
checked unchanged), times it interleaved with eager ATen (the target's `synchronize` after
each call), and checks what the timed calls returned. A verified kernel then goes to the
target's `compile_for_devices` (the CUDA target compiles it for GPU architectures this
machine lacks: `kope.targets.device_compile`). A target supplies only its hooks
(`kope.targets.hooks`); nothing here knows which target it runs for.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout

from kope.targets import verify
from kope.targets.hooks import BuildError, BuiltKernel, TargetHooks
from kope.targets.measure import (
    MeasureConfig,
    Work,
    estimate_work,
    evaluation_limit_s,
    measure_interleaved,
    recheck_implausible,
    rotating,
)
from kope.targets.worker import QUEUED
from kope.vocabulary.evidence import (
    COMPILE_ERROR,
    MISMATCH,
    RUNTIME_ERROR,
    TIMEOUT,
    TIMING_CONTAMINATED,
    VERIFIED,
    Evaluation,
    Timing,
)
from kope.vocabulary.kernels import FORM_MLIR, Kernel
from kope.vocabulary.specs import OpCall, Program, TaskSpec

EAGER_ORACLE = "eager ATen (float64 where it runs)"
REFERENCE_ORACLE = "reference lowering"


# -- in the calling process ---------------------------------------------------------------------
def evaluate(
    target: TargetHooks,
    task: TaskSpec,
    kernel: Kernel | None,
    *,
    oracle: Kernel | None = None,
    measure: bool = True,
    seed: int = 0,
    config: MeasureConfig | None = None,
    limit_s: float | None = None,
) -> Evaluation:
    """Build, verify and time `kernel` on `target` in a worker, within a time limit scaled to
    its work (see `Target.evaluate`), and at most `limit_s` where given.

    `target.timeout_s` covers building, start-up and an ordinary operator's runs. An operator
    whose estimated runs (the kernel and its oracle once per trial, then timing:
    `evaluation_limit_s`) need more than half of it gets those plus half of `timeout_s` for
    the rest, so a large operator's reference lowering is verified, not timed out."""
    config = config or target.measure_config or MeasureConfig()
    if kernel is not None and not target.builds(kernel):
        return Evaluation(
            COMPILE_ERROR,
            error=(
                f"the {target.name} target builds {', '.join(target.kernel_forms)} kernels, "
                f"not {kernel.form}"
            ),
        )
    lossy = verify.lossy_integers(kernel.source) if kernel and kernel.form == FORM_MLIR else None
    if lossy:
        return Evaluation(MISMATCH, error=f"not run: {lossy}")
    notes: list[str] = []
    if not target.timed():
        measure = False
        notes.append(target.untimed_reason())
    elif measure and target.device != "cpu":
        notes.append(f"timed by {target.timing_method()}")
    if task.eager is None and (oracle is None or not target.builds_oracle(oracle)):
        # An operator known only as IR: its reference lowering is its only oracle.
        return Evaluation(
            COMPILE_ERROR,
            error=(
                f"nothing to verify against: {task.label} has no eager call, and the "
                f"{target.name} target cannot run its reference lowering"
            ),
        )
    if oracle is not None and not target.builds_oracle(oracle):
        notes.append(
            f"the {target.name} target cannot run the {oracle.form} oracle; verified against "
            f"{EAGER_ORACLE}"
        )
        oracle = None
    # The reference payload describes the operator's loops; an agent kernel may not parse as
    # one (a memref @kope_kernel, a Triton kernel), so the oracle's MLIR is read when there is.
    text = next((k.source for k in (oracle, kernel) if k is not None and k.form == FORM_MLIR), None)
    if kernel is None and not measure:
        # Eager alone, untimed: the baseline exists, its figure does not.
        return Evaluation(VERIFIED, oracle="itself", notes=notes)
    work: Work = estimate_work(task, text)
    trials = len(verify.trials_for(seed))
    runs_s = evaluation_limit_s(work, trials, measure, config)
    scaled_s = max(target.timeout_s, target.timeout_s / 2 + runs_s)
    limit_s = scaled_s if limit_s is None else min(scaled_s, limit_s)
    job = EvalJob(
        type(target),
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
    outcome = target.pool.call("kope.targets.evaluation:evaluate_job", job, limit_s)
    if outcome.ok:
        result: Evaluation = outcome.value
        result.notes[:0] = notes
        if result.verified and kernel is not None:
            target.compile_for_devices(task, kernel, result, work)
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
        notes=notes,
    )


# -- in the worker -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalJob:
    """One candidate to build with `target.build`, verify against `oracle` (eager when None)
    and maybe time.

    `reduction` is the length of the operator's longest reduction, which widens the verifier's
    tolerance (`verify.tolerance`)."""

    target: type[TargetHooks]  # pickled by name: the worker imports the target's module
    task: TaskSpec
    kernel: Kernel | None  # None: time eager ATen alone
    oracle: Kernel | None
    measure: bool
    seed: int
    eager_threads: int
    config: MeasureConfig = MeasureConfig()
    reduction: int = 1


_BUILT: dict[tuple[str, str, str], BuiltKernel] = {}

# One timing at a time on a machine: every worker on it (of any precompile, thread or Ray
# task) takes this lock around its timing, so two timings never share cores. Building and
# verifying are not serialized. The lock is the kernel's (flock): a killed holder frees it.
TIMING_LOCK = Path(tempfile.gettempdir()) / "kope-timing.lock"


@contextmanager
def timing_turn(phase: Callable[[str], None]) -> Iterator[None]:
    """The "measure" phase, once this machine's timing lock is held ("queued" until then)."""
    lock = FileLock(TIMING_LOCK)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        phase(QUEUED)
        lock.acquire()
    try:
        phase("measure")
        yield
    finally:
        lock.release()


def _cached_build(
    target: type[TargetHooks], task: TaskSpec, kernel: Kernel, *, oracle: bool = False
) -> BuiltKernel:
    key = (target.name, task.label + repr(task.inputs) + repr(task.outputs), kernel.digest)
    if key not in _BUILT:
        _BUILT[key] = (target.build_oracle if oracle else target.build)(task, kernel)
    return _BUILT[key]


def evaluate_job(job: EvalJob, phase: Callable[[str], None]) -> Evaluation:
    """Build, verify and time one candidate. Runs in a worker; may crash it."""
    start = time.perf_counter()
    job.target.prepare_worker(job.eager_threads)
    if job.kernel is None:
        with timing_turn(phase):
            result = _measure_eager(job)
        result.wall_s = time.perf_counter() - start
        result.threads = job.eager_threads
        return result
    phase("build")
    try:
        kernel = _cached_build(job.target, job.task, job.kernel)
        oracle_kernel = (
            _cached_build(job.target, job.task, job.oracle, oracle=True) if job.oracle else None
        )
    except BuildError as err:
        return Evaluation(COMPILE_ERROR, error=str(err), wall_s=time.perf_counter() - start)
    phase("verify")
    calls: dict[str, float] = {}
    result = _verify(job, kernel, oracle_kernel, calls)
    if result.verified and job.measure:
        with timing_turn(phase):
            result = _measure(job, kernel, oracle_kernel, calls, result)
        result.threads = job.eager_threads
    result.wall_s = time.perf_counter() - start
    return result


def _measure(
    job: EvalJob,
    kernel: BuiltKernel,
    oracle_kernel: BuiltKernel | None,
    calls: dict[str, float],
    result: Evaluation,
    measure: Callable[..., dict[str, Timing]] = measure_interleaved,
) -> Evaluation:
    """Time eager, the kernel and the reference on rotating input sets, then check what the
    kernel's timed calls returned; `result` (verified) gets the timings, or becomes the
    failure found after timing. `measure` is `measure_interleaved` unless a test fakes it.

    Input sets are made before anything is timed; all candidates see the same rotation, so a
    data operand fresh in cache (or not) falls on all of them alike."""
    sets = _timing_sets(job)
    copies: dict[int, torch.Tensor] = {}  # the shared inputs are copied once
    for tensor in (t for inputs in sets for t in inputs):
        if id(tensor) not in copies:
            copies[id(tensor)] = tensor.clone()
    pristine = [[copies[id(t)] for t in inputs] for inputs in sets]
    fns: dict[str, Callable[[], Any]] = {}
    latest: dict[str, list[Any]] = {}
    threads: dict[str, int] = {}
    eager = job.task.eager
    if eager is not None:
        fns["eager"] = _eager_call(eager, sets, job)
        threads["eager"] = job.eager_threads
    candidates = {"kernel": kernel}
    if oracle_kernel is not None:
        candidates["reference"] = oracle_kernel
    # Eager's one call is timed only where a candidate is slow enough to be hopeless against
    # it: every other evaluation would pay two eager calls for nothing.
    slow = any(calls[name] > job.config.hopeless_s for name in candidates)
    eager_s = _one_call_s(fns["eager"]) if slow and "eager" in fns else None
    for name, candidate in candidates.items():
        # A candidate this slow cannot win, and timing it would take several of its calls:
        # it stays verified, untimed (no speedup), and the loop goes on without it.
        if calls[name] > job.config.max_call_s:
            result.notes.append(
                f"{name} too slow to time: one call took {calls[name]:.3g} s "
                f"(limit {job.config.max_call_s:g} s)"
            )
            continue
        if cannot_win(calls[name], eager_s, job.config):
            result.notes.append(
                f"{name} too slow to time: one call took {calls[name]:.3g} s, eager's "
                f"{eager_s:.3g} s (more than {job.config.hopeless_factor:g}x: it cannot win)"
            )
            continue
        fns[name], latest[name] = rotating(
            [_synced(partial(candidate, *inputs), job) for inputs in sets]
        )
        threads[name] = job.target.kernel_threads(candidate, job.eager_threads)
    # The baseline: eager ATen, else (an operator known only as IR) the reference lowering.
    baseline = "eager" if eager is not None else "reference"
    if baseline not in fns:
        result.notes.append("untimed: no baseline to time the kernel against")
        return result
    # The reference is timed apart from eager and the kernel: its calls (a convolution's
    # naive loops: 9.7 ms on one thread) interleaved with theirs made eager 15-20% slower and
    # the kernel 8-12%, inflating the kernel's speedup. Where it is the baseline (no eager
    # call), it is the kernel's rival and is timed with it.
    apart = {"reference": fns.pop("reference")} if "reference" in fns and eager is not None else {}
    timings = measure(fns, job.config, threads)
    if apart:
        timings.update(measure(apart, job.config, {"reference": threads["reference"]}))
    if "kernel" in fns and eager is not None:
        pair = {name: fns[name] for name in ("eager", "kernel")}
        timings = recheck_implausible(
            timings, lambda: measure(pair, job.config, threads), result.notes
        )
    result.kernel, result.eager = timings.get("kernel"), timings.get("eager")
    result.reference = timings.get("reference")
    _note_contamination(timings, result)
    if "kernel" in fns:
        # A reference too slow to time is too slow to run once per input set again (minutes
        # for the largest operators); eager ATen, the oracle of every kernel without one, is not.
        checker = oracle_kernel if "reference" in timings or eager is None else None
        failure = _check_after_timing(job, checker, sets, pristine, latest["kernel"])
        if failure is not None:
            failure.notes = result.notes + failure.notes
            failure.trials = result.trials
            return failure
    return result


def cannot_win(call_s: float, eager_s: float | None, config: MeasureConfig) -> bool:
    """Whether a candidate whose one call took `call_s` is too slow to be worth timing against
    eager's one call of `eager_s` (None: not timed, so nothing is known)."""
    return (
        eager_s is not None
        and call_s > config.hopeless_s
        and call_s > config.hopeless_factor * eager_s
    )


def _one_call_s(fn: Callable[[], Any]) -> float:
    """The faster of two calls of `fn`, in seconds (the first may pay for caches)."""
    fastest = math.inf
    for _ in range(2):
        start = time.perf_counter()
        fn()
        fastest = min(fastest, time.perf_counter() - start)
    return fastest


def _share(share: float | None) -> str:
    return "unknown" if share is None else f"{share:.1%}"


def _load(load: float | None) -> str:
    return "unknown" if load is None else f"{load:.2f}"


def _check_after_timing(
    job: EvalJob,
    oracle_kernel: BuiltKernel | None,
    sets: Sequence[Sequence[torch.Tensor]],
    pristine: Sequence[Sequence[torch.Tensor]],
    outputs: Sequence[Any],
) -> Evaluation | None:
    """None when the kernel's timed calls returned the oracle's outputs on every input set and
    left the inputs as they were; else the failure. A kernel that kept a result from an earlier
    call, or skipped work once it had passed verification, is caught here."""
    oracle_name = REFERENCE_ORACLE if oracle_kernel else EAGER_ORACLE
    for index, (inputs, before) in enumerate(zip(sets, pristine, strict=True)):
        damage = verify.inputs_unchanged(before, inputs)
        if damage:
            return Evaluation(
                RUNTIME_ERROR,
                error=f"after timing, input set {index}: {damage}",
                oracle=oracle_name,
            )
    precision = verify.computed_through(job.task.eager, sets[0]) if sets else None
    for index, (inputs, got) in enumerate(zip(sets, outputs, strict=True)):
        if got is None:
            continue  # not called on this set (no candidate is timed with fewer calls than sets)
        expected = _oracle_outputs(job.task, oracle_kernel, inputs)
        failed, max_abs, max_rel = _compare_outputs(job, inputs, got, expected, precision)
        if failed is not None and oracle_kernel is None:  # judged as verification judges
            judged = _beyond_the_dtype(job, inputs, got, precision)
            if judged is not None:
                failed, max_abs, max_rel = judged
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


def _on_device(inputs: Sequence[torch.Tensor], job: EvalJob) -> list[torch.Tensor]:
    """Inputs made on the host, in the target's device memory."""
    device = job.target.memory_device()
    return [t if t.device.type == device else t.to(device) for t in inputs]


def _synced(call: Callable[[], Any], job: EvalJob) -> Callable[[], Any]:
    """`call`, returning only when the device has done its work (as is, on the CPU)."""
    sync = job.target.synchronize
    if sync is None:
        return call

    def synced() -> Any:
        result = call()
        sync()
        return result

    return synced


def _timing_sets(job: EvalJob) -> list[list[torch.Tensor]]:
    """The timing input sets (`verify.timing_inputs`), in the target's device memory."""
    made = verify.timing_inputs(job.task, job.seed, job.config.input_sets)
    return [_on_device(inputs, job) for inputs in made]


def _eager_call(
    eager: OpCall | Program, sets: Sequence[Sequence[torch.Tensor]], job: EvalJob
) -> Callable[[], None]:
    """Eager ATen as a timed callable, rotating through `sets`."""
    call, _ = rotating([_synced(eager.bind(inputs), job) for inputs in sets])
    return call


def _measure_eager(job: EvalJob) -> Evaluation:
    """Time eager ATen alone: the baseline of a target that cannot run the reference."""
    assert job.task.eager is not None, "evaluate() refuses a task with neither"
    eager = _eager_call(job.task.eager, _timing_sets(job), job)
    timing = measure_interleaved({"eager": eager}, job.config, {"eager": job.eager_threads})
    result = Evaluation(VERIFIED, kernel=timing["eager"], eager=timing["eager"], oracle="itself")
    _note_contamination(timing, result)
    return result


def _note_contamination(timings: dict[str, Timing], result: Evaluation) -> None:
    for name, timing in timings.items():
        if timing.quality == TIMING_CONTAMINATED:
            result.notes.append(
                f"{name} timing {timing.quality}: {timing.clean_rounds} of {timing.rounds} "
                f"rounds undisturbed (run-queue wait {_share(timing.wait_share)} of the time, "
                f"load {_load(timing.load)})"
            )


def _verify(
    job: EvalJob,
    kernel: BuiltKernel,
    oracle_kernel: BuiltKernel | None,
    calls: dict[str, float] | None = None,
) -> Evaluation:
    """Run the kernel and its oracle once per trial and compare; `calls` gets the fastest call
    of the kernel ("kernel") and of an oracle kernel ("reference") seen, for timing decisions."""
    task = job.task
    calls = {} if calls is None else calls
    oracle_name = REFERENCE_ORACLE if oracle_kernel else EAGER_ORACLE
    max_abs = max_rel = 0.0
    notes: list[str] = []
    trials = 0
    precision: torch.dtype | None = None
    for trial in verify.trials_for(job.seed):
        inputs = _on_device(verify.task_inputs(task, trial), job)
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
        outputs = verify.GuardedOutputs(task.outputs, job.target.memory_device())
        began = time.perf_counter()
        kernel.run(inputs, outputs.views)
        if job.target.synchronize is not None:
            job.target.synchronize()
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
        if trials == 1:  # the dtypes eager computes through are the same on every trial
            precision = verify.computed_through(task.eager, inputs)
        failed, trial_abs, trial_rel = _compare_outputs(
            job, inputs, outputs.views, expected, precision
        )
        if failed is not None:
            # Any trial's values can take a result beyond the output dtype: a random "mask" of
            # either sign makes BERT's (1 - mask) * finfo.min overflow float32, where eager's
            # own float32 result is NaN and float64's a number.
            judged = _beyond_the_dtype(job, inputs, outputs.views, precision)
            if judged is not None:
                failed, trial_abs, trial_rel = judged
                if failed is None:
                    notes.append(
                        f"{trial.kind} trial: elements beyond the output dtype judged by eager's "
                        "own error there (verify.ILL_CONDITIONED)"
                    )
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


def _beyond_the_dtype(
    job: EvalJob,
    inputs: Sequence[torch.Tensor],
    got: Sequence[torch.Tensor],
    precision: torch.dtype | None,
) -> tuple[verify.Comparison | None, float, float] | None:
    """For a trial that failed: `got` compared with the float64 oracle where elements
    beyond the output dtype are judged by eager's own error in it (`verify.compare`'s `own`);
    None where the operator has no float64 eager to judge by."""
    task = job.task
    if task.eager is None or not any(t.is_floating_point() for t in inputs):
        return None
    try:
        wide = _oracle_outputs(task, None, inputs)
        own = verify.run_oracle(task.eager, inputs)
    except Exception:  # the oracle rejects these inputs in one dtype or the other
        return None
    pairs = list(zip(wide, own, strict=True))
    if not any(w.dtype == torch.float64 and o.dtype != torch.float64 for w, o in pairs):
        return None  # no float64 oracle: nothing beyond the dtype to tell apart
    spread = None
    if job.reduction > 1:  # cancelling terms: another order than eager's may round otherwise
        try:
            spread = verify.rounding_spread(task.eager, inputs, job.seed, job.reduction)
        except Exception:  # the oracle rejects the moved inputs: judged by eager alone
            pass
    return _compare_outputs(job, inputs, got, wide, precision, own, spread)


def _compare_outputs(
    job: EvalJob,
    inputs: Sequence[torch.Tensor],
    got: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    precision: torch.dtype | None,
    own: Sequence[torch.Tensor] | None = None,
    spread: Sequence[torch.Tensor] | None = None,
) -> tuple[verify.Comparison | None, float, float]:
    """The first output of `got` that fails against `expected` (None if all pass), and the
    largest absolute and relative errors seen up to there; `precision`: what the outputs were
    computed through (`verify.computed_through`); `own`: eager's outputs in their own dtypes,
    and `spread`, the float64 outputs' movement under input rounding, for an edge trial
    (`verify.compare`)."""
    largest_input = max((math.prod(s.shape) for s in job.task.inputs), default=0)
    # An output smaller than the largest input summarizes it: a statistics output.
    statistics = [out.numel() < largest_input for out in got]
    terms = verify.magnitude(inputs) if any(statistics) else 0.0  # read only where used
    max_abs = max_rel = 0.0
    for index, (out, want, statistic) in enumerate(zip(got, expected, statistics, strict=True)):
        cmp = verify.compare(
            out.cpu(),
            want.cpu(),
            index,
            reduction=job.reduction,
            statistic=statistic,
            terms=terms if statistic else 0.0,
            own=None if own is None else own[index].cpu(),
            spread=None if spread is None else spread[index].cpu(),
            precision=precision,
        )
        max_abs, max_rel = max(max_abs, cmp.max_abs_err), max(max_rel, cmp.max_rel_err)
        if not cmp.ok:
            return cmp, max_abs, max_rel
    return None, max_abs, max_rel


def _fastest(calls: dict[str, float], name: str, seconds: float) -> None:
    calls[name] = min(seconds, calls.get(name, seconds))


# Operators whose results are their dtype's limits (nan_to_num puts the largest finite value
# for Inf): in float64 those are float64's, which round to Inf in float32, so a correct float32
# kernel would mismatch. Their oracle runs in the inputs' own dtype.
_DTYPE_LIMIT_OPS = ("aten.nan_to_num.default",)


def _oracle_outputs(
    task: TaskSpec, oracle_kernel: BuiltKernel | None, inputs: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """The expected outputs: the oracle kernel's, else eager ATen's in float64 where the op has
    a float64 kernel (the verifier rounds them to the output dtype before comparing)."""
    if oracle_kernel is not None:
        return oracle_kernel(*inputs)
    assert task.eager is not None, "evaluate() refuses a task with neither"
    limits = any(op in task.eager.op.split("+") for op in _DTYPE_LIMIT_OPS)
    if any(t.is_floating_point() for t in inputs) and not limits:
        try:
            wide = verify.run_oracle(task.eager, verify.upcast(inputs))
        except Exception:  # the op has no float64 kernel: fall back to its own dtype
            pass
        else:
            # An op may take another path in float64 with other shapes: EmbeddingBag's
            # float32 kernel returns an empty offset2bag where its float64 one fills it.
            shapes = [tuple(t.shape) for t in wide]
            if shapes == [s.shape for s in task.outputs]:
                return wide
    return verify.run_oracle(task.eager, inputs)
