"""Verified CPU kernels as shared libraries on disk, so that a new process loads them instead
of lowering and JIT-compiling each one again.

Lowering a kernel (`kope-lower-cpu`) and compiling it at O3 take 0.1 to 0.3 s per kernel here,
paid by every new process that compiles a model with the kernel in it. The first process to
load a verified kernel has the ExecutionEngine compile it as position-independent code, writes
the object file, links it into a shared library with the system C compiler (the OpenMP runtime
a parallel kernel calls linked in), and keeps it under `$KOPE_HOME/cache/kernels`, named by
the digest of the kernel's text, its signature, the CPU, torch-mlir's version, the OpenMP
runtime and the source of KOPE's lowering (`kope.vocabulary.cache`). Later processes `dlopen`
it. Without a C compiler, or when linking fails, kernels are JIT-compiled as before.
Candidates in the isolated workers never go through here: only kernels already verified are
loaded into the calling process.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from torch_mlir import ir

import kope.passes
from kope.targets.host import cpu_fingerprint, package_version
from kope.targets.jit import OPT_LEVEL, JitKernel, openmp_library
from kope.vocabulary import layouts
from kope.vocabulary.cache import cache_dir, digest, source_digest, write_atomically
from kope.vocabulary.kernels import Kernel
from kope.vocabulary.specs import TaskSpec

log = logging.getLogger("kope.targets.cpu")

# KOPE's code a kernel's machine code depends on: the passes that lower it, the input layouts,
# the CPU build and the calling convention.
_LOWERING_SOURCES = (
    Path(kope.passes.__file__).parent,
    Path(layouts.__file__),
    Path(__file__).with_name("cpu.py"),
    Path(__file__).with_name("jit.py"),
    Path(__file__),
)
Lowering = Callable[[TaskSpec, Kernel], tuple[ir.Module, dict[int, str]]]


def cached_library(task: TaskSpec, kernel: Kernel) -> Path:
    """Where the shared library of `kernel` for `task` is kept (its facts beside it, `.json`)."""
    name = digest(
        kernel.source,
        repr((task.inputs, task.outputs)),
        cpu_fingerprint(),
        package_version("torch-mlir"),
        str(OPT_LEVEL),
        openmp_library() or "",
        source_digest(_LOWERING_SOURCES),
    )
    return cache_dir("kernels") / f"{name}.so"


def load_kernel(task: TaskSpec, kernel: Kernel, lower: Lowering) -> JitKernel:
    """A verified kernel in this process: from the cache, or built (`lower(task, kernel)`
    returns the lowered module and its input layouts) and then cached."""
    library = cached_library(task, kernel)
    directory, meta = library.parent, library.with_suffix(".json")
    if library.exists() and meta.exists():
        try:
            facts = json.loads(meta.read_text())
            layouts = {int(i): str(v) for i, v in facts["layouts"].items()}
            return JitKernel.from_library(
                str(library), task.inputs, task.outputs, layouts, bool(facts["parallel"])
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            log.warning("the cached kernel %s is unusable (%s); building it again", library, err)
    module, layouts = lower(task, kernel)
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return JitKernel(module, task.inputs, task.outputs, layouts)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as scratch:
        objects = os.path.join(scratch, "kernel.o")
        built = JitKernel(module, task.inputs, task.outputs, layouts, object_file=objects)
        linked = os.path.join(scratch, "kernel.so")
        runtime = [openmp_library() or ""] if built.parallel else []
        command = [compiler, "-shared", "-o", linked, objects, *runtime, "-lm"]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            log.info("could not cache a kernel (%s): %s", " ".join(command), proc.stderr[:300])
            return built
        os.replace(linked, library)
    facts = {"layouts": {str(i): v for i, v in layouts.items()}, "parallel": built.parallel}
    write_atomically(meta, json.dumps(facts).encode())
    return built
