"""A Task: one compute operator of an aten graph, imported alone to its reference lowering.

The reference lowering is torch-mlir's FX import of the single node (run in the lowering
worker, `kope.core.lowering`, where a crash costs only the operator), lowered to
linalg-on-tensors (`func.func @main`), in canonical form; its key is the sha256 of that text
and the target key (`kope.passes.keys`), so every path to the same function finds the same
kernel. A node torch-mlir lowers to something other than what eager computes (argmax on NaN)
is imported from KOPE's decomposition of it (`kope.core.decompositions.REFERENCE_DECOMPOSITIONS`),
and a node torch-mlir does not lower whole may be imported through its decomposition
(`make_task(..., decomposed=True)`): one function, one kernel, its eager call still the node's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten, tree_map
from torch_mlir import ir

from kope.core import decompositions, lowering
from kope.core.lowering import (
    ImportRequest,
    LoweringError,
    LoweringUnanswered,
    input_strides,
    isolated_import,
    op_name,
)
from kope.passes.analysis import mark_attention
from kope.passes.keys import (
    EAGER_ATTR,
    KEY_ATTR,
    LABEL_ATTR,
    canonicalize_module_text,
    task_key,
    workload_digest,
)
from kope.passes.pipeline import run_pipeline
from kope.targets.host import package_version
from kope.vocabulary.cache import cache_dir, digest, source_digest, write_atomically
from kope.vocabulary.kernels import FORM_MLIR, Kernel
from kope.vocabulary.specs import (
    InputRef,
    OpCall,
    Program,
    StepRef,
    TaskSpec,
    TensorSpec,
    eager_json,
)

# What marks a Task as attention: causal, the scale, q's, k's and v's strides where they are
# views of a larger tensor (None where contiguous), and whether its output is laid out heads
# inner (`kope.passes.analysis.mark_attention`).
Attended = tuple[bool, float, tuple[tuple[int, ...] | None, ...], bool]


@dataclass
class Task:
    """One operator (or a fused group of elementwise and row operators): the fx nodes it came
    from, its signature, reference lowering and key."""

    nodes: list[fx.Node]  # program order; the last produces the Task's outputs
    input_nodes: list[fx.Node]
    spec: TaskSpec
    payload: str  # canonical linalg-on-tensors module with func.func @main
    key: str
    workload: str

    @property
    def node(self) -> fx.Node:
        return self.nodes[-1]

    @property
    def op(self) -> str:
        """The ATen operator (or `+`-joined operators of a fused group); for an operator known
        only as IR, the op its label begins with (`linalg.matmul`)."""
        if self.spec.eager is None:
            return self.label.split("(", 1)[0]
        return self.spec.eager.op

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def reference(self) -> Kernel:
        """The reference lowering as a kernel: the oracle and baseline where a target runs it."""
        return Kernel(self.payload, FORM_MLIR)


def node_signature(
    node: fx.Node,
) -> tuple[list[fx.Node], OpCall, tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Input nodes (first-use order), the eager call, and input/output specs of a node."""
    inputs: list[fx.Node] = []

    def ref(value: Any) -> Any:
        if isinstance(value, fx.Node):
            if value not in inputs:
                inputs.append(value)
            return InputRef(inputs.index(value))
        return value

    args = tree_map(ref, tuple(node.args))
    # Inputs are numbered in the order the import graph lifts them: args, then kwargs as given.
    kwargs = tuple(sorted([(k, tree_map(ref, v)) for k, v in node.kwargs.items()]))
    call = OpCall(op_name(node.target), args, kwargs)
    in_specs = tuple(TensorSpec.of(n.meta["val"]) for n in inputs)
    out_specs = tuple(TensorSpec.of(v) for v in output_values(node))
    return inputs, call, in_specs, out_specs


def output_values(node: fx.Node) -> list[torch.Tensor]:
    val = node.meta["val"]
    return list(val) if isinstance(val, (tuple, list)) else [val]


