"""Triton kernels through Triton's real compiler, for GPU architectures this machine lacks.

The interpreter verifies what a Triton kernel computes, not whether a GPU can run it: a
kernel the interpreter runs can still fail to compile (an op the backend rejects, a layout
it cannot convert), ask for more shared memory than a block may have (`num_stages` x tile
sizes) or spill registers. Triton compiles ahead of time without a GPU (TTIR, TTGIR, LLVM
IR, PTX, and a cubin through the `ptxas` its wheel ships), so each verified candidate of the
CUDA target goes through it here, for every architecture the target names (`sm_80` and
`sm_90` unless told otherwise):

1. In a compile worker (an isolated worker where triton was imported *without*
   `TRITON_INTERPRET`: the interpreter's `@jit` functions, `tl.softmax` among them, cannot be
   compiled), the kernel module is loaded in the sandbox again and its launcher is called
   with meta tensors (shapes, strides and dtypes, no memory), each `@triton.jit` function of
   the module replaced by a recorder: every `kernel[grid](...)` launch is recorded, none runs.
2. Each launch is specialized as Triton's JIT would (constexprs, 16-byte aligned pointers,
   integers divisible by 16, the integer 1 as a constant) and compiled by `triton.compile`
   for each architecture, with `ptxas -v`'s report read for registers and spilled bytes, and
   the kernel's shared memory from its metadata.
3. `refusal` says why the compiled kernel cannot run there: the compiler's error, more shared
   memory than a block may have, more registers than one block of its warps may hold, or any
   spill. `evaluate` turns a refusal into the attempt's failure (a `compile_error` naming the
   architecture); a refused kernel never enters a kernel pack.

`estimate_us` is a roofline estimate of one call on the architecture's part from the
operator's work and the kernel's resources (its occupancy and grid): it ranks kernels no
device has timed (a kernel pack's order, the search's evidence on a device it has not met),
and it is always labelled an estimate, never stored as a timing.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kope.targets.triton_sandbox import load_launcher
from kope.targets.worker import SCRATCH_VARIABLE, limit_resources

if TYPE_CHECKING:  # this module's constants serve `kope --help`, which imports no torch
    from kope.targets.measure import Work
    from kope.vocabulary.specs import TaskSpec


@dataclass(frozen=True)
class Architecture:
    """One GPU architecture: its limits (the CUDA programming guide's table of compute
    capabilities) and, for the roofline estimate, the peaks of one part built on it."""

    name: str  # "sm_90"
    capability: int  # 90
    part: str  # the part whose peaks these are
    shared_bytes: int  # the most shared memory one block may use (opt-in)
    max_warps_per_sm: int
    max_blocks_per_sm: int
    multiprocessors: int
    bandwidth_gbs: float  # DRAM
    fp32_tflops: float  # without tensor cores (float32 `tl.dot` is "ieee" here)
    tensor_tflops: float  # dense float16/bfloat16 on tensor cores
    registers_per_sm: int = 65536
    max_threads_per_block: int = 1024


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture("sm_75", 75, "T4", 64 << 10, 32, 16, 40, 320.0, 8.1, 65.0),
        Architecture("sm_80", 80, "A100-SXM4-80GB", 163 << 10, 64, 32, 108, 2039.0, 19.5, 312.0),
        Architecture("sm_86", 86, "A10", 99 << 10, 48, 16, 72, 600.0, 31.2, 125.0),
        Architecture("sm_89", 89, "L4", 99 << 10, 48, 24, 58, 300.0, 30.3, 121.0),
        Architecture("sm_90", 90, "H100-SXM5-80GB", 227 << 10, 64, 32, 132, 3350.0, 67.0, 989.0),
    )
}
# What the CUDA target compiles for unless told otherwise: the two generations of data-centre
# GPU most likely to be lent. `KOPE_CUDA_ARCH` (as `TORCH_CUDA_ARCH_LIST` is for PyTorch's
# extensions; `--cuda-arch` sets it) names others, or none ("none").
DEFAULT_ARCHITECTURES = ("sm_80", "sm_90")
ARCH_VARIABLE = "KOPE_CUDA_ARCH"
# The launch options a `kernel[grid](...)` call may pass beside the kernel's arguments, and
# the warps a launch runs with when it names none (Triton's default).
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
DEFAULT_WARPS = 4
# What one launch costs on the device beyond its work (the estimate's floor).
LAUNCH_US = 3.0
# The share of its peaks a kernel reaches with the whole GPU busy: a roofline is a bound.
ACHIEVABLE = 0.8
# The share of a multiprocessor's warps that hides memory latency well enough for full speed.
LATENCY_HIDING_SHARE = 0.25
# A compile worker's environment: triton imported for real compilation, compiling every
# time (a cached kernel has no `ptxas -v` report to read), the report printed.
COMPILE_ENV = {"TRITON_INTERPRET": "0", "TRITON_ALWAYS_COMPILE": "1", "TRITON_DUMP_PTXAS_LOG": "1"}


def configured_architectures() -> tuple[str, ...]:
    """The architectures CUDA kernels are compiled for: `KOPE_CUDA_ARCH`, else the default."""
    given = os.environ.get(ARCH_VARIABLE)
    if given is None:
        return DEFAULT_ARCHITECTURES
    try:
        return parse_architectures(given)
    except ValueError as err:
        raise ValueError(f"{ARCH_VARIABLE}={given!r}: {err}, or none") from None


def parse_architectures(names: Sequence[str] | str) -> tuple[str, ...]:
    """Architecture names as given (`"sm_80,sm_90"`, `["sm90"]`, `"90"`; `"none"`: no
    compilation), checked and normalised; ValueError names the known ones."""
    if isinstance(names, str):
        if names.strip().lower() == "none":
            return ()
        names = [n for n in names.replace(";", ",").split(",") if n.strip()]
    found: list[str] = []
    for raw in names:
        digits = raw.strip().lower().removeprefix("sm_").removeprefix("sm")
        name = f"sm_{digits}"
        if name not in ARCHITECTURES:
            known = ", ".join(ARCHITECTURES)
            raise ValueError(f"unknown GPU architecture {raw!r}; KOPE knows {known}")
        if name not in found:
            found.append(name)
    return tuple(found)


# -- recording the launches ---------------------------------------------------------------------
class TraceError(Exception):
    """A launcher whose launches cannot be recorded for compilation."""


@dataclass
class Launch:
    """One `kernel[grid](...)` call of a launcher, specialized as Triton's JIT would."""

    fn: Any  # the @triton.jit function
    programs: int
    signature: dict[str, str]
    constexprs: dict[str, Any]
    attrs: dict[tuple[int, ...], list[list[Any]]]
    options: dict[str, int]

    @property
    def num_warps(self) -> int:
        return self.options.get("num_warps", DEFAULT_WARPS)


