"""Partitioning an aten graph into Tasks, views, and operators that run eagerly (with a reason).

The graph is first rewritten, here, so that every road that partitions cuts the same Tasks:
what it computes from constants alone is computed once (`fold_constants`), then
`kope.frontend.rewrites` (batch norm folded into convolutions, stacks of convolutions
channels-last, attention as one kernel).
A connected group of elementwise and row-reduction nodes whose only value seen outside is its
output becomes one Task (one kernel, one pass over memory): an elementwise chain, RMSNorm or
softmax written by hand, GELU-tanh expanded; elementwise ops take the contraction they read
as their head (its epilogue), after the views a 3-D linear makes between them are sunk below
them (`sink_views`). Every other compute node becomes a Task at the
coarsest level torch-mlir lowers: a node is first imported as it is (softmax, layer_norm, ...
stay one Task). When that fails and a decomposition is known (`kope.core.decompositions`:
torch-mlir's table, PyTorch's for interpolations, KOPE's own for fused fast paths), the node is
imported through it as one Task, its eager call and baseline still the node's native one (a
bicubic upsample is one kernel, not ~80 Tasks of index arithmetic); where that does not lower,
the node runs whole eagerly, as one native call beats its pieces run as small kernels around
an eager one. Only a decomposition holding a Task of its own (a contraction) or a fused fast
path (whose parts `kope.frontend.compiler` weighs against it whole) replaces the node in the graph,
its nodes partitioned in turn.
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_leaves, tree_map

from kope.core.decompositions import FAST_PATHS, decomposition_table
from kope.core.lowering import LoweringError, op_name
from kope.core.task import Task, group_inputs, make_task
from kope.frontend.dispatch import RESHAPES, has_symbols, tensor_value
from kope.frontend.rewrites import REWRITE, fuse_attention, rewrite
from kope.passes.analysis import heads_inner_strides
from kope.targets.base import Target

log = logging.getLogger("kope.compiler")

MAX_REFINE_DEPTH = 4
_ALLOCATIONS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")
_VIEW_LIKE = ("_unsafe_view", "alias", "lift_fresh")  # views in all but schema


@dataclass
class EagerNode:
    """A node that runs as eager ATen, and why."""

    node: fx.Node
    op: str
    reason: str
    compute: bool  # True: a compute operator KOPE could not take (counts against coverage)


@dataclass
class Partition:
    """The result of partitioning: Tasks, eager nodes with reasons, and how many views."""

    tasks: list[Task] = field(default_factory=list)
    eager: list[EagerNode] = field(default_factory=list)
    views: int = 0
    rewrites: list[str] = field(default_factory=list)  # `kope.frontend.rewrites` made, one per site


def _is_aten_op(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload)


def eager_reason(node: fx.Node, target: Target) -> tuple[str, bool] | None:
    """Why `node` (a call of an ATen operator) must run eagerly, and whether it is compute;
    None if it can be a Task on `target` (which says what tensors it takes)."""
    op = node.target
    assert isinstance(op, torch._ops.OpOverload), op
    name = op_name(op)
    schema = op._schema
    if schema.is_mutable:
        return f"{name} mutates its arguments in place", True
    if torch.Tag.nondeterministic_seeded in op.tags:
        if _dropout_off(node):  # ATen's attention ops: seeded for their dropout alone
            return f"{name}: attention as one ATen kernel, which KOPE runs as it is", True
        return f"{name} draws random numbers; its results cannot be verified", True
    if not schema.returns:
        # aten._assert_async, _assert_tensor_metadata: checks that aot_autograd leaves in the
        # graph (a one_hot's bounds, a dtype conversion's input), not compute operators.
        return f"{name} returns nothing (a check, not a compute operator)", False
    val = node.meta.get("val")
    if val is None:
        return f"{name} has no shape information", True
    # Its inputs too: a sum of a tensor whose length moves has an output of static shape.
    operands = fx.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    if has_symbols(val) or has_symbols(operands):
        # A size read (aten.sym_size.int) returns no tensor: no compute operator.
        computes = any(isinstance(v, torch.Tensor) for v in tree_leaves(val))
        return f"{name} has symbolic shapes; KOPE specialises on static shapes", computes
    outputs = list(val) if isinstance(val, (tuple, list)) else [val]
    if not outputs or not all(isinstance(v, torch.Tensor) for v in outputs):
        return f"{name} does not return tensors", False
    tensors = [v for v in outputs]
    for arg in node.all_input_nodes:
        arg_val = arg.meta.get("val")
        if isinstance(arg_val, torch.Tensor):
            tensors.append(arg_val)
        elif arg_val is not None and not isinstance(arg_val, (int, float, bool)):
            return f"{name} takes a non-tensor graph value ({type(arg_val).__name__})", True
    if not node.all_input_nodes:
        return f"{name} creates a tensor from constants (not a compute operator)", False
    for t in tensors:
        refused = target.refuses(t)
        if refused is not None:
            return f"{name} {refused}", True
    return None


def _dropout_off(node: fx.Node) -> bool:
    """Whether the op takes a `dropout_p` (ATen's attention ops do) and it is 0."""
    names = [a.name for a in node.target._schema.arguments]  # type: ignore[union-attr]
    if "dropout_p" not in names:
        return False
    at = names.index("dropout_p")
    value = node.args[at] if at < len(node.args) else node.kwargs.get("dropout_p", 0.0)
    return bool(value == 0.0)


aten = torch.ops.aten


def _values_only(op: Any, remap: Callable[[tuple[Any, ...]], tuple[Any, ...]]) -> Any:
    return lambda args: (op, remap(args))


def _same_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return args


def _dim_to_list(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (args[0], [args[1]], *args[2:])


def _layer_norm_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    x, shape, weight, bias, eps = args
    return (x, shape, weight, bias, eps, False)


def _group_norm_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    x, weight, bias, _n, _c, _hw, groups, eps = args
    return (x, groups, weight, bias, eps, False)


def _batch_norm_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    x, weight, bias, mean, var, momentum, eps = args
    return (x, weight, bias, mean, var, False, momentum, eps, False)


# Multi-output ops whose first output alone has an op of its own that torch-mlir lowers whole
# (and that skips computing the unread outputs).
_VALUES_ONLY_OPS: dict[Any, Callable[[tuple[Any, ...]], tuple[Any, tuple[Any, ...]]]] = {
    aten._native_batch_norm_legit_no_training.default: _values_only(
        aten.batch_norm.default, _batch_norm_args
    ),
    aten.native_layer_norm.default: _values_only(aten.layer_norm.default, _layer_norm_args),
    aten.native_group_norm.default: _values_only(aten.group_norm.default, _group_norm_args),
    aten.max_pool2d_with_indices.default: _values_only(aten.max_pool2d.default, _same_args),
    aten.max_pool3d_with_indices.default: _values_only(aten.max_pool3d.default, _same_args),
    aten.max.dim: _values_only(aten.amax.default, _dim_to_list),
    aten.min.dim: _values_only(aten.amin.default, _dim_to_list),
}


# The most storage a folded constant may hold: a causal mask of 2048 positions in float32
# (16 MiB), which eager builds again on every call.
FOLD_MAX_BYTES = 16 << 20
CONSTANT_PREFIX = "_kope_constant_"


def fold_constants(gm: fx.GraphModule) -> int:
    """Compute once, at compile time, what the graph computes from constants alone, and read
    it as a constant from then on; how many constants it made.

    Models build masks and positions from `arange` and literals on every call (HF's causal
    mask: ~20 operators before attention sees it), which neither eager nor dynamo's graph
    saves. A node folds when it is an ATen operator that neither mutates nor draws random
    numbers nor allocates uninitialized memory, returns one tensor, and reads only nodes that
    fold (no input, parameter or buffer, which the caller may change). The values a node
    that stays reads from folded ones become attributes of `gm`; a value the graph returns is
    never one (each call must return a tensor of its own), nor one above `FOLD_MAX_BYTES`;
    equal values share one attribute."""
    computable: set[fx.Node] = set()
    for node in gm.graph.nodes:
        op = node.target
        if node.op != "call_function" or not _is_aten_op(op):
            continue
        if _mutates(node) or torch.Tag.nondeterministic_seeded in op.tags:
            continue
        if op._opname in _ALLOCATIONS or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        if has_symbols(node.meta["val"]):
            continue  # its shape moves with the inputs' (a shape-generic graph's mask)
        if all(arg in computable for arg in node.all_input_nodes):
            computable.add(node)
    # What the graph returns, or an operator writes into, stays computed on every call; what
    # it is computed from may still fold.
    constant = computable - _returned(gm.graph)
    constant -= {n for n in constant if any(_mutates(u) for u in n.users)}
    frontier = [n for n in gm.graph.nodes if n in constant and set(n.users) - constant]
    if not frontier:
        return 0
    values: dict[fx.Node, Any] = {}
    try:
        # Real tensors, whatever mode the caller traces under.
        with torch.utils._python_dispatch._disable_current_modes(), torch.no_grad():
            for node in gm.graph.nodes:
                if node in computable:
                    args, kwargs = fx.map_arg((node.args, node.kwargs), values.__getitem__)
                    values[node] = node.target(*args, **kwargs)
    except Exception as err:  # an operator that needs what tracing had: leave it to run
        log.debug("constant folding skipped: %s: %s", type(err).__name__, err)
        return 0
    made: list[tuple[str, torch.Tensor]] = []
    for node in frontier:
        value = values[node]
        if value.untyped_storage().nbytes() > FOLD_MAX_BYTES:
            continue
        # One buffer for equal values (every layer of a model builds the same mask).
        name = next((n for n, other in made if _same_constant(value, other)), None)
        if name is None:
            name = f"{CONSTANT_PREFIX}{len(made)}"
            while hasattr(gm, name):
                name += "_"
            gm.register_buffer(name, value, persistent=False)
            made.append((name, value))
        with gm.graph.inserting_before(node):
            attr = gm.graph.get_attr(name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
    for node in reversed(list(gm.graph.nodes)):
        if node in constant and not node.users:
            gm.graph.erase_node(node)
    return len(made)


def _same_constant(a: torch.Tensor, b: torch.Tensor) -> bool:
    layout = (a.dtype, a.shape, a.stride(), a.storage_offset())
    if layout != (b.dtype, b.shape, b.stride(), b.storage_offset()):
        return False
    # Real tensors compared, whatever mode the caller traces under (aot_autograd's fake one
    # for a training graph).
    with torch.utils._python_dispatch._disable_current_modes():
        return torch.equal(a, b)


def _returned(graph: fx.Graph) -> set[fx.Node]:
    """The nodes whose value the graph may return: its outputs, and what an output that is a
    view (an alias of its input, by its schema) views, transitively."""
    found: set[fx.Node] = set()
    todo = [n for n in graph.nodes if n.op == "output" for n in n.all_input_nodes]
    while todo:
        node = todo.pop()
        if node in found:
            continue
        found.add(node)
        target = node.target
        if target is operator.getitem or (
            isinstance(target, torch._ops.OpOverload)
            and any(r.alias_info is not None for r in target._schema.returns)
        ):
            todo += node.all_input_nodes
    return found


def _mutates(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def drop_metadata_checks(gm: fx.GraphModule) -> int:
    """Erase `aten._assert_tensor_metadata` nodes; how many. aot_export leaves one behind a
    dtype conversion that changes nothing (`x.to(x.dtype)`), and aot_autograd does not: as a
    user of its tensor it would cut a fused group on one road and not the other, giving the
    same model different Tasks under `kope precompile` and `torch.compile`. Shapes are static
    and dynamo guards the inputs' dtypes, so what it checks was settled when tracing."""
    checks = [n for n in gm.graph.nodes if n.target is aten._assert_tensor_metadata.default]
    for node in checks:
        gm.graph.erase_node(node)
    return len(checks)


def drop_unused_outputs(gm: fx.GraphModule, within: set[fx.Node] | None = None) -> list[fx.Node]:
    """Replace multi-output ops whose later outputs nobody reads by their values-only op (with
    `within`, those among these nodes); the values-only nodes made."""
    made = []
    for node in list(gm.graph.nodes):
        if within is not None and node not in within:
            continue
        rewrite = _VALUES_ONLY_OPS.get(node.target) if node.op == "call_function" else None
        if rewrite is None or node.kwargs:
            continue
        users = [u for u in node.users if u.users or u.target is not operator.getitem]
        if not users or any(u.target is not operator.getitem or u.args[1] != 0 for u in users):
            continue
        op, args = rewrite(tuple(node.args))
        with gm.graph.inserting_before(node):
            values = gm.graph.call_function(op, args)
        values.meta = dict(node.meta)
        values.meta["val"] = node.meta["val"][0]
        for user in list(node.users):
            user.replace_all_uses_with(values)
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        made.append(values)
    return made


# Row-wise reductions a fused group may hold besides elementwise ops: with them RMSNorm, layer
# norm and softmax as user code writes them (x * rsqrt(mean(x * x) + eps), exp(x - amax) /
# sum) become one Task, one pass over each row, instead of one Task and one pass per step;
# and a group norm takes the activation and residual after it (a diffusion UNet's GroupNorm
# + SiLU), whose rows are its groups.
_ROW_OPS = frozenset(
    (
        "sum.dim_IntList",
        "sum.default",
        "mean.dim",
        "mean.default",
        "amax.default",
        "amin.default",
        "var.correction",
        "_softmax.default",
        "_log_softmax.default",
        "layer_norm.default",
        "group_norm.default",
    )
)
# Eval-mode batch norm is elementwise per channel (its `training` argument, here index 5).
_BATCH_NORM = "batch_norm.default"


# Contractions a group of elementwise ops may start with, as their epilogue (bias, activation,
# gating, residual add, scale): the product is consumed tile by tile inside the kernel instead
# of being written out by one Task and read back by the next.
_CONTRACTIONS = frozenset(("mm.default", "addmm.default", "bmm.default"))


def _name(node: fx.Node) -> str | None:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    return f"{node.target._opname}.{node.target._overloadname}"


def _lowerable(node: fx.Node, target: Target) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor) and eager_reason(node, target) is None


def _fusible(node: fx.Node, target: Target) -> bool:
    name = _name(node)
    if name is None:
        return False
    assert isinstance(node.target, torch._ops.OpOverload)
    kind = (
        torch.Tag.pointwise in node.target.tags
        or name in _ROW_OPS
        or (name == _BATCH_NORM and len(node.args) > 5 and node.args[5] is False)
    )
    return kind and _lowerable(node, target)


def _epilogue_head(
    group: set[fx.Node], order: dict[fx.Node, int], target: Target, taken: set[fx.Node]
) -> fx.Node | None:
    """The contraction a group of elementwise ops can take as its head: one it reads whose
    every use is in the group (the latest in graph order if several are), for a group without
    row reductions (a schedule tiles a contraction's epilogue like the product, row by row
    of register tiles; a reduction over a row the product has not finished cannot be)."""
    if any(_name(member) in _ROW_OPS for member in group):
        return None
    heads = [
        arg
        for member in group
        for arg in member.all_input_nodes
        if arg not in group
        and arg not in taken
        and arg in order
        and _name(arg) in _CONTRACTIONS
        and _lowerable(arg, target)
        and all(user in group for user in arg.users)
    ]
    return max(heads, key=order.__getitem__, default=None)


# Set on an elementwise node that a view was sunk below (`sink_views`): its input is a
# contraction's product, directly or through other such nodes, so views below it sink too.
_SUNK = "kope_view_sunk"


def _reshaped(node: Any) -> fx.Node | None:
    """The tensor `node` reshapes, if it is a reshape of a node."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target not in RESHAPES:
        return None
    source = node.args[0]
    return source if isinstance(source, fx.Node) else None


def _operand_below(
    arg: Any, view: fx.Node, product: torch.Tensor, shape: tuple[int, ...]
) -> tuple[str, Any] | None:
    """How an operand of an elementwise user of `view` (a reshape of `product` to `shape`)
    reads once the user computes on `product`'s shape instead: ("same", x) as it is, ("node",
    n) another node, ("view", x) x reshaped to the product's shape; None if it cannot."""
    if arg is view:
        return ("node", view.args[0])
    val = tensor_value(arg)
    if val is None:
        return ("same", arg)  # a scalar
    source = _reshaped(arg)
    source_val = tensor_value(source)
    if source is not None and source_val is not None and source_val.shape == product.shape:
        return ("node", source)  # another view of a tensor of the product's shape
    if tuple(val.shape) == shape and val.is_contiguous():
        return ("view", arg)
    # Broadcast along rows (a bias, a scale per feature): it broadcasts against the product
    # alike where the view keeps the last dim; one of a higher rank than the product's drops
    # its leading ones. A single number broadcasts alike against any shape.
    rows = product.shape[-1:] == shape[-1:] or val.numel() == 1
    if rows and all(d == 1 for d in val.shape[:-1]) and val.dim() <= product.dim():
        return ("same", arg)
    return None


def _of_product(node: fx.Node) -> bool:
    """Whether `node` is a contraction's product, or an elementwise op of one that nothing
    else reads (`x @ w + b`, a bias added before the view), directly or through others."""
    if _name(node) in _CONTRACTIONS or node.meta.get(_SUNK):
        return True
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and torch.Tag.pointwise in target.tags
        and any(len(a.users) == 1 and _of_product(a) for a in node.all_input_nodes)
    )


def sink_views(graph: fx.Graph, within: set[fx.Node] | None = None) -> list[fx.Node]:
    """Move reshapes of a contraction's product below the elementwise ops that read them, so
    that those ops can become the contraction's epilogue; the nodes made.

    A linear on a 3-D activation traces as `view(x)` → `addmm` → `view` → GELU ...: the view
    between the product and its activation keeps `fused_groups` from taking the addmm as the
    group's head. For an elementwise `f`, `f(view(p), y) = view(f(p, view⁻¹(y)))` exactly (the
    same operations on the same numbers) when each other operand is a scalar, a contiguous
    tensor of the view's shape (read through the inverse view) or, where the view keeps the
    last dim, a tensor broadcast along rows: a 1x1 convolution's product (channels x
    positions, `kope.frontend.rewrites`) viewed back to NCHW takes its ReLU as its epilogue. The
    view sinks below all its users at once, or not at all, and keeps sinking below their users in
    turn. With `within`, only views of those nodes' products."""
    made: list[fx.Node] = []
    pending = deque(n for n in graph.nodes if within is None or n in within)
    while pending:
        view = pending.popleft()
        if view._erased:
            continue
        product = _reshaped(view)
        if product is None:
            continue
        if not _of_product(product):
            continue
        before, after = tensor_value(product), tensor_value(view)
        if before is None or after is None or not view.users or len(product.users) != 1:
            continue
        if not before.is_contiguous() or has_symbols([before, after]):
            continue  # a view of symbolic shape would be written with the trace's sizes
        if all(_sinks_below(user, view, before, tuple(after.shape)) for user in view.users):
            new = _sink(graph, view, product)
            made += new
            pending.extendleft(reversed([n for n in new if n.target in RESHAPES]))
    # An operand read through the inverse view may have sunk since, and the next linear views
    # the product back to 2-D: view(view(y)) to y's own shape is y.
    made_here = set(made)
    for node in [n for n in graph.nodes if within is None or n in within or n in made_here]:
        source = _reshaped(_reshaped(node))
        if source is not None and _same_layout(source, node):
            inner = node.args[0]
            node.replace_all_uses_with(source)
            graph.erase_node(node)
            if isinstance(inner, fx.Node) and not inner.users:
                graph.erase_node(inner)
    return [n for n in made if not n._erased]


def _same_layout(a: fx.Node, b: fx.Node) -> bool:
    va, vb = tensor_value(a), tensor_value(b)
    return va is not None and vb is not None and va.shape == vb.shape and va.is_contiguous()


def _sinks_below(
    user: fx.Node, view: fx.Node, product: torch.Tensor, shape: tuple[int, ...]
) -> bool:
    """Whether `user` of `view` is elementwise and can compute on the product's shape. Not
    one a row reduction reads (a scale before a softmax): it fuses into that row group as it
    is, and a row kernel beats eager more often than a contraction's does."""
    target = user.target
    return (
        user.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and torch.Tag.pointwise in target.tags
        and not any(_name(reader) in _ROW_OPS for reader in user.users)
        and tuple(getattr(tensor_value(user), "shape", ())) == shape
        and not any(isinstance(v, fx.Node) for v in user.kwargs.values())
        and all(_operand_below(arg, view, product, shape) is not None for arg in user.args)
    )


def _sink(graph: fx.Graph, view: fx.Node, product: fx.Node) -> list[fx.Node]:
    """Make each user of `view` compute on `product`'s shape, then view back; the nodes made.
    Users run in graph order, so one that reads another (GELU's x·x·x) finds it sunk already
    and reads its product directly."""
    made: list[fx.Node] = []
    before, after = tensor_value(product), tensor_value(view)
    assert before is not None and after is not None
    mode = detect_fake_mode([before])
    shape = tuple(after.shape)
    dead: list[fx.Node] = []
    for user in sorted(view.users):  # fx orders nodes by their place in the graph
        op = user.target
        assert isinstance(op, torch._ops.OpOverload)  # `_sinks_below` checked it
        with graph.inserting_before(user):
            args: list[Any] = []
            for arg in user.args:
                how, operand = _operand_below(arg, view, before, shape) or ("same", arg)
                if how == "view":
                    assert isinstance(arg, fx.Node)
                    operand = graph.call_function(aten.view.default, (arg, list(before.shape)))
                    with _fake(mode):
                        operand.meta["val"] = aten.view.default(arg.meta["val"], before.shape)
                    made.append(operand)
                elif how == "node" and arg is not view:
                    assert isinstance(arg, fx.Node)
                    dead.append(arg)
                args.append(operand)
            computed = graph.call_function(op, tuple(args), dict(user.kwargs))
            values = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
            with _fake(mode):
                computed.meta["val"] = op(*values, **user.kwargs)
            computed.meta[_SUNK] = True
            back = graph.call_function(aten.view.default, (computed, list(shape)))
            back.meta["val"] = user.meta["val"]
        user.replace_all_uses_with(back)
        graph.erase_node(user)
        made += [computed, back]
    graph.erase_node(view)
    # Another view of a product that a user now reads directly may be dead: erased, so that
    # the product it reshaped has that user alone and can head an epilogue too.
    for other in dead:
        if not other.users and not other._erased:
            graph.erase_node(other)
    return made


def _fake(mode: Any) -> Any:
    return mode if mode is not None else contextlib.nullcontext()


def _inexactly_lowered(node: fx.Node) -> bool:
    """Whether torch-mlir's lowering of `node` computes something else: GELU's tanh form uses
    0.797724 for sqrt(2/pi) = 0.7978846, a relative error of 2e-4 that the float64 check of a
    lone GELU flags (it then runs eagerly) but a matmul's epilogue, checked within the
    contraction's looser tolerance, would carry into its kernels."""
    if node.op != "call_function" or node.target is not aten.gelu.default:
        return False
    return node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none") == "tanh"


def expand_inexact_lowerings(gm: fx.GraphModule) -> int:
    """Replace the nodes torch-mlir lowers inexactly (`_inexactly_lowered`) by ATen's own
    decomposition, exact elementwise ops that fuse into one Task again; how many were."""
    table = torch._decomp.decomposition_table
    expanded = 0
    for node in list(gm.graph.nodes):
        if _inexactly_lowered(node) and node.target in table:
            expanded += decompose_in_place(gm, node, table[node.target]) is not None
    return expanded


def has_fast_path(gm: fx.GraphModule) -> bool:
    """Whether `gm` calls a fused eager fast path that KOPE can take apart (`FAST_PATHS`)."""
    return any(n.op == "call_function" and n.target in FAST_PATHS for n in gm.graph.nodes)


def fused_groups(
    gm: fx.GraphModule, target: Target, within: set[fx.Node] | None = None
) -> list[list[fx.Node]]:
    """Connected groups of elementwise and row-reduction nodes with one output: one kernel each.

    A group grows backwards from its output (the last node of the graph not yet taken): a
    producer joins when it is fusible and all its users are already in the group, so nothing
    but the output is seen outside it and the group computes in one pass (a chain, each node
    feeding only the next, is the simplest case). A group of elementwise ops then takes the
    contraction (mm, addmm, bmm) it reads, if nothing else reads it, as its head: the ops are
    the contraction's epilogue (`_epilogue_head`), and a single elementwise op qualifies. A
    layout copy a rewrite made (`clone(permute(x))`, `kope.frontend.rewrites.channels_last`) grows
    from its view, so the elementwise ops before it write their output transposed.
    Groups are in graph order. With `within`, only those nodes are grouped (the nodes a
    decomposition just made)."""
    nodes = [n for n in gm.graph.nodes if within is None or n in within]
    order = {node: i for i, node in enumerate(nodes)}
    groups: list[list[fx.Node]] = []
    taken: set[fx.Node] = set()
    for sink in reversed(nodes):
        if sink in taken or not _fusible(sink, target):
            continue
        group = {sink} | _layout_view(sink)
        grown = True
        while grown:
            grown = False
            for member in sorted(group, key=order.__getitem__, reverse=True):
                for arg in member.all_input_nodes:
                    if (
                        arg not in group
                        and arg not in taken
                        and (within is None or arg in within)
                        and _fusible(arg, target)
                        and all(user in group for user in arg.users)
                    ):
                        group.add(arg)
                        grown = True
        head = _epilogue_head(group, order, target, taken)
        if head is not None:
            group.add(head)
        if len(group) >= 2:
            groups.append(sorted(group, key=order.__getitem__))
            taken.update(group)
    return groups[::-1]


def _layout_view(node: fx.Node) -> set[fx.Node]:
    """The view of a layout copy a rewrite made (`clone(permute(x))`), if `node` is one."""
    view = node.args[0] if node.target is aten.clone.default and node.args else None
    if isinstance(view, fx.Node) and view.meta.get(REWRITE) and len(view.users) == 1:
        return {view}
    return set()


def partition(
    gm: fx.GraphModule,
    target: Target,
    fuse: bool = True,
    fast_paths: bool = True,
    onednn: bool = True,
    attention: bool = True,
) -> Partition:
    """Make Tasks of `gm`'s compute nodes for `target`: connected groups of elementwise and
    row-reduction nodes (elementwise ones with the contraction they read as their head) fused
    into one Task (`fused_groups`), other nodes one Task each,
    decomposing nodes torch-mlir cannot lower. With `fast_paths` False, a fused eager fast
    path (e.g. nn.TransformerEncoderLayer's) is not decomposed: one native kernel beats its
    parts run one by one, so it runs eagerly whole. With `onednn` False, no op is fused into
    a oneDNN library call (`kope.frontend.rewrites.rewrite`); with `attention` False, attention
    written out is not fused into one ATen call."""
    result = Partition()
    table = decomposition_table(fast_paths)
    drop_metadata_checks(gm)
    fold_constants(gm)
    drop_unused_outputs(gm)
    if fuse:
        result.rewrites = rewrite(gm, onednn, attention)
        expand_inexact_lowerings(gm)  # alone, such a node runs eagerly; fused, exactly
        sink_views(gm.graph)  # a 3-D linear's activation becomes its matmul's epilogue
    target_key = target.key()
    fused: set[fx.Node] = set()
    for group in fused_groups(gm, target) if fuse else []:
        try:
            result.tasks.append(make_task(group, target_key))
        except LoweringError as err:
            log.debug("the group %s does not lower as one kernel: %s", [n.name for n in group], err)
            continue
        fused.update(group)
    depth: dict[fx.Node, int] = {}
    worklist = [n for n in gm.graph.nodes if n not in fused]
    while worklist:
        node = worklist.pop(0)
        if node.op != "call_function" or getattr(node, "_erased", False):
            continue
        if node.target is operator.getitem:
            continue
        made_by = node.meta.get(REWRITE)
        if made_by is not None:
            _take_rewritten(node, made_by, target, result)
            continue
        if not _is_aten_op(node.target):
            result.eager.append(EagerNode(node, str(node.target), "not an ATen operator", False))
            continue
        name = op_name(node.target)
        if node.target.is_view or node.target._opname in _VIEW_LIKE:
            result.views += 1
            continue
        if node.target._opname in _ALLOCATIONS:
            result.eager.append(EagerNode(node, name, "allocates without computing", False))
            continue
        refusal = eager_reason(node, target)
        if refusal is not None:
            failure, compute = refusal
            if not (compute and node.target._schema.is_mutable and node.target in table):
                result.eager.append(EagerNode(node, name, failure, compute))
                continue
            # e.g. batch norm's decompositions pass through a mutating overload.
        else:
            try:
                result.tasks.append(make_task(node, target_key))
                continue
            except LoweringError as err:
                failure = f"torch-mlir cannot lower {name}: {err}"
        level = depth.get(node, 0)
        decomposition = table.get(node.target) if level < MAX_REFINE_DEPTH else None
        sub = trace_decomposition(node, decomposition) if decomposition is not None else None
        if sub is not None and refusal is None and _one_kernel(node, sub):
            try:
                result.tasks.append(make_task(node, target_key, decomposed=True))
                log.debug(
                    "%s does not lower as a whole (%s); its decomposition does", name, failure
                )
            except LoweringError as err:
                pieces = sum(
                    _is_aten_op(n.target) and not n.target.is_view for n in sub.graph.nodes
                )
                reason = (
                    f"{failure}; nor does its decomposition as one kernel ({err}), and one "
                    f"native call is faster than its {pieces} pieces"
                )
                result.eager.append(EagerNode(node, name, reason, True))
            continue
        replacement = _splice(gm, node, sub) if sub is not None else None
        if replacement is None:
            if node.target in FAST_PATHS and not fast_paths:
                failure = (
                    f"{name} is a fused eager fast path, kept whole: the store knows no "
                    "kernels for its parts (kope precompile optimizes them; then the backend "
                    "takes it apart if the graph wins)"
                )
            result.eager.append(EagerNode(node, name, failure, True))
            continue
        log.debug(
            "%s does not lower as a whole (%s); decomposed into %d nodes",
            name,
            failure,
            len(replacement),
        )
        if fuse:  # a decomposition may write attention out (nn.TransformerEncoderLayer's does)
            fused_attention = fuse_attention(gm.graph, set(replacement)) if attention else []
            result.rewrites += [n.meta[REWRITE] for n in fused_attention]
            # ... and calls of its own that the whole graph's clean-up did not see.
            made = drop_unused_outputs(gm, set(replacement))
            made += sink_views(gm.graph, set(replacement) | set(made))
            order = {n: i for i, n in enumerate(gm.graph.nodes)}
            replacement = sorted(
                {n for n in replacement if n in order} | set(fused_attention) | set(made),
                key=order.__getitem__,
            )
        for new in replacement:
            depth[new] = level + 1
        for group in fused_groups(gm, target, set(replacement)) if fuse else []:
            try:  # the decomposition's elementwise and row steps, fused as any others are
                result.tasks.append(make_task(group, target_key))
            except LoweringError:
                continue
            replacement = [n for n in replacement if n not in group]
        worklist = replacement + worklist
    for task in result.tasks:
        if len(task.nodes) > 1:  # a group's input may since have been decomposed and replaced
            task.input_nodes[:] = group_inputs(task.nodes)
    # In the order the graph computes them (fx orders nodes by place), as `kope import`'s
    # @main calls them.
    result.tasks.sort(key=lambda task: task.node)
    return result


# Operators that are Tasks of their own, with their epilogues (`fused_groups`): a
# decomposition holding one is partitioned, not imported as one kernel.
_OWN_TASKS = _CONTRACTIONS | {"convolution.default"}


def _one_kernel(node: fx.Node, decomposition: fx.GraphModule) -> bool:
    """Whether `node`, which torch-mlir does not lower whole, is imported through its
    `decomposition` as one Task: one that holds no operator that is a Task of its own, for a
    node that is no fused fast path (whose parts `kope.frontend.compiler` weighs against it
    whole)."""
    return node.target not in FAST_PATHS and not any(
        _name(n) in _OWN_TASKS for n in decomposition.graph.nodes
    )


def _take_rewritten(node: fx.Node, made_by: str, target: Target, result: Partition) -> None:
    """A node a rewrite made: its ATen operator (a fused kernel, a layout copy) is a Task where
    torch-mlir lowers it, else it runs eagerly; never decomposed again (that would undo the
    rewrite). A rewrite's own steps (folding weights) are no operator of the model. A copy in
    another layout, `clone(permute(x))`, is one Task with its view (a transpose of x, which is
    contiguous); the view alone is no Task."""
    if not isinstance(node.target, torch._ops.OpOverload) or node.target.is_view:
        return
    name = op_name(node.target)
    if node.target is aten.scaled_dot_product_attention.default:
        task = attention_task(node, target)
        if task is not None:
            result.tasks.append(task)
            return
    view = node.args[0] if node.target is aten.clone.default else None
    group = [view, node] if isinstance(view, fx.Node) and view.meta.get(REWRITE) else node
    if eager_reason(node, target) is None:
        try:
            result.tasks.append(make_task(group, target.key()))
            return
        except LoweringError:
            pass
    # A fused kernel computes (the report counts it among the operators ATen runs); a layout
    # copy only moves.
    compute = node.target is not aten.clone.default
    result.eager.append(EagerNode(node, name, f"{made_by}: ATen runs it", compute))


def attention_task(node: fx.Node, target: Target) -> Task | None:
    """A `scaled_dot_product_attention` with no dropout, of f32 q, k and v of rank 4 (three
    distinct tensors; k and v maybe with fewer heads, under `enable_gqa`) and maybe a mask
    (f32 or bool), as one Task: imported
    through its decomposition, its function marked with what that loses (causal, the scale)
    for the attention kernel family (`kope.spaces.attention`); its eager call stays ATen's.
    None where it is not one."""
    kwargs: Any = node.kwargs
    qkv = node.args[:3]
    mask = kwargs.get("attn_mask")
    if len(node.args) > 3 or set(kwargs) - {"is_causal", "scale", "attn_mask", "enable_gqa"}:
        return None
    if len({*qkv, mask} - {None}) != 3 + (mask is not None):
        return None
    values = [n.meta.get("val") if isinstance(n, fx.Node) else None for n in qkv]
    if not all(
        isinstance(v, torch.Tensor)
        and v.dim() == 4
        and v.dtype == torch.float32
        and not has_symbols(v)
        and target.refuses(v) is None
        for v in values
    ):
        return None
    if mask is not None:
        # Added to the scores (f32) or choosing them (bool), broadcast over B x H x Lq x Lk.
        m = mask.meta.get("val") if isinstance(mask, fx.Node) else None
        if not (
            isinstance(m, torch.Tensor)
            and m.dtype in (torch.float32, torch.bool)
            and 1 <= m.dim() <= 4
            and not has_symbols(m)
        ):
            return None
    query, key, value = values[0], values[1], values[2]  # tensors: checked above
    assert query is not None and key is not None and value is not None
    # Grouped heads (k and v with fewer, q's a multiple) only where the call says so.
    grouped = bool(kwargs.get("enable_gqa"))
    if key.shape[1] != value.shape[1] or query.shape[1] % key.shape[1]:
        return None
    if query.shape[1] != key.shape[1] and not grouped:
        return None
    depth = int(query.shape[-1])
    scale = kwargs.get("scale")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(depth)
    # A view (permuted out of one projection) is read where it lies, rows of D in a row.
    views = tuple(
        None if v.is_contiguous() or v.stride()[-1] != 1 else tuple(int(s) for s in v.stride())
        for v in (query, key, value)
    )
    # The output as the graph expects it: heads inner where ATen's CPU attention made it so.
    out = node.meta.get("val")
    heads_inner = (
        isinstance(out, torch.Tensor)
        and out.dim() == 4
        and out.shape[1] > 1
        and out.shape[2] > 1
        and tuple(out.stride()) == heads_inner_strides(out.shape)
    )
    try:
        return make_task(
            node,
            target.key(),
            decomposed=True,
            attention=(bool(kwargs.get("is_causal")), scale, views, heads_inner),
        )
    except LoweringError as err:
        log.debug("attention %s does not lower through its decomposition: %s", node.name, err)
        return None


def decompose_in_place(
    gm: fx.GraphModule, node: fx.Node, decomposition: Callable[..., Any]
) -> list[fx.Node] | None:
    """Replace `node` by the graph of `decomposition`; the new nodes, or None if it fails."""
    sub = trace_decomposition(node, decomposition)
    return None if sub is None else _splice(gm, node, sub)


def trace_decomposition(node: fx.Node, decomposition: Callable[..., Any]) -> fx.GraphModule | None:
    """The graph of `decomposition` on `node`'s arguments (its placeholders are `node`'s input
    nodes, in order), or None if tracing fails or makes no progress."""
    inputs = node.all_input_nodes
    vals = [n.meta["val"] for n in inputs]
    position = {n: i for i, n in enumerate(inputs)}

    def call(*tensors: Any) -> Any:
        def sub(value: Any) -> Any:
            return tensors[position[value]] if isinstance(value, fx.Node) else value

        return decomposition(*tree_map(sub, tuple(node.args)), **tree_map(sub, dict(node.kwargs)))

    fake_mode = detect_fake_mode(vals)
    try:
        if fake_mode is not None:
            with fake_mode:
                sub = make_fx(call)(*vals)
        else:
            sub = make_fx(call, tracing_mode="fake")(*vals)
    except Exception as err:  # a decomposition can refuse arguments it does not handle
        log.debug("decomposition of %s failed: %s", op_name(node.target), err)
        return None
    if any(n.op == "call_function" and n.target is node.target for n in sub.graph.nodes):
        return None  # it did not make progress
    return sub


def _splice(gm: fx.GraphModule, node: fx.Node, sub: fx.GraphModule) -> list[fx.Node]:
    """Replace `node` by the nodes of its decomposition `sub` (`trace_decomposition`'s); the
    nodes made."""
    env: dict[fx.Node, Any] = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for ph, original in zip(placeholders, node.all_input_nodes, strict=True):
        env[ph] = original
    added: list[fx.Node] = []
    result: Any = None
    with gm.graph.inserting_before(node):
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                result = tree_map(lambda v: env[v] if isinstance(v, fx.Node) else v, n.args[0])
                continue
            if n.op == "get_attr":
                name = _fresh_attr(gm, "_kope_const")
                setattr(gm, name, getattr(sub, n.target))
                copy = gm.graph.get_attr(name)
                copy.meta = dict(n.meta)
            elif _builds_tuple(n):
                # A decomposition wrapped its results in a namedtuple (`out_wrapper`'s
                # return_types_*), which make_fx records as a call of the class. Generated
                # graph code names such a class by a module path it does not live at, so
                # the call is dropped: its items are the nodes it was built from.
                items = (
                    *n.args,
                    *(n.kwargs[f] for f in getattr(n.target, "_fields", ())[len(n.args) :]),
                )
                env[n] = tuple(env[a] if isinstance(a, fx.Node) else a for a in items)
                continue
            elif n.target is operator.getitem and isinstance(env.get(n.args[0]), tuple):
                env[n] = env[n.args[0]][n.args[1]]
                continue
            else:
                copy = gm.graph.node_copy(n, lambda v: env[v])
            env[n] = copy
            added.append(copy)
    _replace_uses(node, result)
    gm.graph.erase_node(node)
    return added


def _builds_tuple(node: fx.Node) -> bool:
    """A call of a tuple class (a namedtuple or structseq constructor) on graph values."""
    target = node.target
    return node.op == "call_function" and isinstance(target, type) and issubclass(target, tuple)


def _replace_uses(node: fx.Node, result: Any) -> None:
    if isinstance(result, (tuple, list)):
        for user in list(node.users):
            index = user.args[1] if user.target is operator.getitem else None
            if isinstance(index, int):
                user.replace_all_uses_with(result[index])
                user.graph.erase_node(user)
            else:
                raise RuntimeError(f"unexpected use of multi-output {node} by {user}")
    else:
        node.replace_all_uses_with(result)


def _fresh_attr(gm: fx.GraphModule, prefix: str) -> str:
    i = 0
    while hasattr(gm, f"{prefix}{i}"):
        i += 1
    return f"{prefix}{i}"
