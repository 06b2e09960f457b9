"""Task keys: sha256 of a function's canonical IR plus the target key.

Every path that produces the same operator function — the backend importing one aten node,
`kope precompile`, `kope-outline-operators` on an IR file — must land on the same key, so the
canonical form is computed here only: the function alone in a fresh module, named `@main`,
public, without KOPE's own `kope.*` attributes or locations, after `canonicalize` and `cse`.
"""

from __future__ import annotations

import hashlib

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

CANONICAL_NAME = "main"
KEY_ATTR = "kope.key"
LABEL_ATTR = "kope.label"
KERNEL_ATTR = "kope.kernel"  # a function whose body is a kernel from memory, not an outlined operator


def canonical_function(func: ir.Operation) -> str:
    """The canonical text of a `func.func` (a fresh module holding only that function)."""
    text = func.get_asm(enable_debug_info=False)
    return canonicalize_module_text(text, func.context)


def canonicalize_module_text(text: str, context: ir.Context | None = None) -> str:
    """Canonical text of a module (or bare function) holding exactly one `func.func`."""
    ctx = context or ir.Context()
    module = ir.Module.parse(text, ctx)
    funcs = [op for op in module.body.operations if op.operation.name == "func.func"]
    if len(funcs) != 1:
        raise ValueError(f"expected exactly one func.func to canonicalize, found {len(funcs)}")
    func = funcs[0].operation
    func.attributes["sym_name"] = ir.StringAttr.get(CANONICAL_NAME, ctx)
    # KOPE's own attributes (key, label, experience, kernel provenance) say things about the
    # function, not what it computes.
    for name in [a for a in func.attributes if a == "sym_visibility" or a.startswith("kope.")]:
        del func.attributes[name]
    with ctx:
        PassManager.parse("builtin.module(canonicalize,cse)").run(module.operation)
    return module.operation.get_asm(enable_debug_info=False)


def workload_digest(canonical_text: str) -> str:
    """What the operator computes, independent of the target."""
    return hashlib.sha256(canonical_text.encode()).hexdigest()


def task_key(canonical_text: str, target_key: str) -> str:
    """The key of an operator on a target: sha256 of canonical IR and target key."""
    h = hashlib.sha256(canonical_text.encode())
    h.update(b"\0target\0" + target_key.encode())
    return h.hexdigest()
