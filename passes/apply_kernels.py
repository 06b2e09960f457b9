"""`kope-apply-kernels`: give each outlined operator the best verified kernel memory knows for it.

For every function carrying `kope.key` (see `kope-outline-operators`), the pass asks the
experience store for the best verified attempt of that key. When the winner is an agent kernel
whose artifact is a tensor-level module (`func.func @main`, optionally with its transform
schedule `@__transform_main`), the schedule is applied to a copy of the artifact exactly as
`kope-lower-cpu` would (`kope-apply-schedule`), and the function's body is replaced by the
scheduled `@main`. The function keeps its name, visibility, key and label, and gains
`kope.kernel = "agent"`, `kope.attempt` and `kope.artifact`, so a second run leaves it alone.
A kernel that takes an input in another layout (a matmul's B in panels) keeps the function's
signature through a new body that lays the argument out and calls the kernel.

Left untouched: operators memory does not know, operators whose winner is eager ATen or the
reference lowering (the outlined body *is* the reference lowering). Left untouched with a
warning: a function whose `kope.key` is not its key on `target` (outlined for another target,
or edited since), an artifact that is missing, does not parse, holds only a memref-level
`@kope_kernel` (destination-passing: it cannot stand in for a function on tensors), has a
schedule that fails, or has another signature than the function.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from torch_mlir import ir

from kope.memory import AttemptRecord, ExperienceStore
from kope.memory.standing import winner
from kope.passes.abi import ENTRY, PAYLOAD, argument_layouts, find_func, function_type
from kope.passes.base import ModulePass, PassError, check_target
from kope.passes.experience import (
    STORE_HELP,
    function_key,
    open_store,
    outlined_functions,
    symbol_name,
)
from kope.passes.keys import KERNEL_ATTR, canonical_function, task_key
from kope.passes.schedule import ApplySchedule
from kope.vocabulary.kernels import FORM_MLIR
from kope.vocabulary.layouts import LayoutError, layout_strides, panel_geometry
from kope.vocabulary.registry import DEFAULT_TARGET

log = logging.getLogger("kope.passes")

ATTEMPT_ATTR = "kope.attempt"
ARTIFACT_ATTR = "kope.artifact"
AGENT = "agent"  # kope.memory.schema.SOURCE_AGENT: the only source with a kernel to apply


class _Skip(Exception):
    """Why one function keeps its body; reported as a warning at the function."""


@dataclass
class ApplyKernels(ModulePass):
    """Replace each keyed function's body by the best verified agent kernel for its key."""

    name = "kope-apply-kernels"
    summary = "Replace each keyed operator's body by the best verified kernel in the store"

    store: str = field(default="", metadata={"help": STORE_HELP})
    target: str = field(
        default=DEFAULT_TARGET, metadata={"help": "the target the kernels were verified on"}
    )

    def __post_init__(self) -> None:
        check_target(self.name, self.target)

    def run(self, module: ir.Operation) -> None:
        from kope.vocabulary.registry import target_key as key_of_target

        target_key = key_of_target(self.target)
        store = open_store(self.store, self.name)
        try:
            for func in outlined_functions(self, module):
                if KERNEL_ATTR in func.attributes:
                    continue  # replaced by an earlier run: its body no longer hashes to its key
                try:
                    self._apply(module, func, store, target_key)
                except _Skip as why:
                    self.warn(func.location, f"@{symbol_name(func)} left untouched: {why}")
        finally:
            store.close()

    def _apply(
        self, module: ir.Operation, func: ir.Operation, store: ExperienceStore, target_key: str
    ) -> None:
        key = function_key(func)
        # A kernel is only right for the computation it was verified on: recompute the key
        # rather than trust an attribute that may have outlived an edit of the body.
        if task_key(canonical_function(func), target_key) != key:
            raise _Skip(
                f"its kope.key {key[:12]}... is not the key of its body on target "
                f"'{self.target}' (outlined for another target, or changed since)"
            )
        best = winner(store.attempts(key)).best
        if best is None or best.source != AGENT:
            log.debug("@%s: %s", symbol_name(func), "unknown" if best is None else best.source)
            return
        if best.artifact is None:
            raise _Skip(f"attempt {best.id} won but recorded no kernel text")
        if best.form != FORM_MLIR:
            # A Triton kernel is Python that its target's launcher runs on the device; no MLIR
            # body on the host can stand for it.
            raise _Skip(
                f"its winner, attempt {best.id}, is a {best.form} kernel, which runs through the "
                f"{self.target} target's launcher (torch.compile(backend='kope') with "
                f"target={self.target!r}, or a kernel pack: `kope export --target {self.target}`)"
                ", not as an MLIR body"
            )
        text = store.get_artifact(best.artifact)
        if text is None:
            raise _Skip(
                f"the kernel text {best.artifact[:12]}... of attempt {best.id} "
                f"is missing or damaged"
            )
        kernel = self._scheduled_payload(text, best, func.context)
        _take_operator_layouts(kernel.operation, func, best)
        payload = find_func(kernel.operation, PAYLOAD)
        assert payload is not None
        want, got = function_type(func), function_type(payload)
        if want != got:
            raise _Skip(f"attempt {best.id}'s @{PAYLOAD} has type {got}, the function has {want}")
        log.info(
            "@%s (%s): applying attempt %s, %s x eager",
            symbol_name(func),
            key[:12],
            best.id,
            best.speedup_vs_eager,
        )
        _replace(module, func, kernel.operation, best)

    def _scheduled_payload(self, text: str, best: AttemptRecord, context: ir.Context) -> ir.Module:
        """The artifact parsed afresh, its schedule applied and erased."""
        try:
            kernel = ir.Module.parse(text, context)
        except ir.MLIRError as err:
            detail = "; ".join(d.message for d in err.error_diagnostics) or str(err)
            raise _Skip(f"the kernel of attempt {best.id} does not parse: {detail}") from None
        if find_func(kernel.operation, PAYLOAD) is None:
            if find_func(kernel.operation, ENTRY) is not None:
                raise _Skip(
                    f"attempt {best.id} is a memref-level @{ENTRY} in destination-passing form, "
                    f"which cannot replace a function on tensors"
                )
            raise _Skip(f"the kernel of attempt {best.id} has no @{PAYLOAD}")
        try:
            ApplySchedule().run(kernel.operation)
        except PassError as err:
            raise _Skip(f"attempt {best.id}: {err}") from None
        return kernel


