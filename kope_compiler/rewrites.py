"""Graph rewrites before partitioning: what a compiler can do that eager cannot.

They run on the aten graph at the start of `kope.partition.partition`, so every road that cuts
a model into Tasks (the backend, `kope precompile`, `kope import`) sees the same
rewritten graph and gives its Tasks the same keys.

- **Batch norm folded into the convolution before it** (eval mode): `conv(x, w, b)` followed by
  `batch_norm(·, γ, β, μ, σ²)` becomes `conv(x, w·s, (b-μ)·s+β)` with `s = γ/√(σ²+ε)`, one pass
  over the activations less. The folded weights are computed on the first call and kept while
  the six tensors they come from are the same tensors, unwritten (identity, storage and version
  counter): a weight written in place after compiling, or a checkpoint loaded into the model,
  is folded again on the next call.
- **Attention as one kernel**: scores `q @ kᵀ`, an optional scale, a softmax over the last dim
  and the weighted sum `@ v` — as hand-written attention and KOPE's own decomposition of
  `nn.TransformerEncoderLayer` trace — become one `scaled_dot_product_attention` (a flash
  kernel on CPU: no scores tensor, no contiguous copies of q, k and v).

Each rewrite is checked when it is made: the original nodes and the replacement run on seeded
random inputs of the nodes' shapes and must agree within the dtype's tolerance
(`kope.targets.verify.compare`); a rewrite that does not is logged and not made. The whole-graph
check (`kope.whole_graph`) then times the rewritten graph against eager like any other.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import unset_fake_temporarily

from kope.dispatch import VIEW_OPS, subgraph
from kope.targets import verify
from kope.vocabulary.specs import TensorSpec

log = logging.getLogger("kope.compiler")

aten = torch.ops.aten

# Set on the nodes a rewrite made; its value names the rewrite.
REWRITE = "kope_rewrite"
FOLDED_BATCH_NORM = "batch norm folded into the convolution before it"
FUSED_ATTENTION = "attention as one scaled_dot_product_attention"


def rewrite(gm: fx.GraphModule) -> list[str]:
    """Apply every rewrite to `gm`'s graph in place; the names of those made, one per site."""
    made = fold_batch_norms(gm.graph) + fuse_attention(gm.graph)
    return [node.meta[REWRITE] for node in made]


# --- batch norm folded into a convolution -----------------------------------------------------

_BATCH_NORMS = frozenset(
    {
        aten._native_batch_norm_legit_no_training.default,
        aten.native_batch_norm.default,
        aten.batch_norm.default,
    }
)


