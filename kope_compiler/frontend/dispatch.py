"""Lean dispatch: the compiled aten graph's own Python cost per call, cut to what eager pays.

The graph KOPE compiles is aot_autograd's aten graph, not dynamo's: every `torch.ops.aten`
call goes through `OpOverload.__call__` (a Python frame), and a matmul written by hand
becomes a chain of views (`view`, `transpose`, `expand`, `_unsafe_view`) of a few
microseconds each, where dynamo's graph makes one torch call. On hand-written attention that
chain cost 270 µs per call over dynamo's graph before a single kernel ran. Two rewrites:

- **Torch bindings**: an ATen node calls torch's own Python binding of its operator
  (`torch.mm`, `Tensor.expand`: argument parsing in C++, as dynamo's graph calls them) where
  that binding, given the node's arguments, is checked at compile time (on the node's fake
  values) to dispatch exactly the node's overload; else the overload's C++ entry
  (`OpOverload._op`), one Python frame less than `OpOverload.__call__`. A shape goes to
  `reshape`, `view` and `expand` as separate ints, which torch parses faster than one list
  (hand-written attention's graph 1.6-2.6% faster, GPT-2's MLP 0.5-1.3%, interleaved).
- **Copies only where needed**: a contiguous copy (`clone`, as `x.transpose(1, 2).reshape(…)`
  traces) of a value nothing else reads calls `Tensor.contiguous`, which returns a tensor
  that is contiguous already as it is. CPU flash attention lays its output out so that the
  transpose back to (batch, sequence, heads, dim) is contiguous: every attention block's copy
  after it was 64 KiB written for nothing. A copy that keeps the format of such a value
  (eval-mode dropout traces as one; eager's returns its input) is not made at all.
- **Linears whole again**: `nn.Linear` traces as `t` of the weight, `addmm` (or `mm`) and, for
  an input of more than two dims, a reshape to 2-D before and back after; where eager runs the
  product, the four calls become the one `torch.nn.functional.linear` call eager makes (the
  same `addmm` inside ATen, on the same operands: 7 µs less per linear at 2×64×128 → 384 on
  a 2-core AVX2 machine here, 4-5 µs of hand-written attention's 300, whose q, k and v views
  of its first product keep that product 2-D). A product a KOPE kernel computes is left as
  it is.
- **View chains folded**: a chain of two or more views of one tensor, as seen by a compute
  node, becomes one `as_strided` of its root with the sizes, strides and offset the chain
  produces (shapes are static: KOPE compiles per concrete shape). The layout of the root is
  checked on every call, and a root that arrives with other strides than it was traced with
  replays the chain itself, so the fold never changes a result.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any, TypeGuard

import torch
import torch.fx as fx
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._pytree import tree_flatten

_aten = torch.ops.aten
# Ops whose output is a view of their first argument, and nothing else is a tensor.
VIEW_OPS = frozenset(
    {
        _aten.view.default,
        _aten._unsafe_view.default,
        _aten.t.default,
        _aten.transpose.int,
        _aten.permute.default,
        _aten.expand.default,
        _aten.unsqueeze.default,
        _aten.squeeze.dim,
        _aten.squeeze.dims,
        _aten.slice.Tensor,
        _aten.select.int,
        _aten.alias.default,
    }
)
# The reshapes a matmul's operands and products pass through (`linears_whole`, the attention
# rewrite in `kope.frontend.rewrites`, `kope.frontend.partition.sink_views`).
RESHAPES = frozenset({_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default})
# Ops that return a list of views of their first argument (taken apart by `getitem`).
SPLIT_OPS = frozenset({_aten.split.Tensor, _aten.split_with_sizes.default, _aten.unbind.int})


def lean(gm: fx.GraphModule) -> None:
    """Rewrite `gm`'s graph in place (the caller recompiles)."""
    copy_only_where_needed(gm.graph)
    linears_whole(gm.graph)
    fold_view_chains(gm.graph)
    fast_operators(gm.graph)


class RawOp(functools.partial[Any]):
    """An ATen overload's C++ entry, named so that fx's code generation can refer to it."""

    def __new__(cls, op: torch._ops.OpOverload) -> RawOp:
        self = super().__new__(cls, op._op)
        setattr(self, "__name__", str(op).replace(".", "_"))  # noqa: B010 (a partial has none)
        self.__module__ = __name__
        return self


