"""torch-mlir's import of a user's operator, run where a crash costs nothing but the operator.

The reference lowering of a Task is torch-mlir's FX import of its nodes alone, lowered to
linalg-on-tensors by torch-mlir's pipeline (`import_group`). That is native code fed with the
user's graph, and it kills the process that runs it on ordinary input: SIGFPE on zero-size
shapes (`F.unfold` or `F.group_norm` of an empty batch), SIGSEGV on `scatter`, an LLVM
"out of memory" abort on `scatter_add`. Special-casing each known crash does not close the
class, so the import never runs in the user's process: `isolated_import` sends the operator,
as plain data (its ATen call, input specs and strides), to a persistent lowering worker
(`kope.targets.worker`, the candidates' isolation) that rebuilds the nodes on fake tensors
(`rebuild`) and imports them there. A worker that dies is a `LoweringCrash`, the operator's
reason to run on ATen; `kope.core.task.reference_lowering` caches it with the other refusals, so
the operator is not tried again in that form. The worker starts on the first import the
cache does not answer, so a warm compile starts none.
"""

from __future__ import annotations

import logging
import operator
import pickle
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_map
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d
from torch_mlir.extras.fx_importer import FxImporter

from kope.core import decompositions
from kope.core.decompositions import REFERENCE_DECOMPOSITIONS
from kope.core.errors import first_line
from kope.passes.keys import canonicalize_module_text
from kope.passes.pipeline import PipelineError, run_pipeline
from kope.targets.worker import Outcome, WorkerPool
from kope.vocabulary.specs import InputRef, OpCall, Program, StepRef, TensorSpec

log = logging.getLogger("kope.compiler")

# torch-mlir's own path from an imported FX graph to linalg-on-tensors.
IMPORT_PIPELINE = [
    "func.func(torch-match-quantized-custom-ops)",
    "torchdynamo-export-to-torch-backend-pipeline",
    "torch-backend-to-linalg-on-tensors-backend-pipeline{allow-non-finites=true}",
]


class LoweringError(Exception):
    """torch-mlir could not import or lower an operator."""


def op_name(target: Any) -> str:
    """`aten.mm.default` for an OpOverload."""
    return f"{target.namespace}.{target._opname}.{target._overloadname}"


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
    (`kope.core.decompositions.decomposition_table`, as torch-mlir's own import does); `gm` itself
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


def imported(group: list[fx.Node], decomposed: bool) -> str:
    """The canonical reference lowering of `group`, imported in this process (`import_group`).

    Only the lowering worker calls this: see the module docstring."""
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


# -- isolation ----------------------------------------------------------------------------------

# The longest one import may take in the worker; torch-mlir imports an operator in well under
# a second, a large decomposition in a few. Past it the import counts as failed in this
# process only: a limit met on a busy machine says nothing about the operator.
IMPORT_TIMEOUT_S = 120.0


class LoweringCrash(LoweringError):
    """torch-mlir's import or lowering killed the process that ran it."""


class LoweringUnanswered(LoweringError):
    """The lowering worker gave no answer (a time limit, a failure of its own): nothing is
    known of the operator, so nothing is recorded."""


@dataclass(frozen=True)
class ImportRequest:
    """An operator (or fused group) as plain data: what the lowering worker rebuilds."""

    call: OpCall | Program
    inputs: tuple[TensorSpec, ...]
    strides: tuple[tuple[int, ...], ...]
    decomposed: bool


_pool: WorkerPool | None = None
_pool_lock = threading.Lock()


def _lowering_pool() -> WorkerPool:
    """The process's one lowering worker (started on its first job, stopped at exit)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = WorkerPool(1, preload=__name__)
        return _pool


def isolated_import(request: ImportRequest, label: str) -> str:
    """The canonical reference lowering of the operator `request` describes, imported in the
    lowering worker; raises LoweringError when torch-mlir refuses it, LoweringCrash when the
    import killed the worker."""
    try:
        pickle.dumps(request)
    except Exception as err:  # an argument of the call that cannot cross to the worker
        raise LoweringError(
            f"its call cannot be sent to the lowering worker: {first_line(err)}"
        ) from None
    outcome = _lowering_pool().call(f"{__name__}:import_job", request, IMPORT_TIMEOUT_S)
    return _answer(outcome, label)


def _answer(outcome: Outcome, label: str) -> str:
    if outcome.failure == "crash":
        death = outcome.detail.splitlines()
        reason = death[0] if death else "the worker died"
        last = death[-1].strip() if len(death) > 1 else ""
        log.warning("torch-mlir killed the lowering worker importing %s (%s)", label, reason)
        raise LoweringCrash(
            f"torch-mlir's import killed the process that ran it ({reason}"
            + (f"; {last[:200]}" if last else "")
            + ")"
        )
    if outcome.failure == "timeout":
        raise LoweringUnanswered(f"torch-mlir's import did not finish in {IMPORT_TIMEOUT_S:g} s")
    if outcome.failure is not None:
        lines = [line for line in outcome.detail.strip().splitlines() if line.strip()]
        raise LoweringUnanswered(
            f"the lowering worker failed: {lines[-1] if lines else 'no detail'}"
        )
    kind, text = outcome.value
    if kind == "error":
        raise LoweringError(text)
    return str(text)


def import_job(request: ImportRequest, phase: Any) -> tuple[str, str]:
    """The lowering worker's job: ("payload", text), or ("error", why torch-mlir refused)."""
    phase("import")
    try:
        return "payload", imported(rebuild(request), request.decomposed)
    except LoweringError as err:
        return "error", str(err)


def rebuild(request: ImportRequest) -> list[fx.Node]:
    """The nodes of the operator `request` describes, in a graph of their own, each carrying
    its value on fake tensors as the user's graph did (inputs with the user's strides)."""
    graph = fx.Graph()
    mode = FakeTensorMode()
    with mode:
        values = [
            torch.empty_strided(spec.shape, stride, dtype=spec.torch_dtype)
            for spec, stride in zip(request.inputs, request.strides, strict=True)
        ]
    placeholders = []
    for index, value in enumerate(values):
        placeholder = graph.placeholder(f"in{index}")
        placeholder.meta["val"] = value
        placeholders.append(placeholder)
    steps = request.call.steps if isinstance(request.call, Program) else (request.call,)
    nodes: list[fx.Node] = []

    def node_of(value: Any) -> Any:
        if isinstance(value, InputRef):
            return placeholders[value.index]
        if isinstance(value, StepRef):
            if value.index is not None:
                raise LoweringError("a fused step reads one result of a multi-output step")
            return nodes[value.step]
        if isinstance(value, (list, tuple)):
            return type(value)(node_of(v) for v in value)
        return value

    def value_of(value: Any) -> Any:
        return value.meta["val"] if isinstance(value, fx.Node) else value

    for step in steps:
        args, kwargs = node_of(tuple(step.args)), {k: node_of(v) for k, v in step.kwargs}
        op = step.resolve()
        node = graph.call_function(op, args, kwargs)
        with mode:
            node.meta["val"] = op(*tree_map(value_of, args), **tree_map(value_of, kwargs))
        nodes.append(node)
    return nodes


def input_strides(inputs: Sequence[fx.Node]) -> tuple[tuple[int, ...], ...]:
    """The strides of the input nodes' values, as the user's graph lays them out."""
    return tuple(tuple(int(s) for s in node.meta["val"].stride()) for node in inputs)
