"""Which OpenMP runtime parallel kernels run on.

MLIR lowers parallel loops to calls into the LLVM OpenMP runtime (`__kmpc_*`). PyTorch's CPU
wheel runs its own operators on GNU libgomp. Two runtimes in one process each keep a team of
threads that spin after a parallel region; on a small machine they take the cores from each
other, and a parallel kernel next to eager operators runs no faster than a serial one. So KOPE
first builds a small shim (`runtime/kope_omp.c`, compiled with the system C compiler at first
use and cached under `$KOPE_HOME/lib`) that implements the five `__kmpc_*` entry points on the
very libgomp torch loaded: kernels then share torch's threads and its thread count. Without a
C compiler it falls back to libomp (or Intel's libiomp5); without either, kernels stay serial.
`KOPE_OPENMP=gomp|omp|none` forces a choice.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import functools
import glob
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger("kope.targets.openmp")

SHIM_SOURCE = Path(__file__).parent / "runtime" / "kope_omp.c"


def loaded_libgomp() -> str | None:
    """The libgomp this process has loaded (torch's), if any."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    found = sorted(set(re.findall(r"(/\S*libgomp[^/\s]*\.so[^/\s]*)", maps)))
    return found[0] if found else None


def _libgomp() -> str | None:
    loaded = loaded_libgomp()
    if loaded:
        return loaded
    try:
        import torch  # noqa: F401  (loads torch's libgomp)
    except ImportError:
        pass
    return loaded_libgomp() or ctypes.util.find_library("gomp")


def _build_shim(gomp: str) -> str | None:
    from kope.vocabulary.home import kope_home

    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source = SHIM_SOURCE.read_bytes()
    digest = hashlib.sha256(source + gomp.encode()).hexdigest()[:16]
    directory = kope_home() / "lib"
    target = directory / f"kope_omp-{digest}.so"
    if target.exists():
        return str(target)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return str(target)
        gomp_dir, gomp_name = os.path.split(gomp)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".so")
        os.close(fd)
        command = [
            compiler,
            "-O2",
            "-shared",
            "-fPIC",
            "-o",
            tmp,
            str(SHIM_SOURCE),
            f"-L{gomp_dir}",
            f"-l:{gomp_name}",
            f"-Wl,-rpath,{gomp_dir}",
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            log.warning(
                "building the OpenMP shim failed (%s); parallel kernels use libomp",
                result.stderr.strip()[:300],
            )
            Path(tmp).unlink(missing_ok=True)
            return None
        os.replace(tmp, target)
    return str(target)


def _libomp() -> str | None:
    candidates = [
        "/usr/lib/x86_64-linux-gnu/libomp.so.5",
        "/usr/lib/aarch64-linux-gnu/libomp.so.5",
        *sorted(glob.glob("/usr/lib/llvm-*/lib/libomp.so.5"), reverse=True),
        os.path.join(sys.prefix, "lib", "libiomp5.so"),
        ctypes.util.find_library("omp") or "",
    ]
    for path in candidates:
        if path:
            try:
                ctypes.CDLL(path)
            except OSError:
                continue
            return path
    return None


@functools.cache
def openmp_runtime() -> tuple[str, str] | None:
    """(kind, library path) of the runtime parallel kernels link against, or None.

    kind is "gomp" (the shim over torch's libgomp) or "omp" (LLVM's libomp).
    """
    wanted = os.environ.get("KOPE_OPENMP", "").strip().lower()
    if wanted == "none":
        return None
    if wanted in ("", "gomp"):
        gomp = _libgomp()
        shim = _build_shim(gomp) if gomp else None
        if shim:
            ctypes.CDLL(shim)
            return ("gomp", shim)
        if wanted == "gomp":
            return None
    library = _libomp()
    return ("omp", library) if library else None


def set_threads(threads: int) -> None:
    """Make parallel kernels use `threads` threads (eager ATen's count).

    With libomp, idle threads also stop spinning at once, so that they do not take the cores
    from torch's own threads between kernels.
    """
    runtime = openmp_runtime()
    if runtime is None:
        return
    kind, path = runtime
    if kind == "gomp":
        gomp = loaded_libgomp()
        if gomp:
            ctypes.CDLL(gomp).omp_set_num_threads(ctypes.c_int(threads))
        return
    library = ctypes.CDLL(path)
    library.omp_set_num_threads(ctypes.c_int(threads))
    library.kmp_set_blocktime(ctypes.c_int(0))