class _Recorder:
    """Stands for a `@triton.jit` function while the launcher runs: records, never launches."""

    def __init__(self, fn: Any, launches: list[Launch]):
        self.fn = fn
        self.launches = launches

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def record(*args: Any, **kwargs: Any) -> None:
            self.launches.append(_specialize(self.fn, grid, args, kwargs))

        return record


def trace_launches(source: str, task: TaskSpec, directory: Path) -> list[Launch]:
    """The launches `source`'s launcher makes for `task`, recorded with meta tensors."""
    import torch
    from triton.runtime.jit import JITFunction

    launch = load_launcher(source, directory)
    namespace = launch.__globals__
    kernels = {name: v for name, v in namespace.items() if isinstance(v, JITFunction)}
    launches: list[Launch] = []
    namespace.update({name: _Recorder(fn, launches) for name, fn in kernels.items()})
    tensors = [
        torch.empty(s.shape, dtype=s.torch_dtype, device="meta")
        for s in (*task.inputs, *task.outputs)
    ]
    try:
        launch(*tensors)
    except TraceError:
        raise
    except Exception as err:
        raise TraceError(
            f"the launcher could not be traced for compilation: {type(err).__name__}: {err}"
        ) from None
    finally:
        namespace.update(kernels)  # the compiler resolves nested @jit calls through them
    if not launches:
        raise TraceError("the launcher launched no @triton.jit kernel")
    return launches