# A view whose input arrives in another layout than it was traced on is a reshape: the same
# values, copied only then. A kernel writes contiguously what ATen wrote transposed (an
# elementwise op of a transposed q in rotary embeddings), the ops after it then lay their
# results out differently too (CPU flash attention follows its query), and a `view` that was
# valid on the traced strides fails on these; on the traced ones a reshape is that view.
_LAYOUT_TOLERANT: dict[Any, Callable[..., Any]] = {
    _aten.view.default: torch._C.TensorBase.reshape,
    _aten._unsafe_view.default: torch._C.TensorBase.reshape,
}


# Methods that take a shape as one sequence or as separate ints: torch's argument parser
# reads separate ints ~1.2 µs faster (3.3 against 2.1 µs a reshape, 2-core AVX2), as it tries
# no other signature first (`view(dtype)`); a transformer block's graph makes ten such calls.
_SHAPE_METHODS = frozenset(
    {torch._C.TensorBase.reshape, torch._C.TensorBase.view, torch._C.TensorBase.expand}
)


def fast_operators(graph: fx.Graph) -> None:
    """Each ATen node calls its torch binding where it is checked, else its raw entry; a view
    calls `reshape`; a shape is passed as separate ints where the method takes them."""
    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            tolerant = _LAYOUT_TOLERANT.get(node.target)
            node.target = tolerant or torch_binding(node) or RawOp(node.target)
            shape_as_ints(node)


def shape_as_ints(node: fx.Node) -> None:
    """`x.reshape([a, b])` as `x.reshape(a, b)`, the same call parsed faster."""
    if node.target not in _SHAPE_METHODS or node.kwargs or len(node.args) != 2:
        return
    shape = node.args[1]
    if isinstance(shape, (list, tuple)) and shape and all(type(d) is int for d in shape):
        node.args = (node.args[0], *shape)


def torch_binding(node: fx.Node) -> Callable[..., Any] | None:
    """torch's Python binding of the node's operator, if it dispatches exactly the node's
    overload on the node's arguments (checked on their fake values), else None."""
    op = node.target
    assert isinstance(op, torch._ops.OpOverload)
    if op.namespace != "aten":
        return None
    name = op._schema.name.split("::", 1)[1]
    binding = getattr(torch._C._VariableFunctions, name, None)
    if binding is None:
        binding = getattr(torch._C.TensorBase, name, None)
    if binding is None:
        return None
    args, kwargs = torch.utils._pytree.tree_map(_fake, (node.args, node.kwargs))
    modes = {v.fake_mode for v in torch.utils._pytree.tree_leaves((args, kwargs)) if _is_fake(v)}
    if len(modes) != 1:
        return None
    seen = _Dispatched()
    try:
        with modes.pop(), seen:
            binding(*args, **kwargs)
    except Exception:  # the binding does not take these arguments: the raw entry does
        return None
    if seen.ops[:1] != [op]:
        return None
    # The same overload, and on the same arguments: a binding may read them otherwise (torch's
    # binary_cross_entropy_with_logits takes the graph's (x, y, None, pos_weight) with no
    # reduction, where ATen's overload means the mean).
    called_args, called_kwargs = seen.calls[0]
    same = _same_values(_bound(op, called_args, called_kwargs), _bound(op, args, kwargs))
    return binding if same else None


def _bound(op: torch._ops.OpOverload, args: Any, kwargs: dict[str, Any]) -> list[Any] | None:
    """Every argument of `op`'s schema as a call passes it, defaults filled in (None: the call
    does not fit the schema)."""
    values: list[Any] = []
    for index, argument in enumerate(op._schema.arguments):
        if index < len(args) and not argument.kwarg_only:
            values.append(args[index])
        elif argument.name in kwargs:
            values.append(kwargs[argument.name])
        elif argument.has_default_value():
            values.append(argument.default_value)
        else:
            return None
    return values


def _same_values(a: Any, b: Any) -> bool:
    """Tensors by identity (or a number the binding wrapped), sequences element by element,
    the rest by equality; `a` is what the binding dispatched, `b` what the node holds."""
    if a is None or b is None:
        return a is b
    if isinstance(a, torch.Tensor) and isinstance(b, (int, float, bool)):
        return a.dim() == 0  # the binding wraps a Python number in the same place
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:
        return False


def _fake(value: Any) -> Any:
    return value.meta.get("val") if isinstance(value, fx.Node) else value


def _is_fake(value: Any) -> bool:
    return isinstance(value, torch._subclasses.FakeTensor)