def _take_operator_layouts(kernel: ir.Operation, func: ir.Operation, best: AttemptRecord) -> None:
    """Give a kernel whose `@main` takes inputs in another layout (`kope.vocabulary.layouts`)
    the function's own signature: the kernel becomes a helper, and a new `@main` lays those
    arguments out and calls it.

    A function on tensors has no weight to keep packed between calls, so here the panels are
    made on every call (as a library packs inside every call); the backend's call sites pack a
    weight once."""
    payload = find_func(kernel, PAYLOAD)
    assert payload is not None
    layouts = argument_layouts(kernel)
    if not layouts:
        return
    inner, outer = function_type(payload), function_type(func)
    if max(layouts) >= len(inner.inputs):
        raise _Skip(
            f"attempt {best.id} writes a result in a layout of its own, which a function on "
            "tensors cannot return"
        )
    if len(inner.inputs) != len(outer.inputs) or list(inner.results) != list(outer.results):
        raise _Skip(f"attempt {best.id}'s @{PAYLOAD} has type {inner}, the function has {outer}")
    helper = f"{PAYLOAD}_laid_out"
    lines = ["%zero = arith.constant 0.0 : f32"]
    args = []
    for index, (want, have) in enumerate(zip(inner.inputs, outer.inputs, strict=True)):
        if index not in layouts:
            args.append(f"%arg{index}")
            continue
        if layout_strides(layouts[index]) is not None:
            raise _Skip(
                f"attempt {best.id} reads input {index} where a view of it lies (a strided "
                "layout), which a function on tensors does not pass"
            )
        try:
            width, count = panel_geometry(layouts[index])
        except LayoutError as err:
            raise _Skip(f"attempt {best.id}, input {index}: {err}") from None
        k, n = have.shape
        count = count or (n // width if n % width == 0 else 0)
        if list(want.shape) != [count, k, width] or count * width < n:
            raise _Skip(f"attempt {best.id} takes input {index} as {want}, the function has {have}")
        value = f"%arg{index}"
        if count * width > n:
            lines += [
                f"%pad{index} = tensor.pad {value} low[0, 0] high[0, {count * width - n}] {{",
                "^bb0(%i: index, %j: index):",
                "  tensor.yield %zero : f32",
                f"}} : {have} to tensor<{k}x{count * width}xf32>",
            ]
            value = f"%pad{index}"
        lines += [
            f"%split{index} = tensor.expand_shape {value} [[0], [1, 2]] output_shape "
            f"[{k}, {count}, {width}] : tensor<{k}x{count * width}xf32> into "
            f"tensor<{k}x{count}x{width}xf32>",
            f"%empty{index} = tensor.empty() : {want}",
            f"%panels{index} = linalg.transpose ins(%split{index} : "
            f"tensor<{k}x{count}x{width}xf32>) outs(%empty{index} : {want}) "
            "permutation = [1, 0, 2]",
        ]
        args.append(f"%panels{index}")
    results = [str(t) for t in inner.results]
    lines.append(
        f"%r:{len(results)} = func.call @{helper}({', '.join(args)}) : {inner}"
        if results
        else f"func.call @{helper}({', '.join(args)}) : {inner}"
    )
    lines.append(
        f"return {', '.join(f'%r#{i}' for i in range(len(results)))} : {', '.join(results)}"
        if results
        else "return"
    )
    params = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(outer.inputs))
    signature = f"({params}) -> ({', '.join(results)})"
    declared = ", ".join(str(t) for t in inner.inputs)
    text = (
        f"func.func private @{helper}({declared}) -> ({', '.join(results)})\n"
        f"func.func @{PAYLOAD}{signature} {{\n  " + "\n  ".join(lines) + "\n}"
    )
    parsed = ir.Module.parse(text, kernel.context)  # alive until its op has moved out
    payload.attributes["sym_name"] = ir.StringAttr.get(helper, kernel.context)
    kernel.regions[0].blocks[0].append(parsed.body.operations[1].operation)


