"""The CPU target: MLIR → LLVM through `kope-lower-cpu`, JIT by the ExecutionEngine in torch-mlir.

This module supplies what is CPU-specific: the kernel screen (which dialects a kernel may
use), parsing and lowering, the JIT build, OpenMP threads in the worker, and the account of
the MLIR kernel forms for the LLM agent's prompt. Building, verifying and timing candidates in
isolated workers is the evaluation every target shares (`kope.targets.evaluation`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch_mlir import ir

from kope.targets.base import BuildError, Target
from kope.targets.host import cpu_fingerprint, cpu_target_key
from kope.targets.jit import ENTRY, JitKernel, openmp_library, set_openmp_threads
from kope.targets.kernel_cache import cached_library, load_kernel
from kope.vocabulary.kernels import FORM_MLIR, Kernel
from kope.vocabulary.layouts import LayoutError, laid_out, layout_strides
from kope.vocabulary.specs import MLIR_ELEMENTS, TaskSpec, TensorSpec, dtype_name

log = logging.getLogger("kope.targets.cpu")

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
    element = MLIR_ELEMENTS.get(spec.dtype)
    if element is None:
        raise BuildError(f"dtype {spec.dtype} has no CPU kernel support")
    dims = "".join(f"{d}x" for d in spec.shape)
    return f"memref<{dims}{element}>"


# -- building (in whichever process runs the kernel) --------------------------------------------


def lower_kernel(task: TaskSpec, kernel: Kernel) -> ir.Module:
    """Parse `kernel`, check it fits `task`, and lower it with `kope-lower-cpu`."""
    return _lowered(task, kernel)[0]


def _lowered(task: TaskSpec, kernel: Kernel) -> tuple[ir.Module, dict[int, str]]:
    """The lowered module and the layouts its entry takes inputs and writes outputs in (by
    argument index: the inputs, then the outputs)."""
    from kope.passes.abi import DestinationAbi, argument_layouts, find_func, function_type
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
    layouts = argument_layouts(module.operation)
    arguments = (*task.inputs, *task.outputs)
    try:
        specs = [laid_out(s, layouts[i]) if i in layouts else s for i, s in enumerate(arguments)]
    except LayoutError as err:
        raise BuildError(str(err)) from None
    if any(i >= len(arguments) for i in layouts):
        raise BuildError(
            f"a layout is named on argument {max(layouts)}; the operator has {len(task.inputs)} "
            f"inputs and {len(task.outputs)} outputs"
        )
    written = [layouts[i] for i in range(len(task.inputs), len(arguments)) if i in layouts]
    if any(layout_strides(layout) is None for layout in written):
        raise BuildError(f"an output may name only a strided layout, not {written}")
    try:
        run_pipeline(module, [DestinationAbi()], description=f"abi {task.label}")
    except PipelineError as err:
        raise BuildError(str(err)) from None
    entry = find_func(module.operation, ENTRY)
    assert entry is not None
    got = [str(t) for t in function_type(entry).inputs]
    want = [memref_type(s) for s in specs]
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
    return module, layouts


def build_kernel(task: TaskSpec, kernel: Kernel) -> JitKernel:
    module, layouts = _lowered(task, kernel)
    try:
        return JitKernel(module, task.inputs, task.outputs, layouts)
    except RuntimeError as err:
        raise BuildError(f"JIT compilation failed: {err}") from None


def cache_kernel_job(job: tuple[TaskSpec, Kernel], phase: Callable[[str], None]) -> None:
    """A worker's job: build a verified kernel into `kope.targets.kernel_cache`."""
    phase("build")
    load_kernel(*job, _lowered)


# -- the target -----------------------------------------------------------------------------------


# torch-mlir's linalg lowering of 8-bit integers kills the process that runs it on a scalar
# operand or a reduction's initial value (uint8 and int8 `x * 2`, `x // 3`, `x.max()`:
# SIGSEGV in the import, which runs in the compiling process), and lowers uint8 as signed
# (`(img > 128).sum()` wrong): their operators run eagerly.
EIGHT_BIT = frozenset({"int8", "uint8"})


