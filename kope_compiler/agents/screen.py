"""Screening of kernels written by a language model, before anything builds or runs them.

A kernel is data for KOPE: MLIR it parses and verifies (or, on GPU targets, a Triton kernel).
Still, MLIR can declare and call external functions, embed assembly, and Python can import
anything; a candidate that could reach the shell, the file system or the network is refused
and recorded as a failed attempt without ever being built.

MLIR is screened by the rule the CPU target builds by (`kope.targets.cpu.screen_kernel`, on
the parsed module), not by a second, textual copy of it: a copy that matched `llvm.` refused
every kernel carrying the harmless `llvm.emit_c_interface` attribute, and one that missed an
op the build refuses let the agent spend a build on it.
"""

from __future__ import annotations

import ast

from torch_mlir import ir

from kope.targets.cpu import screen_kernel

PYTHON_ALLOWED_IMPORTS = {"triton", "triton.language", "math", "torch"}
_PYTHON_FORBIDDEN_NAMES = {
    "open",
    "exec",
    "eval",
    "compile",
    "__import__",
    "globals",
    "locals",
    "getattr",
    "setattr",
    "delattr",
    "breakpoint",
    "input",
    "vars",
}


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
    """Why this Python (Triton) kernel must not be imported, or None if it may."""
    try:
        tree = ast.parse(text)
    except SyntaxError as err:
        return f"the kernel is not valid Python: {err.msg} at line {err.lineno}"
    allowed = ", ".join(sorted(PYTHON_ALLOWED_IMPORTS))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name not in PYTHON_ALLOWED_IMPORTS:
                    return f"the kernel imports {alias.name}; only {allowed} are allowed"
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "") not in PYTHON_ALLOWED_IMPORTS:
                return f"the kernel imports from {node.module}; only {allowed} are allowed"
        elif isinstance(node, ast.Name) and node.id in _PYTHON_FORBIDDEN_NAMES:
            return f"the kernel uses {node.id}(), which KOPE kernels may not"
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            return f"the kernel reaches into {node.attr}, which KOPE kernels may not"
    return None