def _replace(
    module: ir.Operation, func: ir.Operation, kernel: ir.Operation, best: AttemptRecord
) -> None:
    """Put the kernel's `@main` in place of `func` (its symbol and attributes), helpers after."""
    name = symbol_name(func)
    payload = find_func(kernel, PAYLOAD)
    assert payload is not None
    taken = {
        symbol_name(op.operation)
        for op in module.regions[0].blocks[0].operations
        if "sym_name" in op.operation.attributes
    }
    helpers: list[ir.Operation] = []
    for op in list(kernel.regions[0].blocks[0].operations):
        op = op.operation
        if op == payload:
            continue
        if "sym_name" in op.attributes:
            # A helper of the kernel (a function, a global): private, under a fresh name.
            old, new, n = symbol_name(op), f"{name}_{symbol_name(op)}", 0
            while new in taken:
                n += 1
                new = f"{name}_{old}_{n}"
            taken.add(new)
            ir.SymbolTable.replace_all_symbol_uses(old, new, kernel)
            op.attributes["sym_name"] = ir.StringAttr.get(new)
            op.attributes["sym_visibility"] = ir.StringAttr.get("private")
        if op.name == "func.func":
            _mark(op, best)  # part of the kernel: not an operator to outline
        helpers.append(op)
    for attr in list(payload.attributes):
        del payload.attributes[attr]
    for attr in list(func.attributes):
        payload.attributes[attr] = func.attributes[attr]
    _mark(payload, best)
    payload.move_before(func)
    for op in reversed(helpers):  # after the function they serve, which reads first
        op.move_after(payload)
    func.erase()


def _mark(func: ir.Operation, best: AttemptRecord) -> None:
    """Say where a function's body came from."""
    func.attributes[KERNEL_ATTR] = ir.StringAttr.get(best.source)
    func.attributes[ATTEMPT_ATTR] = ir.StringAttr.get(best.id)
    func.attributes[ARTIFACT_ATTR] = ir.StringAttr.get(best.artifact or "")
