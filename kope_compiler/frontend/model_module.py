"""A whole model as one MLIR module, cut into operators by the backend's own partitioner.

`kope import MODEL` writes this module. The model is traced as `torch.compile(backend="kope")`
traces it (dynamo, the same aten inference export, the same rewrites and partition, fused fast
paths taken apart as `kope precompile` takes them), and each part becomes a function:

- every Task is `@task<N>_<op>`, its reference lowering exactly as the backend imports and
  keys it, with `kope.key`, `kope.label` and its ATen call (`kope.eager`): the same function
  text, so the same key, on both roads;
- every other node (views, reshapes, an operator the backend leaves to ATen, such as the
  `scaled_dot_product_attention` the attention rewrite makes) is `@glue<N>_<op>`, imported
  alone by the same torch-mlir path, marked `kope.glue` and never keyed: KOPE optimizes
  Tasks, not glue;
- `@main` takes the model's inputs and returns its outputs: weights and buffers are constants
  (and so are the values computed from them alone, as the folded batch norm), passed to the
  functions as the backend passes them to its kernels, one `func.call` per site.

`kope-outline-operators` leaves keyed and glue functions alone, so on this module
`kope-opt --pass-pipeline="builtin.module(kope-outline-operators,kope-optimize{...},
kope-apply-kernels{...},kope-lower-cpu)"` optimizes, applies and lowers exactly the Tasks the
backend runs; the lowered `@main` runs under the ExecutionEngine.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.utils._pytree import tree_map
from torch_mlir import ir
from torch_mlir.dialects import arith, func

from kope.core.errors import ModelLoadError
from kope.core.lowering import LoweringError, op_name
from kope.core.task import Task, function_name, node_lowering, task_function
from kope.frontend.backend import aten_inference_graph
from kope.frontend.partition import partition
from kope.passes.keys import GLUE_ATTR
from kope.targets.base import Target
from kope.vocabulary.specs import MLIR_ELEMENTS, dtype_name

GRAPH_ATTR = "kope.graph"


class ModelImportError(ModelLoadError):
    """The model cannot be written as one function on values."""


@dataclass
class ModelModule:
    """A model as one module: its text, the distinct Tasks it calls (in call order), and how
    many glue functions and constants it holds."""

    text: str
    tasks: list[Task] = field(default_factory=list)
    glue: int = 0
    constants: int = 0


def capture(model: torch.nn.Module, inputs: Sequence[Any]) -> tuple[fx.GraphModule, list[Any]]:
    """The one dynamo graph of `model` on `inputs`, with the real values it is called with
    (weights and buffers among them, as dynamo lifts them)."""
    graphs: list[tuple[fx.GraphModule, list[Any]]] = []

    def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(model, backend=backend, dynamic=False)(*inputs)
    except Exception as err:
        raise ModelLoadError(f"tracing the model failed: {type(err).__name__}: {err}") from err
    finally:
        torch._dynamo.reset()
    if len(graphs) != 1:
        raise ModelImportError(
            f"dynamo captured the model as {len(graphs)} graphs (graph breaks); one module "
            "needs one graph: `torch._dynamo.explain(model)(*inputs)` shows the breaks. "
            "`kope import --tasks` writes the Tasks of every graph"
        )
    return graphs[0]


def model_module(model: torch.nn.Module, inputs: Sequence[Any], target: Target) -> ModelModule:
    """`model` on `inputs` as one module whose `@main` calls the backend's Tasks (see above)."""
    gm, values = capture(model.eval(), inputs)
    try:
        aten = aten_inference_graph(gm, values)
    except Exception as err:
        raise ModelImportError(
            f"the model's graph is not a function on values ({type(err).__name__}: "
            f"{str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}): it "
            "mutates an input or returns an alias of one. `kope import --tasks` writes its Tasks"
        ) from None
    placeholders = [n for n in aten.graph.nodes if n.op == "placeholder"]
    constants = {
        node: value
        for node, value in zip(placeholders, values, strict=True)
        if not any(value is x for x in inputs)
    }
    # No oneDNN fusions: a library call has no linalg form, and the module lowers whole.
    part = partition(aten, target, fuse=True, fast_paths=True, onednn=False)
    return _Composer(aten, placeholders, constants).compose(part.tasks)


