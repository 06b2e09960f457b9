"""The sandbox of a Triton kernel's source: the rule it must pass before any of it runs (an
allow-list of names), and the loader that runs it with nothing more.

A Triton kernel is Python, and Python reaches everything from anywhere: `import triton` also
exposes `triton.testing.subprocess`, a bare `__builtins__['__import__']` needs no import at
all, and a torch tensor has `numpy()` and `untyped_storage()`. So the screen does not list
what is forbidden; it lists what a kernel may name — the `tl` language, `triton.jit`,
`triton.cdiv`, `triton.next_power_of_2`, `math`, a few builtins, the tensor attributes a
launcher needs, and the names the source binds itself — and refuses the rest, with the line.

`load_launcher` runs a screened source with only those builtins and an `__import__` that
hands out only the three modules; KOPE calls it in an isolated worker with a scratch
directory, no secrets in its environment and resource limits: the screen is the first wall,
not the only one.

This module needs only the standard library: the kernel pack's runner (`pack_runner`), which
runs on machines without KOPE, carries a copy of it.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODULES = {"triton": "triton", "triton.language": "tl", "math": "math"}
TRITON_NAMES = frozenset({"jit", "cdiv", "next_power_of_2"})
# The `tl` language a kernel may use: computation, memory through its own pointers, and
# program ids. Not `tl.extra` (libdevice, which the interpreter cannot run), not inline
# assembly, not `core`/`semantic` (the compiler's internals), not device printing.
TL_NAMES = frozenset(
    """
    PropagateNan abs advance arange argmax argmin associative_scan atomic_add atomic_max atomic_min
    bfloat16 broadcast broadcast_to cast cat cdiv ceil clamp constexpr cos cumprod cumsum
    div_rn dot dtype erf exp exp2 expand_dims fdiv flip float16 float32 float64 floor fma
    full gather int1 int16 int32 int64 int8 interleave join load log log2 make_block_ptr
    math max max_constancy max_contiguous maximum min minimum multiple_of num_programs
    permute program_id range ravel reduce reshape rsqrt sigmoid sin softmax sort split sqrt
    sqrt_rn static_assert static_range store sum swizzle2d tensor trans uint16 uint32
    uint64 uint8 umulhi view where xor_sum zeros zeros_like
    """.split()
)
# `tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)`: NaN in, NaN out, as torch does.
PROPAGATE_NAN_NAMES = frozenset({"ALL", "NONE"})
# `tl.math.<fn>`: the elementwise math functions.
TL_MATH_NAMES = frozenset(
    """
    abs ceil cos div_rn erf exp exp2 fdiv floor fma log log2 max min rsqrt sin sqrt sqrt_rn
    umulhi
    """.split()
)
MATH_NAMES = frozenset(name for name in dir(math) if not name.startswith("_"))
BUILTINS = frozenset({"range", "min", "max", "len", "int", "float", "abs", "bool", "tuple"})
# Attributes of values (tensors in a launcher, blocks and pointers in a kernel).
VALUE_ATTRIBUTES = frozenset(
    """
    shape stride numel element_size dtype element_ty to T reshape trans broadcast_to
    expand_dims sum max min argmax argmin cumsum permute ravel split
    """.split()
)
# Nodes a kernel has no use for and an attack has: classes, context managers, exception
# handlers (which hide a probe's failure), generators, deletion, scope escapes, f-strings.
_REFUSED_NODES = (
    ast.ClassDef,
    ast.AsyncFunctionDef,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    ast.TryStar,
    ast.Raise,
    ast.Global,
    ast.Nonlocal,
    ast.Delete,
    ast.Yield,
    ast.YieldFrom,
    ast.Await,
    ast.JoinedStr,
    ast.Lambda,
    ast.NamedExpr,
    ast.Match,
)


def screen_triton(source: str) -> str | None:
    """Why this Triton kernel source must not run (naming the line), or None if it may."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return f"the kernel is not valid Python: {err.msg} at line {err.lineno}"
    aliases: dict[str, str] = {}  # local name -> module ("tl" -> "triton.language")
    for statement in tree.body:
        refused = _screen_top(statement, aliases)
        if refused:
            return refused
    if not any(isinstance(n, ast.FunctionDef) and n.name == "launch" for n in tree.body):
        return "the kernel has no `def launch(...)` (inputs, then outputs)"
    bound = _bound_names(tree) | BUILTINS | set(aliases)
    top = {id(statement) for statement in tree.body}
    found: list[tuple[int, int, str]] = []  # the first in reading order is reported
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in top:
            refused = "imports belong at the top of the module"
        else:
            refused = _screen_node(node, aliases, bound)
        if refused:
            line, end = getattr(node, "lineno", 0), getattr(node, "end_col_offset", 0) or 0
            found.append((line, end, f"line {line}: {refused}"))
    if found:
        return min(found)[2]
    return None


