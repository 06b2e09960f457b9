"""A Task: one compute operator of an aten graph, imported alone to its reference lowering.

The reference lowering is torch-mlir's FX import of the single node, lowered to
linalg-on-tensors (`func.func @main`), in canonical form; its key is the sha256 of that text
and the target key (`kope.passes.keys`), so every path to the same function finds the same
kernel. A node torch-mlir lowers to something other than what eager computes (argmax on NaN)
is imported from KOPE's decomposition of it (`kope.decompositions.REFERENCE_DECOMPOSITIONS`),
and a node torch-mlir does not lower whole may be imported through its decomposition
(`make_task(..., decomposed=True)`): one function, one kernel, its eager call still the node's.
"""

from __future__ import annotations

import json
import logging
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten, tree_map
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d
from torch_mlir.extras.fx_importer import FxImporter

from kope import decompositions
from kope.decompositions import REFERENCE_DECOMPOSITIONS
from kope.errors import first_line
from kope.passes.keys import (
    EAGER_ATTR,
    KEY_ATTR,
    LABEL_ATTR,
    canonicalize_module_text,
    task_key,
    workload_digest,
)
from kope.passes.pipeline import PipelineError, run_pipeline
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

log = logging.getLogger("kope.compiler")

# torch-mlir's own path from an imported FX graph to linalg-on-tensors.
IMPORT_PIPELINE = [
    "func.func(torch-match-quantized-custom-ops)",
    "torchdynamo-export-to-torch-backend-pipeline",
    "torch-backend-to-linalg-on-tensors-backend-pipeline{allow-non-finites=true}",
]


class LoweringError(Exception):
    """torch-mlir could not import or lower an operator."""


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


def op_name(target: Any) -> str:
    """`aten.mm.default` for an OpOverload."""
    return f"{target.namespace}.{target._opname}.{target._overloadname}"


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


