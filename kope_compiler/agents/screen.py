"""Screening of kernels written by a language model, before anything builds or runs them.

A kernel is data for KOPE: MLIR it parses and verifies (or, on GPU targets, a Triton kernel).
Still, MLIR can declare and call external functions, embed assembly, and Python can import
anything; a candidate that could reach the shell, the file system or the network is refused
and recorded as a failed attempt without ever being built.

Each form is screened by the rule its target builds by, not by a second copy of it: Triton
source by the Triton targets' allow-list (`kope.targets.triton_sandbox`), MLIR by the CPU
target's `kope.targets.cpu.screen_kernel` on the parsed module. A textual copy of the MLIR rule
that matched `llvm.` refused every kernel carrying the harmless `llvm.emit_c_interface`
attribute, and one that missed an op the build refuses let the agent spend a build on it.
"""

from __future__ import annotations

from torch_mlir import ir

from kope.targets.cpu import screen_kernel
from kope.targets.triton_sandbox import screen_triton


def screen_mlir(text: str) -> str | None:
    """Why this MLIR must not be built, or None if it may (the target checks again on parse)."""
    context = ir.Context()
    context.enable_multithreading(False)
    try:
        module = ir.Module.parse(text, context)
    except ir.MLIRError:
        # Nothing is built from text that does not parse; the build's error names the line
        # and column, which is the feedback the model needs.
        return None
    refused = screen_kernel(module)
    return f"the kernel contains {refused}" if refused else None


def screen_python(text: str) -> str | None:
    """Why this Python (Triton) kernel must not be imported, or None if it may: the rule the
    Triton targets build by (`kope.targets.triton_sandbox`), an allow-list of names."""
    refused = screen_triton(text)
    return f"the kernel is refused: {refused}" if refused else None