class _Dispatched(torch.utils._python_dispatch.TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the overloads a call dispatches, in order."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[Any] = []
        self.calls: list[tuple[Any, dict[str, Any]]] = []  # (args, kwargs) of each

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func)
        self.calls.append((args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def _is_view(node: Any) -> bool:
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    if node.target is operator.getitem:
        parent = node.args[0]
        return isinstance(parent, fx.Node) and parent.target in SPLIT_OPS and _one_tensor(parent)
    return node.target in VIEW_OPS and _one_tensor(node)


def _one_tensor(node: fx.Node) -> bool:
    """Only the first argument is a graph value (sizes are constants, not symbols)."""
    rest = [*node.args[1:], *node.kwargs.values()]
    leaves = torch.utils._pytree.tree_leaves(rest)
    return isinstance(node.args[0], fx.Node) and not any(isinstance(v, fx.Node) for v in leaves)


def _source(node: fx.Node) -> fx.Node:
    arg = node.args[0]
    assert isinstance(arg, fx.Node)
    if node.target is operator.getitem:
        parent = arg.args[0]
        assert isinstance(parent, fx.Node)
        return parent
    return arg


def copy_only_where_needed(graph: fx.Graph) -> int:
    """Each contiguous `clone` of a value that only it reads, through views of a tensor an
    ATen operator made fresh, calls `Tensor.contiguous`, and a `clone` that keeps the format
    of such a value, dense and read directly, is elided; returns how many. The value is then
    seen only through the result, so returning it uncopied changes nothing a reader or the
    caller can tell (the graph is functional: no node writes a tensor in place). A tensor
    that is an input, a parameter or a kernel's kept result (a folded weight) is never
    returned uncopied."""
    made = 0
    for node in list(graph.nodes):
        if node.target is not _aten.clone.default or not isinstance(node.args[0], fx.Node):
            continue
        value = node.args[0]
        if node.kwargs.get("memory_format", torch.preserve_format) == torch.preserve_format:
            # Eval-mode dropout traces as this copy, which eager does not make. A dense value
            # keeps its strides through it: the value itself is the copy.
            val = value.meta.get("val")
            dense = isinstance(val, torch.Tensor) and is_non_overlapping_and_dense_or_false(val)
            if len(value.users) == 1 and _fresh(value) and dense:
                node.replace_all_uses_with(value)
                graph.erase_node(node)
                made += 1
            continue
        if node.kwargs.get("memory_format") != torch.contiguous_format:
            continue  # another format is a layout change
        while _is_view(value) and len(value.users) == 1:
            value = _source(value)
        if len(value.users) != 1 or not _fresh(value):
            continue
        node.target, node.kwargs = torch._C.TensorBase.contiguous, {}
        made += 1
    return made


def _fresh(node: fx.Node) -> bool:
    """An ATen operator's result that aliases none of its inputs (one result of several, too)."""
    if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        return _fresh(node.args[0])
    op = node.target
    if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload) or op.is_view:
        return False
    return all(r.alias_info is None for r in op._schema.returns)


def linears_whole(graph: fx.Graph) -> int:
    """Each `addmm(bias, x, t(w))` and `mm(x, t(w))` eager computes, with the reshapes of
    `x` to 2-D and of the product back around it, becomes `linear(x, w, bias)`; returns how
    many. `linear` computes exactly that `addmm` (a 2-D input, or a contiguous one of more
    dims); on an input that arrives strided it multiplies and adds the bias as eager's own
    `nn.Linear` does on it."""
    made = 0
    for node in list(graph.nodes):
        if node.target is _aten.addmm.default and not node.kwargs:
            bias, x, weight_t = node.args
        elif node.target is _aten.mm.default:
            bias, (x, weight_t) = None, node.args
        else:
            continue
        if not _is(weight_t, _aten.t.default) or not isinstance(x, fx.Node):
            continue
        if bias is not None and _rank(bias) != 1:  # a bias per row is addmm's, not linear's
            continue
        weight = weight_t.args[0]
        if not isinstance(weight, fx.Node) or _rank(weight) != 2:
            continue
        result = node
        if _is(x, *RESHAPES) and len(x.users) == 1 and len(node.users) == 1:
            # An input of more dims, flattened: the reshape back must restore its leading dims.
            source, (after,) = x.args[0], node.users
            src, out = _strided_value(source), _strided_value(after)
            if (
                _is(after, *RESHAPES)
                and src is not None
                and out is not None
                and src.is_contiguous()
                and tuple(out.shape[:-1]) == tuple(src.shape[:-1])
            ):
                x, result = source, after
        if _rank(x) is None:
            continue
        with graph.inserting_before(result):
            args = (x, weight) if bias is None else (x, weight, bias)
            linear = graph.call_function(torch._C._nn.linear, args)
        linear.meta["val"] = result.meta.get("val")
        result.replace_all_uses_with(linear)
        made += 1
    graph.eliminate_dead_code()
    return made


def _is(node: Any, *targets: Any) -> TypeGuard[fx.Node]:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def tensor_value(node: Any) -> torch.Tensor | None:
    """A node's tensor value (fake, from tracing); None for anything else."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _strided_value(node: Any) -> torch.Tensor | None:
    value = tensor_value(node)
    return value if _tensor(value) else None


def _rank(node: Any) -> int | None:
    value = _strided_value(node)
    return None if value is None else value.dim()


def fold_view_chains(graph: fx.Graph) -> int:
    """Replace each chain of ≥ 2 views, where a non-view node reads it, by one restride of its
    root; returns the chains folded."""
    folded = 0
    for node in list(graph.nodes):
        if not _is_view(node):
            continue
        chain = [node]
        while _is_view(_source(chain[0])):
            chain.insert(0, _source(chain[0]))
        root = _source(chain[0])
        readers = [u for u in node.users if not _is_view(u)]
        value, root_value = node.meta.get("val"), root.meta.get("val")
        if len(chain) < 2 or not readers or not _tensor(value) or not _tensor(root_value):
            continue
        if has_symbols(value) or has_symbols(root_value):
            continue  # a shape-generic graph's chain: one restride would hold one shape
        with graph.inserting_before(node):
            restride = graph.call_function(
                _restrider(root_value, value, _replay(chain, root)), (root,)
            )
        restride.meta["val"] = value
        for reader in readers:
            reader.replace_input_with(node, restride)
        folded += 1
    graph.eliminate_dead_code()
    return folded


def has_symbols(value: Any) -> bool:
    """Whether `value` (any nesting of values) holds a symbolic size or a tensor of one (a
    size, stride or offset)."""
    leaves, _ = tree_flatten(value)
    for leaf in leaves:
        if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if not isinstance(leaf, torch.Tensor):
            continue
        # Only a strided tensor has strides and an offset (a CSR one raises when asked).
        placed = (*leaf.stride(), leaf.storage_offset()) if leaf.layout == torch.strided else ()
        if any(isinstance(s, torch.SymInt) for s in (*leaf.shape, *placed)):
            return True
    return False


def _tensor(value: Any) -> TypeGuard[torch.Tensor]:
    return isinstance(value, torch.Tensor) and value.layout == torch.strided


def _restrider(
    root: torch.Tensor, view: torch.Tensor, replay: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[[torch.Tensor], torch.Tensor]:
    size, stride, root_stride = tuple(view.shape), view.stride(), root.stride()
    delta = view.storage_offset() - root.storage_offset()

    def restride(base: torch.Tensor) -> torch.Tensor:
        if base.stride() != root_stride:  # not the layout the chain was traced on
            return replay(base)
        return base.as_strided(size, stride, base.storage_offset() + delta)

    return restride


def _replay(chain: list[fx.Node], root: fx.Node) -> Callable[[torch.Tensor], torch.Tensor]:
    """The chain as a graph of its own, from its root."""
    nodes: list[fx.Node] = []
    for node in chain:
        parent = node.args[0]
        if node.target is operator.getitem and isinstance(parent, fx.Node) and parent not in nodes:
            nodes.append(parent)  # the split a `getitem` takes apart
        nodes.append(node)
    return subgraph([root], nodes, chain[-1]).forward


def subgraph(
    inputs: list[fx.Node], nodes: list[fx.Node], result: fx.Node, as_tuple: bool = False
) -> fx.GraphModule:
    """`nodes` (in graph order) copied into a graph of their own that takes `inputs` and
    returns `result` (as a 1-tuple with `as_tuple`), its operators made fast."""
    graph = fx.Graph()
    values = {n: graph.placeholder(f"in{i}") for i, n in enumerate(inputs)}
    for node in nodes:
        values[node] = graph.node_copy(node, lambda n: values[n])
    graph.output((values[result],) if as_tuple else values[result])
    fast_operators(graph)
    return fx.GraphModule(torch.nn.Module(), graph)
