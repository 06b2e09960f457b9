"""`kope-outline-operators`: one private function per compute operator, tagged with its key.

Each linalg operator (with the producers of its init tensors: `tensor.empty`, `linalg.fill`
and the constants they use) moves into its own `func.func private @kope_op_<n>`, carrying
`kope.key` (the key the backend computes for the identical function) and `kope.label`;
the operator is replaced by a `func.call`. Functions already tagged are left alone, so the
pass is idempotent, and so are kernels `kope-apply-kernels` put in (`kope.kernel`) and the glue
between a model's operators that `kope import` writes (`kope.glue`): a module `kope import`
wrote is already cut, by the backend's partitioner, and passes through unchanged.

On IR from elsewhere (torch-mlir's own import of a whole model, a hand-written file) the cut
is this pass's own, one function per linalg operator: an operator the backend fuses with its
neighbours, or lowers with its weights as inputs, gets another key there
(`test/test_keys_agree.py` lists where and why).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch_mlir import ir

from kope.passes.base import ModulePass, check_target, defining_op
from kope.passes.keys import (
    GLUE_ATTR,
    KERNEL_ATTR,
    KEY_ATTR,
    LABEL_ATTR,
    canonical_function,
    task_key,
)
from kope.vocabulary.registry import DEFAULT_TARGET

_NOT_OPERATORS = {"linalg.yield", "linalg.index"}
_INIT_PRODUCERS = {"tensor.empty", "linalg.fill", "arith.constant"}


def is_operator(op: ir.Operation) -> bool:
    return op.name.startswith("linalg.") and op.name not in _NOT_OPERATORS


def operator_label(op: ir.Operation) -> str:
    operands = ", ".join(_short_type(v.type) for v in op.operands)
    results = ", ".join(_short_type(r.type) for r in op.results)
    return f"{op.name}({operands}) -> {results}"


def _short_type(t: ir.Type) -> str:
    if isinstance(t, ir.ShapedType):
        return "x".join([*(str(d) for d in t.shape), str(t.element_type)])
    return str(t)


@dataclass
class OutlineOperators(ModulePass):
    """Split every function's linalg operators into keyed private functions."""

    name = "kope-outline-operators"
    summary = "Outline each compute operator into a private function tagged with its key"

    target: str = field(
        default=DEFAULT_TARGET, metadata={"help": "the target whose key goes into kope.key"}
    )

    def __post_init__(self) -> None:
        check_target(self.name, self.target)

    def run(self, module: ir.Operation) -> None:
        from kope.vocabulary.registry import target_key as key_of_target

        target_key = key_of_target(self.target)
        body = module.regions[0].blocks[0]
        funcs = [
            op.operation
            for op in body.operations
            if op.operation.name == "func.func"
            and KEY_ATTR not in op.operation.attributes
            and KERNEL_ATTR not in op.operation.attributes
            and GLUE_ATTR not in op.operation.attributes
        ]
        counter = _Counter(body)
        for func in funcs:
            if not func.regions[0].blocks:
                continue  # a declaration
            for op in _operators_in(func):
                self._outline(op, module, counter, target_key)

    def _outline(
        self, op: ir.Operation, module: ir.Operation, counter: _Counter, target_key: str
    ) -> None:
        ctx = module.context
        inits = _init_chain(op)
        inside = {id_of(o) for o in inits} | {id_of(op)}
        args: list[ir.Value] = []
        for value in _external_operands(op, inits, inside):
            if not any(value == a for a in args):
                args.append(value)
        loc = op.location
        name = counter.next_name()
        arg_types = [a.type for a in args]
        # Only the results something uses, as the backend's Task of the same operator returns
        # only the outputs its graph uses (e.g. amax computes an unused argmax beside it).
        used = [i for i, r in enumerate(op.results) if not _unused(r)]
        returned = used or list(range(len(op.results)))
        result_types = [op.results[i].type for i in returned]
        ftype = ir.FunctionType.get(arg_types, result_types, ctx)
        with ctx, loc:
            func = _new_func(module, name, ftype)
            block = func.regions[0].blocks.append(*arg_types)
            mapping: list[tuple[ir.Value, ir.Value]] = list(zip(args, block.arguments, strict=True))
            with ir.InsertionPoint(block):
                for producer in [*inits, op]:
                    clone = producer.clone().operation
                    for old, new in mapping:
                        _replace_in(clone, old, new)
                    mapping += list(zip(producer.results, clone.results, strict=True))
                ir.Operation.create("func.return", operands=[clone.results[i] for i in returned])
            func.attributes["sym_visibility"] = ir.StringAttr.get("private")
            key = task_key(canonical_function(func), target_key)
            func.attributes[KEY_ATTR] = ir.StringAttr.get(key)
            func.attributes[LABEL_ATTR] = ir.StringAttr.get(operator_label(op))
            with ir.InsertionPoint(op):
                call = ir.Operation.create(
                    "func.call",
                    results=result_types,
                    operands=args,
                    attributes={"callee": ir.FlatSymbolRefAttr.get(name)},
                )
        for index, new in zip(returned, call.results, strict=True):
            op.results[index].replace_all_uses_with(new)
        op.erase()
        for producer in reversed(inits):
            if all(_unused(r) for r in producer.results):
                producer.erase()