class FoldedBatchNorm:
    """A graph node's callable: (weight, bias) of a convolution with the eval-mode batch norm
    after it folded in, kept while its inputs are the same tensors, unwritten."""

    def __init__(self, eps: float):
        self.eps = eps
        self.__name__ = "kope_folded_batch_norm"
        self._inputs: tuple[Any, ...] = ()
        self._stamps: tuple[Any, ...] = ()
        self._folded: tuple[torch.Tensor, torch.Tensor] | None = None
        self.folds = 0  # how many times the weights were folded (tests read it)

    def __call__(self, *inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # (weight, bias, gamma, beta, mean, var); a plain loop: this runs on every call.
        if self._folded is not None:
            for t, cached, stamp in zip(inputs, self._inputs, self._stamps, strict=True):
                if t is not cached or (t is not None and (t._version, t.data_ptr()) != stamp):
                    break
            else:
                return self._folded
        folded = fold_batch_norm(inputs, self.eps)
        self.folds += 1
        # An inference tensor counts no writes: its fold cannot be kept.
        if not any(t is not None and t.is_inference() for t in inputs):
            self._inputs = inputs
            self._stamps = tuple(None if t is None else (t._version, t.data_ptr()) for t in inputs)
            self._folded = folded
        return folded


def fold_batch_norm(sources: Sequence[Any], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The convolution weight and bias with the batch norm after it folded in (in float32 at
    least, then the weight's dtype), from (weight, bias, gamma, beta, mean, var); the bias,
    gamma and beta may be None."""
    weight, bias, gamma, beta, mean, var = sources
    with torch.no_grad():
        wide = torch.promote_types(weight.dtype, torch.float32)
        scale = torch.rsqrt(var.to(wide) + eps)
        if gamma is not None:
            scale = scale * gamma.to(wide)
        shift = -mean.to(wide) if bias is None else bias.to(wide) - mean.to(wide)
        folded_bias = shift * scale
        if beta is not None:
            folded_bias = folded_bias + beta.to(wide)
        shape = (-1,) + (1,) * (weight.dim() - 1)
        folded_weight = weight.to(wide) * scale.reshape(shape)
        return folded_weight.to(weight.dtype).contiguous(), folded_bias.to(weight.dtype)


def _arguments(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by their schema names, defaults filled in."""
    assert isinstance(node.target, torch._ops.OpOverload)
    bound: dict[str, Any] = {}
    for index, arg in enumerate(node.target._schema.arguments):
        if index < len(node.args):
            bound[arg.name] = node.args[index]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _positional(node: fx.Node) -> list[Any]:
    """The node's arguments in schema order, as one positional list."""
    assert isinstance(node.target, torch._ops.OpOverload)
    bound = _arguments(node)
    return [bound[arg.name] for arg in node.target._schema.arguments]


def _only_first_output_used(node: fx.Node) -> fx.Node | None:
    """The node that carries a batch norm's normalized output: the node itself when it returns
    one tensor, else its one `getitem(·, 0)` when nothing else of it is used."""
    if node.target is aten.batch_norm.default:
        return node
    users = list(node.users)
    if len(users) == 1 and users[0].target is operator.getitem and users[0].args[1] == 0:
        return users[0]
    return None


def fold_batch_norms(graph: fx.Graph) -> list[fx.Node]:
    """Fold each eval-mode batch norm into the convolution before it; the folding nodes."""
    made = []
    for bn in list(graph.nodes):
        if bn.op != "call_function" or bn.target not in _BATCH_NORMS:
            continue
        args = _arguments(bn)
        conv = args["input"]
        out = _only_first_output_used(bn)
        if (
            out is None
            or args.get("training", False)
            or args["running_mean"] is None
            or args["running_var"] is None
            or not isinstance(conv, fx.Node)
            or conv.target is not aten.convolution.default
            or len(conv.users) != 1
        ):
            continue
        conv_args = _arguments(conv)
        if conv_args["transposed"]:  # its weight holds output channels in dim 1
            continue
        sources = [
            conv_args["weight"],
            conv_args["bias"],
            args["weight"],
            args["bias"],
            args["running_mean"],
            args["running_var"],
        ]
        eps = float(args["eps"])
        with unset_fake_temporarily():  # a backend may compile under a fake mode
            agrees = _folding_agrees(conv, bn, out, sources, eps)
        if not agrees:
            continue
        with graph.inserting_before(conv):
            fold = graph.call_function(FoldedBatchNorm(eps), tuple(sources))
            weight = graph.call_function(operator.getitem, (fold, 0))
            bias = graph.call_function(operator.getitem, (fold, 1))
            new_args = _positional(conv)
            new_args[1], new_args[2] = weight, bias
            folded = graph.call_function(aten.convolution.default, tuple(new_args))
        weight_val = conv_args["weight"].meta["val"]
        fold.meta["val"] = (weight_val, weight_val.new_empty(weight_val.shape[:1]))
        weight.meta["val"], bias.meta["val"] = fold.meta["val"]
        folded.meta["val"] = conv.meta["val"]
        for node in (fold, weight, bias):
            node.meta[REWRITE] = FOLDED_BATCH_NORM
        out.replace_all_uses_with(folded)
        for node in (out, bn, conv) if out is not bn else (bn, conv):
            graph.erase_node(node)
        made.append(fold)
    return made


def _folding_agrees(
    conv: fx.Node,
    bn: fx.Node,
    out: fx.Node,
    sources: list[Any],
    eps: float,
) -> bool:
    """Whether the folded convolution matches the convolution and batch norm on seeded random
    inputs of their shapes (running variances positive, as running variances are)."""
    x = _input(conv)
    assert x is not None, "a convolution's input is a graph value"
    inputs = list(dict.fromkeys([x] + [s for s in sources if isinstance(s, fx.Node)]))
    nodes = [conv, bn] + ([out] if out is not bn else [])
    values = dict(zip(inputs, _random_values(inputs), strict=True))
    var = sources[5]
    if isinstance(var, fx.Node):
        values[var] = values[var].abs() + 0.5
    want = subgraph(inputs, nodes, out)(*(values[n] for n in inputs))
    real = [values[s] if isinstance(s, fx.Node) else s for s in sources]
    weight, bias = fold_batch_norm(real, eps)
    got = aten.convolution.default(values[x], weight, bias, *_positional(conv)[3:])
    reduction = int(weight[0].numel()) if weight.dim() else 1
    return _agrees(FOLDED_BATCH_NORM, got, want, reduction)


def _agrees(name: str, got: torch.Tensor, want: torch.Tensor, reduction: int) -> bool:
    comparison = verify.compare(got, want, 0, reduction=reduction)
    if not comparison.ok:
        log.warning(
            "rewrite not made (%s): it disagrees with the original: %s", name, comparison.message
        )
    return comparison.ok


def _random_values(nodes: Sequence[fx.Node]) -> list[torch.Tensor]:
    """Seeded random tensors of the nodes' shapes and dtypes, as the verifier draws them."""
    specs = [TensorSpec.of(n.meta["val"]) for n in nodes]
    return verify.make_inputs(specs, verify.Trial("random", 0))


# --- attention as one kernel ------------------------------------------------------------------

# The reshapes a matmul's operands and products pass through (shared with
# `kope.partition.sink_views`).
RESHAPES = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default})
_SCALES: dict[Any, Callable[[float], float]] = {
    aten.div.Tensor: lambda c: 1.0 / c,
    aten.div.Scalar: lambda c: 1.0 / c,
    aten.mul.Tensor: lambda c: c,
    aten.mul.Scalar: lambda c: c,
}
# View ops that read their input's strides, so that a producer's new layout could break them.
_LAYOUT_BOUND = frozenset({aten.view.default, aten._unsafe_view.default})


def _shape(node: Any) -> tuple[int, ...]:
    """The shape of a node's tensor value; () for anything else."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else ()


def _input(node: fx.Node | None, index: int = 0) -> fx.Node | None:
    """The node's positional argument `index`, if it is a node."""
    args: Any = node.args if node is not None else ()
    arg = args[index] if index < len(args) else None
    return arg if isinstance(arg, fx.Node) else None


def _calls(node: fx.Node | None, targets: Any) -> fx.Node | None:
    """`node` if it calls one of `targets` (one target or a set of them)."""
    if node is None or node.op != "call_function":
        return None
    return (
        node if node.target in (targets if isinstance(targets, frozenset) else {targets}) else None
    )


def _only_user(node: fx.Node | None, targets: Any) -> fx.Node | None:
    """`node`'s only user, if it calls one of `targets`."""
    users = list(node.users) if node is not None else []
    return _calls(users[0], targets) if len(users) == 1 else None


def _unbatched(operand: fx.Node | None) -> fx.Node | None:
    """The rank-4 tensor that matmul's broadcasting turned into this bmm operand: the operand
    is `view(clone(expand(x, x.shape)))` (the clone and expand optional) of it."""
    node = _input(operand) if _calls(operand, RESHAPES) else None
    if _calls(node, aten.clone.default):
        node = _input(node)
    if _calls(node, aten.expand.default):
        if _shape(_input(node)) != _shape(node):
            return None
        node = _input(node)
    return node if len(_shape(node)) == 4 else None


def _untransposed(node: fx.Node) -> fx.Node | None:
    """x where `node` is x with its last two dims swapped."""
    args: Any = node.args
    if node.target is aten.transpose.int:
        return _input(node) if {int(d) % 4 for d in args[1:3]} == {2, 3} else None
    if node.target is aten.permute.default:
        return _input(node) if [int(d) % 4 for d in args[1]] == [0, 1, 3, 2] else None
    return None


class _Attention:
    """A matched attention: q, k, v, its nodes from them to its output, and its scale."""

    def __init__(self, qkv: list[fx.Node], nodes: list[fx.Node], out: fx.Node, scale: float):
        self.qkv, self.nodes, self.out, self.scale = qkv, nodes, out, scale


def _attention_at(softmax: fx.Node) -> _Attention | None:
    """The attention whose softmax this is; None if it is not one: softmax(view(bmm(q', kᵀ'))
    · scale) → (expand) → view → bmm(·, v') → view, where q', kᵀ', v' are matmul's batched
    views of rank-4 q, kᵀ and v."""
    args: Any = softmax.args
    if args[2] is not False or int(args[1]) % 4 != 3 or len(_shape(softmax)) != 4:
        return None
    nodes = [softmax]
    scores = _input(softmax)
    scale = 1.0
    scaling = _calls(scores, frozenset(_SCALES))
    if scaling is not None and len(scaling.users) == 1:
        factor: Any = scaling.args[1]
        if isinstance(factor, (int, float)):
            scale = _SCALES[scaling.target](float(factor))
            nodes.append(scaling)
            scores = _input(scaling)
    scores = _calls(scores, RESHAPES)
    if scores is None or len(scores.users) != 1:
        return None
    first = _calls(_input(scores), aten.bmm.default)
    if first is None or len(first.users) != 1:
        return None
    nodes += [scores, first]
    q, keys_t = _unbatched(_input(first, 0)), _unbatched(_input(first, 1))
    k = _untransposed(keys_t) if keys_t is not None else None
    probs = _only_user(softmax, frozenset({aten.expand.default}) | RESHAPES)
    if probs is not None and probs.target is aten.expand.default:
        nodes.append(probs)
        probs = _only_user(probs, RESHAPES)
    second = _only_user(probs, aten.bmm.default)
    if probs is None or second is None or _input(second, 0) is not probs:
        return None
    out = _only_user(second, RESHAPES)
    v = _unbatched(_input(second, 1))
    if q is None or keys_t is None or k is None or v is None or out is None:
        return None
    nodes += [probs, second, out]
    b, h, length, _ = _shape(q)
    if _shape(k)[:2] != (b, h) or _shape(v)[:3] != _shape(k)[:3]:
        return None
    if _shape(out) != (b, h, length, _shape(v)[3]):
        return None
    # The views that made the bmm operands of q, k and v (erased once unused).
    for operand, source in (
        (_input(first, 0), q),
        (_input(first, 1), keys_t),
        (_input(second, 1), v),
    ):
        while operand is not None and operand is not source:
            nodes.append(operand)
            operand = _input(operand)
    nodes.append(keys_t)
    order = {n: i for i, n in enumerate(softmax.graph.nodes)}
    return _Attention([q, k, v], sorted(set(nodes), key=order.__getitem__), out, scale)


def fuse_attention(graph: fx.Graph, within: set[fx.Node] | None = None) -> list[fx.Node]:
    """Make each attention one kernel (with `within`, those whose softmax is there); the fused
    nodes."""
    made = []
    for softmax in list(graph.nodes):
        if _calls(softmax, aten._softmax.default) is None:
            continue
        if within is not None and softmax not in within:
            continue
        found = _attention_at(softmax)
        if found is None:
            continue
        with unset_fake_temporarily():  # a backend may compile under a fake mode
            agrees = _attention_agrees(found)
        if not agrees:
            continue
        out = found.out
        val = _fake_attention(found)
        with graph.inserting_after(out):
            fused = graph.call_function(
                aten.scaled_dot_product_attention.default,
                tuple(found.qkv),
                {"scale": found.scale},
            )
            fused.meta["val"] = val
            fused.meta[REWRITE] = FUSED_ATTENTION
            result = fused
            if val.stride() != out.meta["val"].stride() and _layout_read_below(out):
                result = graph.call_function(
                    aten.clone.default, (fused,), {"memory_format": torch.contiguous_format}
                )
                result.meta["val"] = out.meta["val"]
        out.replace_all_uses_with(result)
        for node in reversed(found.nodes):
            if not node.users:
                graph.erase_node(node)
        made.append(fused)
    return made


def _fake_attention(found: _Attention) -> torch.Tensor:
    """The fused node's value (fake, in the graph's fake mode): its layout may differ."""
    values = [n.meta["val"] for n in found.qkv]
    mode = detect_fake_mode(values)
    assert mode is not None, "an aten graph's values are fake tensors"
    with mode:
        out: torch.Tensor = aten.scaled_dot_product_attention.default(*values, scale=found.scale)
    return out


def _layout_read_below(node: fx.Node) -> bool:
    """Whether a view that reads its input's strides is reached from `node` through views."""
    pending = list(node.users)
    while pending:
        user = pending.pop()
        if user.target in _LAYOUT_BOUND:
            return True
        if user.target in VIEW_OPS:
            pending.extend(user.users)
    return False


def _attention_agrees(found: _Attention) -> bool:
    values = _random_values(found.qkv)
    want = subgraph(found.qkv, found.nodes, found.out)(*values)
    got = aten.scaled_dot_product_attention.default(*values, scale=found.scale)
    return _agrees(FUSED_ATTENTION, got, want, reduction=int(values[1].shape[2]))