class _Composer:
    """Writes `@main` node by node: Task calls, glue calls and constants."""

    def __init__(
        self,
        gm: fx.GraphModule,
        placeholders: list[fx.Node],
        constants: dict[fx.Node, Any],
    ):
        self.gm = gm
        self.placeholders = placeholders
        self.known = dict(constants)  # node -> its value, for nodes computed from weights alone
        self.context = ir.Context()
        self.context.enable_multithreading(False)
        self.module = ir.Module.create(ir.Location.unknown(self.context))
        self.functions: dict[str, ir.Operation] = {}  # key or glue text -> function
        self.tasks: list[Task] = []
        self.glue = 0
        self.values: dict[fx.Node, Any] = {}  # node -> ir.Value, or a tuple of them
        self.constant_values: dict[int, ir.Value] = {}

    def compose(self, tasks: list[Task]) -> ModelModule:
        by_node = {task.node: task for task in tasks}
        inside = {node for task in tasks for node in task.nodes[:-1]}
        inputs = [n for n in self.placeholders if n not in self.known]
        with self.context, ir.Location.unknown():
            arg_types = [_tensor_type(n.meta["val"]) for n in inputs]
            output = next(n for n in self.gm.graph.nodes if n.op == "output")
            results = [v for v in _flat(output.args[0]) if isinstance(v, fx.Node)]
            main = func.FuncOp("main", (arg_types, [_tensor_type(n.meta["val"]) for n in results]))
            main.operation.attributes[GRAPH_ATTR] = ir.UnitAttr.get()
            block = main.add_entry_block()
            self.values.update(zip(inputs, block.arguments, strict=True))
            with ir.InsertionPoint(block):
                for node in self.gm.graph.nodes:
                    if node.op in ("placeholder", "output") or node in inside:
                        continue
                    if node in by_node:
                        self._call_task(by_node[node])
                    else:
                        self._glue(node)
                func.ReturnOp([self._value(n) for n in results])
            self.module.body.append(main.operation)
        text = self.module.operation.get_asm(enable_debug_info=False, large_elements_limit=None)
        return ModelModule(text, self.tasks, self.glue, len(self.constant_values))

    # -- one node -------------------------------------------------------------------------------

    def _call_task(self, task: Task) -> None:
        callee = self.functions.get(task.key)
        if callee is None:
            name = function_name("task", len(self.tasks), task.op)
            callee = self._adopt(task_function(task, name, self.context))
            self.functions[task.key] = callee
            self.tasks.append(task)
        self._call(task.node, callee, task.input_nodes)

    def _glue(self, node: fx.Node) -> None:
        if node.op == "get_attr":
            self.known[node] = getattr(self.gm, str(node.target))
            return
        if node.op != "call_function":
            raise ModelImportError(f"node {node.name} ({node.op}) has no place in a module")
        if node.target is operator.getitem:
            source, index = node.args
            if source in self.known:
                self.known[node] = self.known[source][index]  # type: ignore[index]
            else:
                self.values[node] = self.values[source][index]  # type: ignore[index]
            return
        if all(arg in self.known for arg in node.all_input_nodes):
            # Computed from weights alone (a transposed weight, a batch norm folded into a
            # convolution): a constant of the module, as the backend's kernels see it.
            args, kwargs = tree_map(self._known_or_literal, (node.args, dict(node.kwargs)))
            with torch.no_grad():
                self.known[node] = node.target(*args, **kwargs)  # type: ignore[operator]
            return
        if not node.users:
            return
        name = op_name(node.target) if isinstance(node.target, torch._ops.OpOverload) else None
        if name is None:
            raise ModelImportError(
                f"node {node.name} calls {node.target}, which is not an ATen operator: only "
                "the backend can run it"
            )
        try:
            text = node_lowering(node)
        except LoweringError as err:
            raise ModelImportError(
                f"{name} (node {node.name}) runs eagerly in the backend and does not lower to "
                f"linalg either ({err}); `kope import --tasks` writes the model's Tasks alone"
            ) from None
        callee = self.functions.get(text)
        if callee is None:
            parsed = ir.Module.parse(text, self.context)
            glue = next(op.operation for op in parsed.body.operations)
            glue.attributes["sym_name"] = ir.StringAttr.get(function_name("glue", self.glue, name))
            glue.attributes["sym_visibility"] = ir.StringAttr.get("private")
            glue.attributes[GLUE_ATTR] = ir.StringAttr.get(name)
            glue.detach_from_parent()
            callee = self._adopt(glue)
            self.functions[text] = callee
            self.glue += 1
        inputs: list[fx.Node] = []
        for arg in node.all_input_nodes:  # the order `group_graph` lifts them in
            if arg not in inputs:
                inputs.append(arg)
        self._call(node, callee, inputs)

    def _call(self, node: fx.Node, callee: ir.Operation, inputs: list[fx.Node]) -> None:
        ftype = ir.FunctionType(ir.TypeAttr(callee.attributes["function_type"]).value)
        args = [self._value(arg, ftype.inputs[i]) for i, arg in enumerate(inputs)]
        symbol = ir.StringAttr(callee.attributes["sym_name"]).value
        call = func.CallOp(list(ftype.results), ir.FlatSymbolRefAttr.get(symbol), args)
        results = tuple(call.results)
        self.values[node] = results if isinstance(node.meta["val"], (tuple, list)) else results[0]

    def _adopt(self, function: ir.Operation) -> ir.Operation:
        """Move a detached function into the module, before `@main`."""
        self.module.body.append(function)
        return function

    # -- values ---------------------------------------------------------------------------------

    def _value(self, node: fx.Node, want: ir.Type | None = None) -> ir.Value:
        if node in self.values:
            value = self.values[node]
            assert not isinstance(value, tuple), node
            return value
        if node not in self.known:
            raise ModelImportError(f"node {node.name} is used before it is computed")
        return self._constant(self.known[node], want)

    def _constant(self, tensor: Any, want: ir.Type | None) -> ir.Value:
        if not isinstance(tensor, torch.Tensor):
            raise ModelImportError(f"a {type(tensor).__name__} where a tensor constant belongs")
        cached = self.constant_values.get(id(tensor))
        if cached is not None:
            return cached
        tensor_type = ir.RankedTensorType(want) if want is not None else _tensor_type(tensor)
        data = tensor.detach().contiguous().cpu()
        if data.dtype == torch.bfloat16:
            array = data.view(torch.int16).numpy()
        elif data.dtype == torch.uint8:
            array = data.view(torch.int8).numpy()
        else:
            array = data.numpy()
        attr = ir.DenseElementsAttr.get(
            array, type=tensor_type.element_type, shape=list(tensor_type.shape)
        )
        value = arith.ConstantOp(tensor_type, attr).result
        self.constant_values[id(tensor)] = value
        return value

    def _known_or_literal(self, value: Any) -> Any:
        return self.known[value] if isinstance(value, fx.Node) else value


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in _flat(item)]
    return [value]


def _tensor_type(value: Any) -> ir.RankedTensorType:
    if not isinstance(value, torch.Tensor):
        raise ModelImportError(f"the model takes or returns a {type(value).__name__}")
    element = MLIR_ELEMENTS.get(dtype_name(value.dtype))
    if element is None:
        raise ModelImportError(f"the model uses dtype {value.dtype}, which MLIR here does not")
    return ir.RankedTensorType.get(list(value.shape), ir.Type.parse(element))
