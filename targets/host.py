"""Facts about the host that identify a CPU target, without importing torch.

`kope-opt` computes task keys from these; loading torch would triple its start-up time.
"""

from __future__ import annotations

import functools
import os
import platform
from importlib.metadata import PackageNotFoundError, version

_ISA_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "asimd",
    "sve",
)


@functools.cache  # read once per process: every task key asks for three of them
def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


@functools.cache
def cpu_fingerprint() -> str:
    """Processor model, the ISA extensions that change code generation, and the core count."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    model = value.strip()
                elif key in ("flags", "Features"):
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    isa = "+".join(f for f in _ISA_FLAGS if f in flags) or platform.machine()
    return f"{model}|{isa}|{os.cpu_count()}cores"


def cpu_target_key() -> str:
    """Everything about this CPU target that can change a kernel's result or speed."""
    versions = (
        f"torch-{package_version('torch')}|torch-mlir-{package_version('torch-mlir')}"
        f"|kope-{package_version('kope')}"
    )
    return f"cpu|{cpu_fingerprint()}|{versions}"
