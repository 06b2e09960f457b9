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
# The ATen call a function computes, as JSON (`kope.vocabulary.specs.eager_json`): written by
# `kope import`, it lets `kope-optimize` time the function against eager.
EAGER_ATTR = "kope.eager"
KERNEL_ATTR = "kope.kernel"  # the body is a kernel from memory, not an outlined operator
# Glue between a model's operators (views, reshapes, an operator the backend leaves to ATen),
# written by `kope import`: not an operator, so never outlined, keyed or optimized.
GLUE_ATTR = "kope.glue"


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
    # The run invalidated `func`: find it again.
    funcs = [op for op in module.body.operations if op.operation.name == "func.func"]
    _canonical_order(funcs[0].operation)
    return module.operation.get_asm(enable_debug_info=False)


def _canonical_order(func: ir.Operation) -> None:
    """Order the entry block as its dataflow dictates, not as its producer happened to emit it.

    `canonicalize` keeps the order ops came in, and that order differs between producers of the
    same function: torch-mlir's importer and the outlining pass emit constants and the inits of
    a multi-result op in different orders. So: constants first, by type and value; then every
    other op in post-order of a walk from the returned values, operands in operand order.
    Only for functions on tensors: ops without memory effects can move as long as each still
    follows what it uses.
    """
    if not func.regions[0].blocks:
        return
    block = func.regions[0].blocks[0]
    ops = [op.operation for op in block.operations]
    terminator, body = ops[-1], ops[:-1]
    if any(_may_have_effects(op) for op in body):
        return
    constants = [op for op in body if op.name == "arith.constant"]
    top_level = {hash(op): op for op in body if op.name != "arith.constant"}
    order: list[ir.Operation] = []
    placed: set[int] = set()
    stack: list[tuple[ir.Operation, bool]] = [
        (owner, False) for owner in reversed(_producers(terminator, top_level))
    ]
    while stack:
        op, expanded = stack.pop()
        if hash(op) in placed:
            continue
        if expanded:
            placed.add(hash(op))
            order.append(op)
            continue
        stack.append((op, True))
        stack.extend((owner, False) for owner in reversed(_producers(op, top_level)))
    order += [op for op in top_level.values() if hash(op) not in placed]  # dead, if any survived
    for op in sorted(constants, key=lambda c: (str(c.results[0].type), str(c.attributes["value"]))):
        op.move_before(terminator)
    for op in order:
        op.move_before(terminator)


def _producers(op: ir.Operation, top_level: dict[int, ir.Operation]) -> list[ir.Operation]:
    """The entry-block ops whose results `op` uses, its regions included, in order of use."""
    found: list[ir.Operation] = []

    def note(user: ir.Operation) -> ir.WalkResult:
        for operand in user.operands:
            if isinstance(operand, ir.OpResult):
                owner = top_level.get(hash(operand.owner.operation))
                if owner is not None and owner not in found:
                    found.append(owner)
        return ir.WalkResult.ADVANCE

    op.walk(note)  # pre-order: the op's own operands first, then those used in its regions
    return found


def _may_have_effects(op: ir.Operation) -> bool:
    """Calls, and anything on memrefs, could read or write memory: their order is kept."""
    if op.name in ("func.call", "func.call_indirect"):
        return True
    types = [v.type for v in op.operands] + [r.type for r in op.results]
    return any(isinstance(t, ir.MemRefType) for t in types)


def workload_digest(canonical_text: str) -> str:
    """What the operator computes, independent of the target."""
    return hashlib.sha256(canonical_text.encode()).hexdigest()


def task_key(canonical_text: str, target_key: str) -> str:
    """The key of an operator on a target: sha256 of canonical IR and target key."""
    h = hashlib.sha256(canonical_text.encode())
    h.update(b"\0target\0" + target_key.encode())
    return h.hexdigest()