def group_graph(nodes: list[fx.Node]) -> fx.GraphModule:
    """A graph holding `nodes` alone: outside arguments become placeholders, the last node's
    outputs the graph's outputs (a tuple)."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    placeholders = 0

    def lift(value: Any) -> Any:
        nonlocal placeholders
        if isinstance(value, fx.Node):
            if value not in env:
                ph = graph.placeholder(f"in{placeholders}")
                placeholders += 1
                ph.meta["val"] = value.meta["val"]
                env[value] = ph
            return env[value]
        return value

    for node in nodes:
        assert callable(node.target), node
        args = tree_map(lift, tuple(node.args))
        kwargs = tree_map(lift, dict(node.kwargs))
        copy = graph.call_function(node.target, args, kwargs)
        copy.meta["val"] = node.meta["val"]
        env[node] = copy
    node, call = nodes[-1], env[nodes[-1]]
    if isinstance(node.meta["val"], (tuple, list)):
        outs = []
        for i, v in enumerate(node.meta["val"]):
            item = graph.call_function(operator.getitem, (call, i))
            item.meta["val"] = v
            outs.append(item)
        graph.output(tuple(outs))
    else:
        graph.output((call,))
    return fx.GraphModule(torch.nn.Module(), graph)


def exact_graph(gm: fx.GraphModule, decomposed: bool = False) -> fx.GraphModule:
    """`gm` with the nodes torch-mlir lowers wrongly traced through their decompositions
    (`REFERENCE_DECOMPOSITIONS`), and if `decomposed` every node with a decomposition
    (`kope.decompositions.decomposition_table`, as torch-mlir's own import does); `gm` itself
    when it has none."""
    table = REFERENCE_DECOMPOSITIONS
    if decomposed:
        table = {**decompositions.decomposition_table(fast_paths=False), **table}
    if not any(n.target in table for n in gm.graph.nodes):
        return gm
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = detect_fake_mode(vals)
    if fake_mode is None:
        return make_fx(gm, table, tracing_mode="fake")(*vals)
    with fake_mode:
        return make_fx(gm, table)(*vals)


def import_group(nodes: list[fx.Node], decomposed: bool = False) -> str:
    """The reference lowering of a node (or fused group): linalg-on-tensors text (`@main`);
    if `decomposed`, imported through its decomposition (`exact_graph`)."""
    node = nodes[-1]
    try:
        gm = exact_graph(group_graph(nodes), decomposed)
    except Exception as err:  # a decomposition can refuse arguments it does not handle
        raise LoweringError(
            f"tracing the exact decomposition of {op_name(node.target)} failed: {first_line(err)}"
        ) from None
    context = ir.Context()
    context.enable_multithreading(False)
    torch_d.register_dialect(context)
    importer = FxImporter(context=context)
    try:
        importer.import_stateless_graph(gm.graph, func_name="main")
    except Exception as err:  # the importer raises many kinds on unsupported nodes
        raise LoweringError(f"FX import failed: {first_line(err)}") from None
    module = importer.module
    try:
        run_pipeline(module, list(IMPORT_PIPELINE), description=f"import {op_name(node.target)}")
    except PipelineError as err:
        diagnostics = [d for d in err.diagnostics if d] or [str(err).splitlines()[0]]
        raise LoweringError(diagnostics[0].split(": error: ", 1)[-1][:300]) from None
    _drop_foreign_asserts(module.operation)
    return module.operation.get_asm(enable_debug_info=False)


# Runtime checks torch-mlir's lowering adds that PyTorch does not make, by their message.
# `aten.reciprocal` (and so batch norm's 1 / sqrt(var + eps)) asserts a nonzero divisor, and a
# NaN fails the check too; eager gives inf and NaN. Compiled, the assert aborts the process:
# every Task holding a reciprocal crashed its worker on the verification's edge trials and
# ran eagerly. Without it the lowering computes what eager does. Checks that guard memory
# (an index in bounds) are PyTorch's own errors too and stay.
_FOREIGN_ASSERTS = frozenset({"unimplemented: tensor with zero element"})


def _drop_foreign_asserts(root: ir.Operation) -> None:
    """Drop `_FOREIGN_ASSERTS`; raise LoweringError for an assert that always fails (the
    lowering's own "unimplemented: ..." for this shape), which would abort every run."""
    found: list[ir.Operation] = []
    failing: list[str] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name != "cf.assert":
            return ir.WalkResult.ADVANCE
        message = ir.StringAttr(op.attributes["msg"]).value
        if message in _FOREIGN_ASSERTS:
            found.append(op)
        elif _always_false(op.operands[0]):
            failing.append(message)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    if failing:
        # adaptive_avg_pool1d of 299 into 10: "unimplemented: only support cases with fixed
        # stride size"; the worker that ran it was killed by SIGABRT on every trial.
        raise LoweringError(f"the lowering always fails its own check: {failing[0][:200]}")
    for op in found:
        op.erase()  # no results; the condition it read goes with `canonicalize`


def _always_false(condition: ir.Value) -> bool:
    """Whether `condition` is the constant false (an OpView or an Operation owns it)."""
    owner = getattr(condition.owner, "operation", condition.owner)
    if not isinstance(owner, ir.Operation) or owner.name != "arith.constant":
        return False
    value = owner.attributes["value"]
    return isinstance(value, ir.BoolAttr) and not value.value


def make_task(nodes: fx.Node | list[fx.Node], target_key: str, decomposed: bool = False) -> Task:
    """Import a node (or a group of nodes fused into one kernel) and key it; raises
    LoweringError when torch-mlir cannot lower it. With `decomposed`, the node is imported
    through its decomposition, as one function; its eager call stays the node's own."""
    group = nodes if isinstance(nodes, list) else [nodes]
    inputs, call, in_specs, out_specs = group_signature(group)
    payload = reference_lowering(group, call, in_specs, out_specs, decomposed)
    spec = TaskSpec(label_for(call, in_specs), in_specs, out_specs, call)
    return Task(
        group, inputs, spec, payload, task_key(payload, target_key), workload_digest(payload)
    )


def reference_lowering(
    group: list[fx.Node],
    call: OpCall | Program,
    in_specs: tuple[TensorSpec, ...],
    out_specs: tuple[TensorSpec, ...],
    decomposed: bool = False,
) -> str:
    """The canonical reference lowering of `group`, whose ATen call and specs are given (if
    `decomposed`, imported through its decomposition).

    The import is a function of the ATen call, its specs and the toolchain alone, and costs
    tens of milliseconds per Task at every compile, so it is cached on disk
    (`kope.vocabulary.cache`), failures too; a call without a JSON encoding is not cached."""
    encoded = eager_json(call)
    path = None
    if encoded is not None:
        name = digest(
            json.dumps(encoded, sort_keys=True),
            repr((in_specs, out_specs)),
            "decomposed" if decomposed else "whole",
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
        payload = _imported(group, decomposed)
    except LoweringError as err:
        if path is not None:
            write_atomically(path, json.dumps({"error": str(err)}).encode())
        raise
    if path is not None:
        write_atomically(path, json.dumps({"payload": payload}).encode())
    return payload


# KOPE's code an import depends on: the importer's use here, the decompositions it imports
# instead of an operator, the pipelines, canonical form.
_IMPORT_SOURCES = (
    Path(__file__),
    Path(decompositions.__file__),
    Path(canonicalize_module_text.__code__.co_filename),
    Path(run_pipeline.__code__.co_filename),
)


def _imported(group: list[fx.Node], decomposed: bool) -> str:
    try:
        return canonicalize_module_text(import_group(group, decomposed))
    except ir.MLIRError as err:
        # The lowering left ops outside linalg-on-tensors that no target builds (sort and topk
        # become torch-mlir's own `tm_tensor` dialect): the node runs eagerly.
        detail = str(err).splitlines()
        raise LoweringError(
            f"its lowering is not plain linalg-on-tensors: {_unplaced(detail[1])[:200]}"
            if len(detail) > 1
            else first_line(err)
        ) from None


def _unplaced(diagnostic: str) -> str:
    """An MLIR diagnostic without its place in a module the user never sees
    (`error: "-":8:12: Dialect ...` -> `Dialect ...`)."""
    return re.sub(r'^\s*(?:error: )?"-":\d+:\d+:\s*', "", diagnostic).strip()


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