def _screen_top(node: ast.stmt, aliases: dict[str, str]) -> str | None:
    line = f"line {node.lineno}"
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name not in MODULES:
                return f"{line}: imports {alias.name}; a kernel may import only {_modules()}"
            if "." in alias.name and alias.asname is None:
                return f"{line}: write `import {alias.name} as {MODULES[alias.name]}`"
            aliases[alias.asname or alias.name] = alias.name
        return None
    if isinstance(node, ast.ImportFrom):
        return f"{line}: `from {node.module} import ...`; use `import triton.language as tl`"
    if isinstance(node, ast.FunctionDef):
        for decorator in node.decorator_list:
            if _dotted(decorator, aliases) != "triton.jit":
                return f"{line}: `{node.name}` has a decorator other than `@triton.jit`"
        return None
    if isinstance(node, ast.Assign | ast.AnnAssign):
        return None  # module constants (BLOCK = 1024); their values are screened below
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return None  # a docstring
    return f"{line}: a kernel module holds imports, constants and functions, not {_kind(node)}"


def _screen_node(node: ast.AST, aliases: dict[str, str], bound: set[str]) -> str | None:
    if isinstance(node, _REFUSED_NODES):
        return f"{_kind(node)} is not allowed in a kernel"
    if isinstance(node, ast.Name):
        if node.id.startswith("__"):
            return f"`{node.id}` is not allowed in a kernel"
        if node.id not in bound:
            return f"`{node.id}` is not a name a kernel may use"
    if isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            return f"`.{node.attr}` is not allowed in a kernel"
        return _screen_attribute(node, aliases)
    if isinstance(node, ast.Constant) and isinstance(node.value, bytes):
        return "bytes constants are not allowed in a kernel"
    return None


def _screen_attribute(node: ast.Attribute, aliases: dict[str, str]) -> str | None:
    dotted = _dotted(node, aliases)
    if dotted is None:  # an attribute of a value, not of a module
        if node.attr in VALUE_ATTRIBUTES:
            return None
        return f"`.{node.attr}` is not an attribute a kernel may use"
    module, _, name = dotted.rpartition(".")
    if not module:
        return None
    allowed = {
        "triton": TRITON_NAMES,
        "triton.language": TL_NAMES,
        "triton.language.math": TL_MATH_NAMES,
        "triton.language.PropagateNan": PROPAGATE_NAN_NAMES,
        "math": MATH_NAMES,
    }.get(module)
    if allowed is None or name not in allowed:
        # Only the last link is judged here; `tl.math.exp` passes as `tl.math`, then `.exp`.
        parent = node.value
        if isinstance(parent, ast.Attribute) and _dotted(parent, aliases) == "triton.language.math":
            return f"`tl.math.{name}` is not allowed in a kernel"
        shown = dotted.replace("triton.language", "tl")
        return f"`{shown}` is not allowed in a kernel"
    return None


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The module path `node` names (`tl.sum` -> "triton.language.sum"), or None when it is
    not an attribute chain rooted at an imported module."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def _bound_names(tree: ast.Module) -> set[str]:
    """Names the source binds itself: functions, parameters, assignment and loop targets."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                names.add(arg.arg)
            for star in (args.vararg, args.kwarg):
                if star is not None:
                    names.add(star.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _kind(node: ast.AST) -> str:
    return f"`{type(node).__name__}`"


def _modules() -> str:
    return ", ".join(f"`{m}`" for m in MODULES)


class KernelRefused(Exception):
    """A kernel source that the screen refuses or that fails to load."""


def _sandbox_import(
    name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
) -> Any:
    if level or name not in MODULES:
        raise ImportError(f"a kernel may import only {', '.join(MODULES)}, not {name}")
    return builtins.__import__(name, globals, locals, fromlist, level)


def sandbox_builtins() -> dict[str, Any]:
    """The builtins a kernel runs with: `BUILTINS` and an `__import__` of `MODULES` alone."""
    allowed = {name: getattr(builtins, name) for name in BUILTINS}
    return {**allowed, "__import__": _sandbox_import}


def load_launcher(source: str, directory: Path) -> Callable[..., Any]:
    """Screen `source`, run it with the sandbox's builtins, and return its `launch`.

    The source is written to `directory` first: `@triton.jit` (and its interpreter) read a
    kernel's source back from the file its code object names."""
    refused = screen_triton(source)
    if refused:
        raise KernelRefused(f"kernel refused: {refused}")
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = directory / f"kope_kernel_{digest}.py"
    path.write_text(source)
    namespace: dict[str, Any] = {
        "__builtins__": sandbox_builtins(),
        "__name__": f"kope_kernel_{digest}",
        "__file__": str(path),
    }
    try:
        exec(compile(source, str(path), "exec"), namespace)
    except Exception as err:
        raise KernelRefused(
            f"the kernel module failed to load: {type(err).__name__}: {err}"
        ) from None
    launch = namespace.get("launch")
    if not callable(launch):
        raise KernelRefused("the kernel module defines no callable `launch`")
    return launch