def group_inputs(nodes: list[fx.Node]) -> list[fx.Node]:
    """The values a fused group reads from outside it, in the order its Program numbers them."""
    inside, inputs = set(nodes), []
    for node in nodes:
        for value in tree_flatten((tuple(node.args), list(node.kwargs.values())))[0]:
            if isinstance(value, fx.Node) and value not in inside and value not in inputs:
                inputs.append(value)
    return inputs


def group_signature(
    nodes: list[fx.Node],
) -> tuple[list[fx.Node], OpCall | Program, tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Like `node_signature`, for a fused group of single-output nodes computed as one kernel
    (in graph order; the last is the group's output)."""
    if len(nodes) == 1:
        return node_signature(nodes[0])
    position = {node: i for i, node in enumerate(nodes)}
    inputs = group_inputs(nodes)

    def ref(value: Any) -> Any:
        if isinstance(value, fx.Node):
            if value in position:
                return StepRef(position[value])
            return InputRef(inputs.index(value))
        return value

    steps = []
    for n in nodes:
        args = tree_map(ref, tuple(n.args))
        kwargs = tuple(sorted([(k, tree_map(ref, v)) for k, v in n.kwargs.items()]))
        steps.append(OpCall(op_name(n.target), args, kwargs))
    program = Program(tuple(steps), (StepRef(len(nodes) - 1),))
    in_specs = tuple(TensorSpec.of(n.meta["val"]) for n in inputs)
    out_specs = tuple(TensorSpec.of(v) for v in output_values(nodes[-1]))
    return inputs, program, in_specs, out_specs


def label_for(call: OpCall | Program, in_specs: tuple[TensorSpec, ...]) -> str:
    if isinstance(call, Program):
        return "fused(" + " → ".join(label_for(step, in_specs) for step in call.steps) + ")"

    def show(value: Any) -> str:
        if isinstance(value, StepRef):
            return "·"
        if isinstance(value, InputRef):
            return str(in_specs[value.index])
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(show(v) for v in value) + "]"
        if isinstance(value, torch.dtype):
            return str(value).removeprefix("torch.")
        return repr(value)

    parts = [show(a) for a in call.args] + [f"{k}={show(v)}" for k, v in call.kwargs]
    namespace, name, overload = call.op.split(".")
    head = f"{namespace}.{name}" + ("" if overload == "default" else f".{overload}")
    return f"{head}({', '.join(parts)})"


def eager_label(node: fx.Node) -> str:
    """A node left to ATen, labelled like a Task (its call with shapes); its op's name where
    a value has no shape to show."""
    try:
        _, call, in_specs, _ = node_signature(node)
        return label_for(call, in_specs)
    except Exception:  # a value with no static shape, or none at all
        return op_name(node.target) if hasattr(node.target, "_opname") else str(node.target)


def make_task(
    nodes: fx.Node | list[fx.Node],
    target_key: str,
    decomposed: bool = False,
    attention: Attended | None = None,
) -> Task:
    """Import a node (or a group of nodes fused into one kernel) and key it; raises
    LoweringError when torch-mlir cannot lower it. With `decomposed`, the node is imported
    through its decomposition, as one function; its eager call stays the node's own. With
    `attention` (causal, scale, the strides of q, k and v where they are views, the output
    heads inner), the function is marked as that attention
    (`kope.passes.analysis.mark_attention`), which its decomposition no longer says plainly."""
    group = nodes if isinstance(nodes, list) else [nodes]
    inputs, call, in_specs, out_specs = group_signature(group)
    label = label_for(call, in_specs)
    strides = input_strides(inputs)
    request = ImportRequest(call, in_specs, strides, decomposed)
    payload = reference_lowering(request, out_specs, label)
    if attention is not None:
        payload = mark_attention(payload, *attention)
    spec = TaskSpec(label, in_specs, out_specs, call, strides)
    return Task(
        group, inputs, spec, payload, task_key(payload, target_key), workload_digest(payload)
    )


def reference_lowering(
    request: ImportRequest, out_specs: tuple[TensorSpec, ...], label: str
) -> str:
    """The canonical reference lowering of the operator `request` describes, whose outputs are
    `out_specs`, imported in the lowering worker (`kope.core.lowering`).

    The import is a function of the ATen call, its specs and the toolchain alone, and costs
    tens of milliseconds per Task at every compile, so it is cached on disk
    (`kope.vocabulary.cache`), refusals and crashes too (an operator that killed the worker
    is not imported again in that form); a call without a JSON encoding is not cached, nor
    an import that got no answer (it may have met the machine's load)."""
    encoded = eager_json(request.call)
    path = None
    if encoded is not None:
        name = digest(
            json.dumps(encoded, sort_keys=True),
            repr((request.inputs, out_specs)),
            "decomposed" if request.decomposed else "whole",
            torch.__version__,
            package_version("torch-mlir"),
            source_digest(_IMPORT_SOURCES),
        )
        path = cache_dir("imports") / f"{name}.json"
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            entry = None
        if isinstance(entry, dict) and isinstance(entry.get("error"), str):
            raise LoweringError(entry["error"])
        if isinstance(entry, dict) and isinstance(entry.get("payload"), str):
            return entry["payload"]
    try:
        payload = isolated_import(request, label)
    except LoweringUnanswered:
        raise
    except LoweringError as err:
        if path is not None:
            write_atomically(path, json.dumps({"error": str(err)}).encode())
        raise
    if path is not None:
        write_atomically(path, json.dumps({"payload": payload}).encode())
    return payload


def node_lowering(node: fx.Node) -> str:
    """The canonical reference lowering of one node, as `make_task` imports it (cached,
    isolated); its function's arguments are the node's inputs in first-use order."""
    inputs, call, in_specs, out_specs = node_signature(node)
    request = ImportRequest(call, in_specs, input_strides(inputs), False)
    return reference_lowering(request, out_specs, label_for(call, in_specs))


# KOPE's code an import depends on: the importer and its isolation, the decompositions it
# imports instead of an operator, the pipelines, canonical form.
_IMPORT_SOURCES = (
    Path(__file__),
    Path(lowering.__file__),
    Path(decompositions.__file__),
    Path(canonicalize_module_text.__code__.co_filename),
    Path(run_pipeline.__code__.co_filename),
)


def task_function(task: Task, name: str, context: ir.Context) -> ir.Operation:
    """The Task's reference lowering as a function `@name` carrying the key the backend gives
    it (`kope.key`: the function is the very payload the backend keys, so the key is its own on
    every road), its label, and its ATen call as JSON (`kope.eager`, when it has one) so that
    `kope-optimize` times it against eager. The function is detached: append it to a module of
    `context`."""
    module = ir.Module.parse(task.payload, context)
    func = next(op.operation for op in module.body.operations if op.operation.name == "func.func")
    func.attributes["sym_name"] = ir.StringAttr.get(name, context)
    func.attributes[KEY_ATTR] = ir.StringAttr.get(task.key, context)
    func.attributes[LABEL_ATTR] = ir.StringAttr.get(task.label, context)
    eager = eager_json(task.spec.eager)
    if eager is not None:
        text = json.dumps(eager, sort_keys=True, separators=(",", ":"))
        func.attributes[EAGER_ATTR] = ir.StringAttr.get(text, context)
    func.detach_from_parent()  # outlives `module`, which owns it until now
    return func


def function_name(prefix: str, index: int, op: str) -> str:
    """`@<prefix><index>_<op>`: a readable symbol for an operator's function."""
    return f"{prefix}{index}_" + re.sub(r"[^A-Za-z0-9]+", "_", op).strip("_")[:48]


def tasks_module(tasks: Sequence[Task]) -> str:
    """The Tasks as one MLIR module for `kope-opt`: each Task's reference lowering as a function
    `@task<N>_<op>` (`task_function`)."""
    context = ir.Context()
    module = ir.Module.create(ir.Location.unknown(context))
    for index, task in enumerate(tasks):
        module.body.append(task_function(task, function_name("task", index, task.op), context))
    return module.operation.get_asm(enable_debug_info=False)