class _Counter:
    """Fresh `@kope_op_<n>` names that do not collide with existing symbols."""

    def __init__(self, body: ir.Block):
        self.taken = {
            ir.StringAttr(op.attributes["sym_name"]).value
            for op in body.operations
            if "sym_name" in op.attributes
        }
        self.n = 0

    def next_name(self) -> str:
        while f"kope_op_{self.n}" in self.taken:
            self.n += 1
        name = f"kope_op_{self.n}"
        self.taken.add(name)
        return name


def id_of(op: ir.Operation) -> int:
    return hash(op)


def _operators_in(func: ir.Operation) -> list[ir.Operation]:
    """Top-level linalg operators of a function, skipping pure init producers."""
    ops: list[ir.Operation] = []
    for block in func.regions[0].blocks:
        for view in block.operations:
            op = view.operation
            if is_operator(op) and not _only_feeds_inits(op):
                ops.append(op)
    return ops


def _only_feeds_inits(op: ir.Operation) -> bool:
    """A `linalg.fill` whose every use is as the init (outs) of a linalg operator."""
    if op.name != "linalg.fill":
        return False
    for result in op.results:
        for use in result.uses:
            user = use.owner
            if not is_operator(user) or not _is_init_operand(user, use.operand_number):
                return False
    return bool(list(op.results[0].uses))


def _is_init_operand(op: ir.Operation, index: int) -> bool:
    # Destination-style ops on tensors have one init operand per result, at the end.
    return index >= len(op.operands) - len(op.results)


def _init_chain(op: ir.Operation) -> list[ir.Operation]:
    """Producers of `op`'s init operands (and the constants they use), in program order."""
    chain: list[ir.Operation] = []
    seen: set[int] = set()

    def visit(value: ir.Value) -> None:
        producer = defining_op(value)
        if producer is None or producer.name not in _INIT_PRODUCERS or id_of(producer) in seen:
            return
        for operand in producer.operands:
            visit(operand)
        seen.add(id_of(producer))
        chain.append(producer)

    for index, operand in enumerate(op.operands):
        if _is_init_operand(op, index):
            visit(operand)
    for value in _captured_values(op):
        visit(value)
    return chain


def _captured_values(op: ir.Operation) -> list[ir.Value]:
    """Values used inside `op`'s regions but defined outside it."""
    captured: list[ir.Value] = []

    def walk(inner: ir.Operation) -> ir.WalkResult:
        for operand in inner.operands:
            owner = defining_op(operand)
            if owner is not None:
                if not _is_inside(owner, op):
                    captured.append(operand)
            elif isinstance(operand, ir.BlockArgument):
                parent = operand.owner.owner
                if not _is_inside(parent, op):
                    captured.append(operand)
        return ir.WalkResult.ADVANCE

    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                inner.operation.walk(walk)
    return captured


def _is_inside(candidate: ir.Operation, ancestor: ir.Operation) -> bool:
    current: ir.Operation | None = candidate
    while current is not None:
        if current == ancestor:
            return True
        parent = current.parent
        current = parent.operation if parent is not None else None
    return False


def _external_operands(
    op: ir.Operation, inits: list[ir.Operation], inside: set[int]
) -> list[ir.Value]:
    values: list[ir.Value] = []
    for producer in [*inits, op]:
        for operand in producer.operands:
            owner = defining_op(operand)
            if owner is None or id_of(owner) not in inside:
                values.append(operand)
    for value in _captured_values(op):
        owner = defining_op(value)
        if owner is None or id_of(owner) not in inside:
            values.append(value)
    return values


def _replace_in(clone: ir.Operation, old: ir.Value, new: ir.Value) -> None:
    clone.replace_uses_of_with(old, new)

    def walk(inner: ir.Operation) -> ir.WalkResult:
        inner.replace_uses_of_with(old, new)
        return ir.WalkResult.ADVANCE

    clone.walk(walk)


def _unused(value: ir.Value) -> bool:
    return not list(value.uses)


def _new_func(module: ir.Operation, name: str, ftype: ir.FunctionType) -> ir.Operation:
    body = module.regions[0].blocks[0]
    with ir.InsertionPoint(body):
        return ir.Operation.create(
            "func.func",
            regions=1,
            attributes={
                "sym_name": ir.StringAttr.get(name),
                "function_type": ir.TypeAttr.get(ftype),
            },
        )
