"""Screening of kernels written by a language model, before anything builds or runs them.

A kernel is data for KOPE: MLIR it parses and verifies (or, on GPU targets, a Triton kernel).
Still, MLIR can declare and call external functions, embed assembly, and Python can import
anything; a candidate that could reach the shell, the file system or the network is refused
and recorded as a failed attempt without ever being built.
"""

from __future__ import annotations

import ast
import re

_MLIR_FORBIDDEN = [
    (re.compile(r"\bllvm\.\w+"), "LLVM dialect operations (inline assembly, raw calls)"),
    (re.compile(r"\bfunc\.call_indirect\b"), "indirect calls"),
    (re.compile(r"\bgpu\.\w+"), "GPU operations"),
]
_DECLARATION = re.compile(r"func\.func\s+(?:private\s+)?@([\w$.]+)\s*\([^{}]*\)[^{}]*$", re.M)

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
    for pattern, what in _MLIR_FORBIDDEN:
        if pattern.search(text):
            return f"the kernel uses {what}, which KOPE kernels may not"
    declared = sorted(set(_DECLARATION.findall(text)))
    if declared:
        return f"the kernel declares external functions ({', '.join(declared)})"
    return None


def screen_python(text: str) -> str | None:
    """Why this Python (Triton) kernel must not be imported, or None if it may."""
    try:
        tree = ast.parse(text)
    except SyntaxError as err:
        return f"the kernel is not valid Python: {err.msg} at line {err.lineno}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name not in PYTHON_ALLOWED_IMPORTS:
                    return f"the kernel imports {alias.name}; only {', '.join(sorted(PYTHON_ALLOWED_IMPORTS))} are allowed"
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "") not in PYTHON_ALLOWED_IMPORTS:
                return f"the kernel imports from {node.module}; only {', '.join(sorted(PYTHON_ALLOWED_IMPORTS))} are allowed"
        elif isinstance(node, ast.Name) and node.id in _PYTHON_FORBIDDEN_NAMES:
            return f"the kernel uses {node.id}(), which KOPE kernels may not"
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            return f"the kernel reaches into {node.attr}, which KOPE kernels may not"
    return None