def _specialize(fn: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Launch:
    options = {k: int(kwargs.pop(k)) for k in LAUNCH_OPTIONS if k in kwargs}
    try:
        bound = fn.signature.bind(*args, **kwargs)
    except TypeError as err:
        raise TraceError(f"{fn.__name__}[grid](...): {err}") from None
    bound.apply_defaults()
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for index, param in enumerate(fn.params):
        name, value = param.name, bound.arguments[param.name]
        if param.is_constexpr or value is None:
            signature[name], constexprs[name] = "constexpr", value
            continue
        kind = _argument_type(fn.__name__, name, value)
        specialize = not param.do_not_specialize
        if kind in ("i32", "i64") and value == 1 and specialize:
            signature[name], constexprs[name] = "constexpr", value  # the JIT folds 1, too
            continue
        signature[name] = kind
        aligned = kind.startswith("*") or (
            kind in ("i32", "i64") and value % 16 == 0 and specialize
        )
        if aligned and not param.do_not_specialize_on_alignment:
            attrs[(index,)] = [["tt.divisibility", 16]]
    if callable(grid):  # `def grid(meta)`: the JIT calls it with the launch's arguments
        grid = grid(dict(bound.arguments))
    if isinstance(grid, int):
        grid = (grid,)
    try:
        programs = math.prod(int(g) for g in grid)
    except (TypeError, ValueError):
        raise TraceError(f"{fn.__name__}[{grid!r}]: the grid is not a tuple of integers") from None
    return Launch(fn, programs, signature, constexprs, attrs, options)


def _argument_type(kernel: str, name: str, value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        from kope.vocabulary.specs import DTYPES

        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise TraceError(f"{kernel}: argument {name} is a {dtype} tensor")
        short = DTYPES[dtype]  # Triton spells MLIR's floats fp32, fp16, fp64 (bf16 as is)
        return "*" + ("fp" + short[1:] if short.startswith("f") else short)
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TraceError(f"{kernel}: argument {name} is a {type(value).__name__}")


# -- compiling ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompileJob:
    """One verified Triton kernel to compile for `architectures` (run in a compile worker)."""

    task: TaskSpec
    source: str
    architectures: tuple[str, ...]


def compile_job(job: CompileJob, phase: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Compile one kernel for each architecture: `{"sm_90": {"ok", "registers", "spills",
    "shared_bytes", "error", "num_warps", "programs", "launches"}}`. Runs in a compile worker."""
    from triton import knobs

    limit_resources()
    scratch = Path(os.environ.get(SCRATCH_VARIABLE) or ".")
    knobs.cache.dir = str(scratch / "triton-cache")  # removed with the worker's scratch
    phase("build")
    try:
        launches = trace_launches(job.source, job.task, scratch)
    except Exception as err:  # refused by the sandbox, or untraceable
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        return {arch: failed(reason) for arch in job.architectures}
    phase("compile")
    return {arch: _compile_all(launches, ARCHITECTURES[arch]) for arch in job.architectures}


def failed(error: str) -> dict[str, Any]:
    """The record of a kernel that did not compile for an architecture."""
    return {"ok": False, "registers": None, "spills": None, "shared_bytes": None, "error": error}


_REGISTERS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _compile_all(launches: Sequence[Launch], arch: Architecture) -> dict[str, Any]:
    """Every launch compiled for `arch`, summarized as the most any of them needs."""
    registers = spills = shared = 0
    for launch in launches:
        try:
            used = _compile(launch, arch)
        except Exception as err:
            return failed(f"{launch.fn.__name__}: {compiler_error(err)}")
        registers, spills = max(registers, used[0]), max(spills, used[1])
        shared = max(shared, used[2])
    record: dict[str, Any] = {
        "ok": True,
        "registers": registers,
        "spills": spills,
        "shared_bytes": shared,
        "error": None,
        "num_warps": max(launch.num_warps for launch in launches),
        "programs": sum(launch.programs for launch in launches),
        "launches": len(launches),
    }
    why = refusal(record, arch)
    if why:
        record.update(ok=False, error=why)
    return record


def compiler_error(err: Exception) -> str:
    """The compiler's complaint in one line: Triton's `at L:C:` with the source line the caret
    points at and the message after it; else the first lines of the error."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    caret = next((i for i, line in enumerate(lines) if line.strip() == "^"), None)
    if caret is not None and caret > 0 and lines[0].startswith("at "):
        message = " ".join(lines[caret + 1 :]) or type(err).__name__
        return f"{lines[0].rstrip(':')} `{lines[caret - 1].strip()}`: {message}"[:400]
    return (" ".join(lines[:3]) or type(err).__name__)[:400]


def _compile(launch: Launch, arch: Architecture) -> tuple[int, int, int]:
    """(registers per thread, spilled bytes, shared bytes) of `launch` compiled for `arch`."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(launch.fn, launch.signature, launch.constexprs, launch.attrs)
    report = io.StringIO()
    with contextlib.redirect_stdout(report):  # `ptxas -v`'s report (TRITON_DUMP_PTXAS_LOG)
        compiled = triton.compile(
            source, target=GPUTarget("cuda", arch.capability, 32), options=dict(launch.options)
        )
    text = report.getvalue()
    registers = max((int(n) for n in _REGISTERS.findall(text)), default=0)
    spills = max((int(s) + int(ld) for s, ld in _SPILLS.findall(text)), default=0)
    if not registers:  # no report (another triton's knobs): read the cubin's resources
        registers = _cubin_registers(compiled.asm["cubin"])
    return registers, spills, int(compiled.metadata.shared)


def _cubin_registers(cubin: bytes) -> int:
    import subprocess
    import tempfile

    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        out = subprocess.run(
            [knobs.nvidia.cuobjdump.path, "-res-usage", file.name],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    return max((int(n) for n in re.findall(r"REG:(\d+)", out)), default=0)


# -- what it means --------------------------------------------------------------------------------
def _warps(record: dict[str, Any]) -> int:
    return int(record.get("num_warps") or DEFAULT_WARPS)


def refusal(record: dict[str, Any], arch: Architecture) -> str | None:
    """Why a kernel compiled for `arch` cannot run well there, or None."""
    warps = _warps(record)
    threads = warps * 32
    if threads > arch.max_threads_per_block:
        return f"{threads} threads per block; {arch.name} allows {arch.max_threads_per_block}"
    shared = int(record.get("shared_bytes") or 0)
    if shared > arch.shared_bytes:
        return (
            f"needs {shared} bytes of shared memory per block; {arch.name} offers at most "
            f"{arch.shared_bytes}"
        )
    registers = int(record.get("registers") or 0)
    if registers * threads > arch.registers_per_sm:
        return (
            f"needs {registers} registers x {threads} threads = {registers * threads} per "
            f"block; an {arch.name} multiprocessor has {arch.registers_per_sm}"
        )
    spills = int(record.get("spills") or 0)
    if spills:
        return f"spills {spills} bytes of registers to local memory on {arch.name}"
    return None


def estimate_of(records: dict[str, dict[str, Any]] | None) -> float | None:
    """One kernel's roofline estimate over its architectures (their geometric mean, in
    microseconds); None where it was not compiled, or did not compile for one of them."""
    estimates = [float(r.get("estimate_us") or 0.0) for r in (records or {}).values()]
    if not estimates or min(estimates) <= 0:
        return None
    return math.exp(sum(math.log(e) for e in estimates) / len(estimates))


def occupancy(record: dict[str, Any], arch: Architecture) -> float:
    """The share of a multiprocessor's warps the kernel keeps resident (0 when it cannot run)."""
    warps = _warps(record)
    limits = [arch.max_blocks_per_sm, arch.max_warps_per_sm // warps]
    registers = int(record.get("registers") or 0)
    if registers:
        limits.append(arch.registers_per_sm // (registers * warps * 32))
    shared = int(record.get("shared_bytes") or 0)
    if shared:
        limits.append(arch.shared_bytes // shared)
    return min(limits) * warps / arch.max_warps_per_sm


def estimate_us(
    record: dict[str, Any], arch: Architecture, work: Work, tensor_cores: bool
) -> float | None:
    """A roofline estimate of one call on `arch`'s part (microseconds), None when the kernel
    cannot run there: the operator's bytes at the part's bandwidth or its flops (two per loop
    iteration) at its peak, whichever bounds it, over the share of the GPU the kernel keeps
    busy, plus a launch. That share is the multiprocessors its programs reach, times how well
    each hides memory latency (a quarter of its warps resident, `LATENCY_HIDING_SHARE`, runs
    at full speed; the warps a kernel can keep resident are bounded by its occupancy), times
    the last wave's waste where programs come in more than one wave."""
    if not record.get("ok"):
        return None
    resident = occupancy(record, arch)
    if resident <= 0:
        return None
    warps = _warps(record)
    programs = max(1, int(record.get("programs") or 1))
    reached = min(arch.multiprocessors, programs)
    warps_per_sm = min(resident * arch.max_warps_per_sm, programs * warps / reached)
    hiding = min(1.0, warps_per_sm / (LATENCY_HIDING_SHARE * arch.max_warps_per_sm))
    waves = programs / (arch.multiprocessors * resident * arch.max_warps_per_sm / warps)
    tail = waves / math.ceil(waves) if waves > 1 else 1.0
    busy = reached / arch.multiprocessors * hiding * tail
    peak = arch.tensor_tflops if tensor_cores else arch.fp32_tflops
    memory_s = work.bytes / (arch.bandwidth_gbs * 1e9 * ACHIEVABLE)
    compute_s = 2 * work.iterations / (peak * 1e12 * ACHIEVABLE)
    launches = int(record.get("launches") or 1)
    return max(memory_s, compute_s) / busy * 1e6 + LAUNCH_US * launches