class CpuTarget(Target):
    """MLIR on the host CPU: lowered by `kope-lower-cpu`, JIT-compiled at opt_level 3.

    Eager ATen is timed with the calling process's thread count; kernels are single-threaded
    unless their schedule runs parallel loops, which use OpenMP with that same count."""

    name = "cpu"
    kernel_forms = (FORM_MLIR,)
    dtypes: ClassVar[frozenset[str]] = frozenset(MLIR_ELEMENTS) - EIGHT_BIT

    def refuses(self, tensor: torch.Tensor) -> str | None:
        if dtype_name(tensor.dtype) in EIGHT_BIT:
            return (
                f"uses dtype {tensor.dtype}: torch-mlir's lowering of 8-bit integers crashes "
                "the process on some operators and reads uint8 as signed on others"
            )
        return super().refuses(tensor)

    def key(self) -> str:
        return cpu_target_key()

    @classmethod
    def build(cls, task: TaskSpec, kernel: Kernel) -> JitKernel:
        return build_kernel(task, kernel)

    def build_verified(self, task: TaskSpec, kernel: Kernel) -> JitKernel:
        """A verified kernel, loaded from `kope.targets.kernel_cache`. One not there yet is
        built into it by a worker: lowering and compiling run MLIR's pipelines and LLVM, native
        code that must not take the user's process down with it if it crashes. (Without a C
        compiler to link a library, the kernel is compiled in this process, as it verified.)"""
        if not cached_library(task, kernel).exists():
            outcome = self.pool.call(f"{__name__}:cache_kernel_job", (task, kernel), self.timeout_s)
            if not outcome.ok:
                detail = outcome.detail.strip().splitlines()
                raise BuildError(
                    f"building the verified kernel in a worker ended in a {outcome.failure}"
                    + (f": {detail[-1][:300]}" if detail else "")
                )
        try:
            return load_kernel(task, kernel, _lowered)
        except RuntimeError as err:
            raise BuildError(f"JIT compilation failed: {err}") from None

    @classmethod
    def prepare_worker(cls, eager_threads: int) -> None:
        torch.set_num_threads(eager_threads)
        set_openmp_threads(eager_threads)

    def capabilities(self) -> dict[str, Any]:
        flags = cpu_fingerprint().split("|")[1].split("+")
        bits = 512 if "avx512f" in flags else 256 if "avx2" in flags or "avx" in flags else 128
        return {
            "vector_bits": bits,
            "isa": flags,
            "threads": torch.get_num_threads(),
            "openmp": openmp_library() is not None,
        }

    def describe(self, task: TaskSpec | None = None) -> str:
        return KERNEL_FORMS_PROMPT.format(
            signature=kernel_signature(task), dialects=", ".join(KERNEL_DIALECTS)
        )


# The memref signature and the dialects are rendered from what the build checks (`screen_kernel`,
# `memref_type`, `kope-destination-abi`), so the prompt cannot offer what the build refuses.
KERNEL_FORMS_PROMPT = """\
Answer with ONE ```mlir code block holding a complete MLIR module in one of these forms:
1. The payload `func.func @main` (you may rewrite it; keep its signature) plus a transform
   schedule beside it: `module attributes {{transform.with_named_sequence}} {{ func.func @main
   ... transform.named_sequence @__transform_main(%root: !transform.any_op {{transform.readonly}})
   {{ ... transform.yield }} }}`. The schedule is applied to the payload, then KOPE bufferizes and
   lowers to LLVM. Useful ops: transform.structured.tile_using_for / tile_using_forall (forall
   loops run on OpenMP threads), fuse_into_containing_op, vectorize_children_and_apply_patterns,
   apply_patterns with vector.lower_contraction, transform.loop.hoist_loop_invariant_subsets.
2. A kernel on memrefs, with exactly this signature:
   `{signature}`
   Its arguments are the inputs, then one memref per output, which it must fill completely;
   it returns nothing and needs no attributes (KOPE gives it its C calling convention).
   Write loops or linalg ops on the memrefs, or tensor code between
   `bufferization.to_tensor %in restrict` and
   `bufferization.materialize_in_destination %result in restrict writable %out`.
Only these dialects are allowed: {dialects}.
No declarations of external functions, no indirect calls; the module may hold helper
functions that it defines."""


def kernel_signature(task: TaskSpec | None) -> str:
    """The signature the memref form must have for `task`: inputs, then output destinations."""
    if task is None:
        return f"func.func @{ENTRY}(inputs..., outputs...)"
    try:
        params = [f"%in{i}: {memref_type(s)}" for i, s in enumerate(task.inputs)]
        params += [f"%out{j}: {memref_type(s)}" for j, s in enumerate(task.outputs)]
    except BuildError:
        # A dtype with no memref element: only the payload form can describe this operator.
        return f"func.func @{ENTRY}(...) (not available for these dtypes)"
    return f"func.func @{ENTRY}({', '.join(params)})"


__all__ = ["BuildError", "CpuTarget", "build_kernel", "cpu_fingerprint", "screen_kernel"]
