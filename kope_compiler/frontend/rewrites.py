"""Graph rewrites before partitioning: what a compiler can do that eager cannot.

They run on the aten graph at the start of `kope.frontend.partition.partition`, so every road
that cuts a model into Tasks (the backend, `kope precompile`, `kope import`) sees the same
rewritten graph and gives its Tasks the same keys.

- **Batch norm folded into the convolution before it** (eval mode): `conv(x, w, b)` followed by
  `batch_norm(·, γ, β, μ, σ²)` becomes `conv(x, w·s, (b-μ)·s+β)` with `s = γ/√(σ²+ε)`, one pass
  over the activations less. The folded weights are computed on the first call and kept while
  the six tensors they come from are the same tensors, unwritten (identity, storage and version
  counter): a weight written in place after compiling, or a checkpoint loaded into the model,
  is folded again on the next call.
- **Convolutions channels-last** (on CPU): oneDNN runs a convolution on NCHW activations by
  reordering them to its own layout and back on every call; on NHWC (channels-last) ones it
  does not (a 3×3 32→32 convolution at 28×28: 141 against 174-196 µs, 2-core AVX2). A region
  of convolutions and the elementwise ops between them is computed on NHWC tensors: a 4-D
  tensor entering it is copied to NHWC once (a transpose), a convolution reads a permuted
  view of it (NCHW in shape, channels-last in strides) with its weight channels-last (kept
  like a folded weight) and its product is viewed back as NHWC, elementwise ops run on the
  NHWC tensors as they are (their small broadcast operands permuted alike), and a value
  leaving the region is copied back to NCHW once, by the kernel of the elementwise ops before
  it where it can (`kope.frontend.partition.fused_groups`). A copy (20-25 µs for 1×32×28×28) and a
  convolution's views cost about what the convolution saves, so a region is rewritten only
  when it has two convolutions per copy of its own (`CONVS_PER_COPY`): a residual block, not
  a lone convolution. Depthwise convolutions stay NCHW (KOPE's own kernels for them beat
  oneDNN's). Its elementwise Tasks see contiguous NHWC tensors, as
  KOPE's kernels take them.
- **Elementwise ops fused into the convolution before them** (inside a channels-last region,
  float32, where torch has oneDNN): a convolution whose only reader is a ReLU, GELU, SiLU,
  sigmoid or tanh, or an add of a tensor of its shape (a residual) optionally followed by a
  ReLU, becomes one `mkldnn._convolution_pointwise` call that applies them as it writes its
  output, with its weight reordered once into oneDNN's blocked layout (kept like a folded
  weight) instead of on every call: one pass over the activations less per fused op.
  `kope import` leaves them out (a library call has no linalg form).
- **1x1 convolutions as matrix products** (NCHW, stride 1, no padding, one group, where eager
  runs oneDNN): the weight times each sample's (channels x positions) view, a matmul Task
  whose bias and activation are its epilogue (`pointwise_convolutions_as_matmuls`).
- **Attention as one kernel**: scores `q @ kᵀ`, an optional scale, a softmax over the last dim
  and the weighted sum `@ v` — as hand-written attention and KOPE's own decomposition of
  `nn.TransformerEncoderLayer` trace — become one `scaled_dot_product_attention` (a flash
  kernel on CPU: no scores tensor, no contiguous copies of q, k and v).
- **Attention calls as one operator**: `scaled_dot_product_attention` traces on the CPU to
  `_scaled_dot_product_flash_attention_for_cpu`, whose second result (a log-sum-exp) no model
  reads and whose decomposition does not compute; with no dropout and only its output read,
  it becomes one `scaled_dot_product_attention` again: the same ATen kernel eagerly, and a
  Task whose decomposition is one function (`kope.frontend.partition.attention_task`).

Each rewrite is checked when it is made: the original nodes and the replacement run on seeded
random inputs of the nodes' shapes and must agree within the dtype's tolerance
(`kope.targets.verify.compare`); a rewrite that does not is logged and not made. (An attention
call becomes the op it was traced from: nothing to check.) The whole-graph
check (`kope.frontend.whole_graph`) then times the rewritten graph against eager like any other.
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

from kope.frontend.dispatch import RESHAPES, VIEW_OPS, has_symbols, subgraph, tensor_value
from kope.targets import verify
from kope.targets.stamp import Stamp
from kope.vocabulary.specs import TensorSpec

log = logging.getLogger("kope.compiler")

aten = torch.ops.aten
aten_mkldnn = torch.ops.mkldnn

# Set on the nodes a rewrite made; its value names the rewrite.
REWRITE = "kope_rewrite"
FOLDED_BATCH_NORM = "batch norm folded into the convolution before it"
FUSED_ATTENTION = "attention as one scaled_dot_product_attention"
CHANNELS_LAST = "convolutions computed channels-last"
FUSED_CONVOLUTION = "elementwise ops fused into the convolution before them (oneDNN)"
POINTWISE_CONVOLUTION = "1x1 convolution as a matrix product"
ATTENTION_CALL = "ATen's CPU attention as one scaled_dot_product_attention"


def rewrite(gm: fx.GraphModule, onednn: bool = True, attention: bool = True) -> list[str]:
    """Apply every rewrite to `gm`'s graph in place; the names of those made, one per site.
    `onednn` False leaves out the fusions into oneDNN's library calls, which only run (a
    module that must lower to MLIR whole cannot hold them); `attention` False, attention
    written out as one ATen attention call."""
    made = fold_batch_norms(gm.graph) + channels_last(gm.graph, fuse=onednn)
    made += pointwise_convolutions_as_matmuls(gm.graph)
    made += fuse_attention(gm.graph) if attention else []
    made += attention_calls(gm.graph)
    return [node.meta[REWRITE] for node in made]


# --- batch norm folded into a convolution -----------------------------------------------------

_BATCH_NORMS = frozenset(
    {
        aten._native_batch_norm_legit_no_training.default,
        aten.native_batch_norm.default,
        aten.batch_norm.default,
    }
)


# Set on the tensors a `_Kept` keeps.
_KEPT = "_kope_kept"


class _Kept:
    """A graph node's callable computing tensors from weights: the result is kept while its
    inputs are the same tensors, unwritten (identity and `kope.targets.stamp.Stamp`: layout,
    version counter, sampled memory), so a weight written in place after compiling, or a
    checkpoint loaded, is used on the next call."""

    name = ""

    def __init__(self) -> None:
        self.__name__ = self.name
        self._inputs: tuple[Any, ...] = ()
        self._stamps: tuple[Stamp | None, ...] = ()
        self._kept: Any = None
        self.computed = 0  # how many times the result was computed (tests read it)

    def compute(self, *inputs: Any) -> Any:
        raise NotImplementedError

    def __call__(self, *inputs: Any) -> Any:
        # A plain loop: this runs on every call.
        if self._kept is not None:
            for t, cached, stamp in zip(inputs, self._inputs, self._stamps, strict=True):
                if t is not cached or (stamp is not None and not stamp.holds(t)):
                    break
            else:
                return self._kept
        result = self.compute(*inputs)
        self.computed += 1
        # An inference tensor counts no writes: its result cannot be kept.
        if not any(t is not None and t.is_inference() for t in inputs):
            self._inputs = inputs
            # Another node's kept result (a folded weight to pack) is read by KOPE's graph
            # alone, never written: its identity says it is unchanged, without a stamp.
            self._stamps = tuple(
                None if t is None or getattr(t, _KEPT, False) else Stamp(t) for t in inputs
            )
            self._kept = result
            for t in result if isinstance(result, tuple) else (result,):
                setattr(t, _KEPT, True)
        return result


class FoldedBatchNorm(_Kept):
    """(weight, bias) of a convolution with the eval-mode batch norm after it folded in, from
    (weight, bias, gamma, beta, mean, var)."""

    name = "kope_folded_batch_norm"

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def compute(self, *inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return fold_batch_norm(inputs, self.eps)


class ChannelsLastWeight(_Kept):
    """A convolution's weight in channels-last strides (the layout oneDNN takes it in beside
    channels-last activations, without a reorder per call)."""

    name = "kope_channels_last_weight"

    def compute(self, *inputs: Any) -> torch.Tensor:
        (weight,) = inputs
        with torch.no_grad():
            return _channels_last(weight)


class PackedConvolutionWeight(_Kept):
    """A convolution's weight reordered once into oneDNN's own blocked layout for its
    geometry (`mkldnn._reorder_convolution_weight`), which its convolution then reads without
    reordering it per call."""

    name = "kope_packed_convolution_weight"

    def __init__(self, geometry: tuple[Any, ...]):
        super().__init__()
        self.geometry = geometry  # padding, stride, dilation, groups, input size

    def compute(self, *inputs: Any) -> torch.Tensor:
        (weight,) = inputs
        with torch.no_grad():
            packed: torch.Tensor = aten_mkldnn._reorder_convolution_weight(weight, *self.geometry)
            return packed


class FoldedPackedWeight(_Kept):
    """A batch norm folded into the convolution before it and the folded weight packed for
    oneDNN (`FoldedBatchNorm` then `PackedConvolutionWeight`, one call and one check of the
    six sources): (packed weight, folded bias)."""

    name = "kope_folded_packed_weight"

    def __init__(self, eps: float, geometry: tuple[Any, ...]):
        super().__init__()
        self.eps = eps
        self.geometry = geometry

    def compute(self, *inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        weight, bias = fold_batch_norm(inputs, self.eps)
        with torch.no_grad():
            packed = aten_mkldnn._reorder_convolution_weight(weight, *self.geometry)
        return packed, bias


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


# --- convolutions channels-last -----------------------------------------------------------

_TO_NHWC = [0, 2, 3, 1]
_TO_NCHW = [0, 3, 1, 2]
# A region is computed channels-last when it has at least this many convolutions per layout
# copy; a copy out of an elementwise op read only outside the region does not count (its
# kernel writes its result transposed). Per node (1×32×28×28, 2-core AVX2): a convolution
# saves ~35 µs, its two views and its weight's check cost ~10, a copy 20-25 µs inside the
# graph whether ATen or a KOPE transpose kernel runs it (the kernel takes 10-12 µs alone, ATen
# 22-28: in the graph it reads what the other core's half of a convolution left in that
# core's cache). ResNet basic blocks, batch norms folded in every arm, NHWC over NCHW
# (`python benchmarks/channels_last.py`): one block (two convolutions, one copy in, the copy
# out in its last add and ReLU's kernel) 1.05× with KOPE's copies (0.96× with ATen's), two
# blocks 1.09×, four 1.11×; a lone convolution would pay one copy for one saving.
CONVS_PER_COPY = 2


def _nchw_convolution(node: fx.Node) -> bool:
    """A 2-D convolution of a float NCHW activation on the CPU with a weight from the graph,
    that eager runs with oneDNN, not depthwise: KOPE's own depthwise kernels take NCHW and
    beat oneDNN's (a depthwise-separable block's graph ran 1.55x eager's with them, 0.80x
    channels-last without)."""
    if node.op != "call_function" or node.target is not aten.convolution.default:
        return False
    args = _arguments(node)
    x, weight, val = tensor_value(args["input"]), tensor_value(args["weight"]), tensor_value(node)
    return (
        x is not None
        and weight is not None
        and val is not None
        # Of a shape-generic graph's moving shape: the rewrites would write one shape's sizes
        and not has_symbols([x, val])
        and not args["transposed"]
        and not (args["groups"] > 1 and args["groups"] == x.shape[1])
        and x.dim() == 4
        and weight.dim() == 4
        and x.dtype.is_floating_point
        and x.device.type == "cpu"
        and x.is_contiguous()
        and val.is_contiguous()
        and _eager_uses_onednn(x, weight, int(args["groups"]))
    )


# Eager runs a small convolution (batch 1, at most this many input elements, a kernel of at
# most 3x3, one group) with ATen's own im2col loops, not oneDNN, as ATen's convolution
# dispatch decides: there oneDNN is slower (1x8x10x12, 3x3: 24 µs ATen, 66 oneDNN here),
# channels-last or not, so such a convolution stays as eager runs it.
_SMALL_CONVOLUTION = 20480


def _eager_uses_onednn(x: torch.Tensor, weight: torch.Tensor, groups: int) -> bool:
    small_kernel = weight.shape[-1] <= 3 or weight.shape[-2] <= 3
    small = x.shape[0] == 1 and x.numel() <= _SMALL_CONVOLUTION
    return groups > 1 or not small_kernel or not small


def _nhwc_elementwise(node: fx.Node) -> bool:
    """An elementwise op of 4-D contiguous tensors that computes the same on their NHWC
    permutations: its tensor operands broadcast to its output, its other operands are
    numbers."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    val = tensor_value(node)
    op = node.target
    if torch.Tag.pointwise not in op.tags or node.kwargs or op.is_view or op._schema.is_mutable:
        return False
    if val is None or val.dim() != 4 or not val.is_contiguous() or val.device.type != "cpu":
        return False
    for arg in node.args:
        if isinstance(arg, fx.Node):
            operand = tensor_value(arg)
            if operand is None or operand.dim() > 4:
                return False
            trailing = val.shape[val.dim() - operand.dim() :]
            if any(a not in (1, b) for a, b in zip(operand.shape, trailing, strict=True)):
                return False
        elif not isinstance(arg, (int, float, bool)):
            return False
    return True


def _channels_last_regions(graph: fx.Graph) -> list[list[fx.Node]]:
    """Connected groups (in graph order) of NCHW convolutions and the elementwise ops that
    read them or each other, each with at least one convolution."""
    member = {n for n in graph.nodes if _nchw_convolution(n) or _nhwc_elementwise(n)}
    order = {n: i for i, n in enumerate(graph.nodes)}
    seen: set[fx.Node] = set()
    regions = []
    for start in graph.nodes:
        if start in seen or not _nchw_convolution(start):
            continue
        region, pending = {start}, [start]
        while pending:
            node = pending.pop()
            # A convolution joins through its activation only: its weight stays outside.
            inputs = [node.args[0]] if node.target is aten.convolution.default else node.args
            neighbours = [a for a in inputs if isinstance(a, fx.Node)] + list(node.users)
            for other in neighbours:
                if other in member and other not in region and _joins(other, node):
                    region.add(other)
                    pending.append(other)
        seen |= region
        regions.append(sorted(region, key=order.__getitem__))
    return regions


def _joins(other: fx.Node, node: fx.Node) -> bool:
    """Whether `other`, a neighbour of region member `node`, joins it: a convolution joins
    and is joined through its activation and its output only (a weight computed by an
    elementwise op stays NCHW). The relation is symmetric, so a region grown from any of its
    convolutions is the same region: a downsampling block's shortcut convolution, which reads
    the block's input and feeds its add, is in its block's region."""
    if other.target is aten.convolution.default:
        return other.args[0] is node or other in node.all_input_nodes
    if node.target is aten.convolution.default:
        return other in node.users or other is node.args[0]
    return True


# Elementwise ops of a channels-last region that oneDNN applies to a convolution's output as
# it writes it (their `attr` in `mkldnn._convolution_pointwise`; gelu's form is its algorithm).
_UNARY_EPILOGUES: dict[Any, str] = {
    aten.relu.default: "relu",
    aten.sigmoid.default: "sigmoid",
    aten.tanh.default: "tanh",
    aten.silu.default: "swish",
    aten.gelu.default: "gelu",
}


class _Epilogue:
    """Elementwise ops after a convolution that run inside it: a unary op, or an add of a
    tensor of the output's shape (`other`) optionally followed by a ReLU. `nodes` from the
    first op to the last, each the only user of the one before; `algorithm` is gelu's form
    for a unary op, the op after an add ("relu" or "") for an add."""

    def __init__(self, nodes: list[fx.Node], attr: str, algorithm: str, other: Any = None):
        self.nodes, self.attr, self.algorithm, self.other = nodes, attr, algorithm, other


def packed_convolutions_available() -> bool:
    """Whether this torch has oneDNN's fused convolutions (x86 and aarch64 CPU builds do)."""
    return torch._C._has_mkldnn and hasattr(aten_mkldnn, "_reorder_convolution_weight")


def _epilogue(conv: fx.Node, inside: set[fx.Node]) -> _Epilogue | None:
    """The ops after a float32 convolution of the region that oneDNN can fuse into it."""
    val = tensor_value(conv)
    if val is None or val.dtype != torch.float32 or len(conv.users) != 1:
        return None
    (user,) = conv.users
    if user not in inside:
        return None
    if user.target in _UNARY_EPILOGUES and len(user.args) == 1:
        approximate = user.kwargs.get("approximate", "none")
        if set(user.kwargs) - {"approximate"} or approximate not in ("none", "tanh"):
            return None
        algorithm = str(approximate) if user.target is aten.gelu.default else ""
        return _Epilogue([user], _UNARY_EPILOGUES[user.target], algorithm)
    if user.target is not aten.add.Tensor or user.kwargs.get("alpha", 1) != 1:
        return None
    others = [a for a in user.args if a is not conv]
    if len(user.args) != 2 or len(others) != 1 or not isinstance(others[0], fx.Node):
        return None
    other = tensor_value(others[0])
    if other is None or other.shape != val.shape or other.dtype != val.dtype:
        return None
    nodes = [user]
    after = list(user.users)
    if len(after) == 1 and after[0] in inside and after[0].target is aten.relu.default:
        nodes.append(after[0])
    return _Epilogue(nodes, "add", "relu" if len(nodes) == 2 else "", others[0])


def _fake_binary(x: Any, other: Any, weight: Any, bias: Any, *args: Any) -> Any:
    """The output of `mkldnn._convolution_pointwise.binary` (which has no fake kernel): its
    unary form's, which has."""
    padding, stride, dilation, groups = args[:4]
    return aten_mkldnn._convolution_pointwise.default(
        x, weight, bias, padding, stride, dilation, groups, "none", [], ""
    )


def _copies(region: list[fx.Node]) -> tuple[list[fx.Node], list[fx.Node]]:
    """The 4-D tensors a region reads whole from outside (each copied to NHWC once) and its
    members read outside it (each copied back once)."""
    inside = set(region)
    entering: dict[fx.Node, None] = {}
    for node in region:
        operands = [node.args[0]] if node.target is aten.convolution.default else node.args
        for arg in operands:
            if isinstance(arg, fx.Node) and arg not in inside and _whole(arg, node):
                entering[arg] = None
    leaving = [n for n in region if any(user not in inside for user in n.users)]
    return list(entering), leaving


def _whole(arg: fx.Node, node: fx.Node) -> bool:
    """Whether operand `arg` of `node` is as large as its output (else it is broadcast)."""
    operand, val = tensor_value(arg), tensor_value(node)
    return (
        operand is not None
        and val is not None
        and operand.dim() == 4
        and (operand.numel() == val.numel() or node.target is aten.convolution.default)
    )


def channels_last(
    graph: fx.Graph, convs_per_copy: float = CONVS_PER_COPY, fuse: bool = True
) -> list[fx.Node]:
    """Compute on NHWC tensors each region with at least `convs_per_copy` convolutions per
    layout copy, with the elementwise ops after each convolution fused into it where oneDNN
    can (`fuse`, where this torch has oneDNN); one node per region rewritten and one per
    fused convolution."""
    fuse = fuse and packed_convolutions_available()
    made = []
    for region in _channels_last_regions(graph):
        entering, leaving = _copies(region)
        convolutions = sum(n.target is aten.convolution.default for n in region)
        # A copy out of an elementwise op read only outside the region costs no pass of its
        # own: the op's kernel writes its result transposed
        # (`kope.frontend.partition.fused_groups`).
        inside = set(region)
        fused = [
            n
            for n in leaving
            if n.target is not aten.convolution.default and all(u not in inside for u in n.users)
        ]
        copies = len(entering) + len(leaving) - len(fused)
        if convolutions < convs_per_copy * copies:
            log.debug("convolutions kept NCHW: %d of them, %d layout copies", convolutions, copies)
            continue
        rewritten = _rewrite_channels_last(graph, region, entering, leaving, fuse)
        if not rewritten and fuse:  # a fused convolution disagreed: the region without them
            rewritten = _rewrite_channels_last(graph, region, entering, leaving, False)
        made += rewritten
    _packing_folded_in(graph)
    return made


def _packing_folded_in(graph: fx.Graph) -> None:
    """Each folded weight read only by its packing is packed by the fold's node: one kept
    node per convolution, not two (each is a Python call and a check per graph call, 4-6 µs
    in the ResNet block's graph after a convolution)."""
    for pack in list(graph.nodes):
        if not isinstance(pack.target, PackedConvolutionWeight):
            continue
        weight = pack.args[0]
        if not (
            isinstance(weight, fx.Node)
            and weight.target is operator.getitem
            and weight.args[1] == 0
            and len(weight.users) == 1
        ):
            continue
        fold = weight.args[0]
        assert isinstance(fold, fx.Node)
        if not isinstance(fold.target, FoldedBatchNorm):
            continue
        fold.target = FoldedPackedWeight(fold.target.eps, pack.target.geometry)
        fold.meta["val"] = (pack.meta["val"], fold.meta["val"][1])
        weight.meta["val"] = pack.meta["val"]
        pack.replace_all_uses_with(weight)
        graph.erase_node(pack)


def _channels_last(weight: torch.Tensor) -> torch.Tensor:
    return weight.contiguous(memory_format=torch.channels_last)


def _fake_call(target: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """`target`'s value on the fake values of `args` (nodes) and literals."""
    values = [tensor_value(a) if isinstance(a, fx.Node) else a for a in args]
    mode = detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])
    assert mode is not None, "an aten graph's values are fake tensors"
    with mode:
        out: torch.Tensor = target(*values, **kwargs)
    return out


def _rewrite_channels_last(
    graph: fx.Graph,
    region: list[fx.Node],
    entering: list[fx.Node],
    leaving: list[fx.Node],
    fuse: bool,
) -> list[fx.Node]:
    """Rewrite one region to NHWC, checked against the original on seeded random inputs; its
    first channels-last weight and its fused convolutions, or [] (graph unchanged) if the two
    disagree."""
    inside = set(region)
    made: list[fx.Node] = []
    marker: fx.Node | None = None  # what the report counts: the region's first weight
    nhwc: dict[fx.Node, fx.Node] = {}  # a region member or entering tensor -> its NHWC value

    def call(
        target: Any, *args: Any, fake: Any = None, rewrite: bool = False, **kwargs: Any
    ) -> fx.Node:
        node = graph.call_function(target, tuple(args), kwargs)
        node.meta["val"] = _fake_call(fake or target, *args, **kwargs)
        if rewrite:  # the rewrite's own steps, not operators of the model
            node.meta[REWRITE] = CHANNELS_LAST
        made.append(node)
        return node

    def copy(tensor: fx.Node, permutation: list[int]) -> fx.Node:
        # A transpose Task of its own (`kope.frontend.partition` takes the pair as one group):
        # linalg lowers it where `permute_copy` does not, and its input is contiguous.
        view = call(aten.permute.default, tensor, permutation, rewrite=True)
        return call(aten.clone.default, view, rewrite=True, memory_format=torch.contiguous_format)

    def operand(arg: Any, user: fx.Node) -> Any:
        if not isinstance(arg, fx.Node):
            return arg
        if arg in nhwc:
            return nhwc[arg]
        if arg not in inside and _whole(arg, user):
            nhwc[arg] = copy(arg, _TO_NHWC)
            return nhwc[arg]
        val = tensor_value(arg)
        assert val is not None
        if val.dim() == 0:
            return arg
        # Broadcast (a bias per channel, a scale per sample): the same permutation, as a view.
        full = arg
        if val.dim() < 4:
            full = call(aten.view.default, arg, [1] * (4 - val.dim()) + list(val.shape))
        return call(aten.permute.default, full, _TO_NHWC)

    nchw: dict[fx.Node, fx.Node] = {}  # an NHWC value -> its NCHW view, made once

    def as_nchw(value: fx.Node) -> fx.Node:
        # A convolution's product viewed NHWC is read as the product itself: a second
        # permute back cost a Python call, 3 µs alone and 12 in the graph after a convolution.
        if value.target is aten.permute.default and value.args[1] == _TO_NHWC:
            source = value.args[0]
            assert isinstance(source, fx.Node)
            return source
        if value not in nchw:
            nchw[value] = call(aten.permute.default, value, _TO_NCHW)
        return nchw[value]

    # A convolution with an epilogue is made where its last op was, once every input of the
    # epilogue exists: its activation, made where it was, waits here, keyed by that op.
    fusing: dict[fx.Node, tuple[fx.Node, fx.Node, _Epilogue]] = {}
    absorbed: set[fx.Node] = set()
    for node in region:
        if node in absorbed:
            continue
        with graph.inserting_before(node):
            if node in fusing:
                conv, activation, epilogue = fusing[node]
                args = _positional(conv)
                padding, stride, dilation, groups = args[4], args[3], args[5], args[8]
                geometry = (padding, stride, dilation, groups, list(_shape(activation)))
                weight = call(
                    PackedConvolutionWeight(geometry), args[1], fake=_channels_last, rewrite=True
                )
                marker = marker or weight
                tail = (padding, stride, dilation, groups)
                if epilogue.other is None:
                    fused = call(
                        aten_mkldnn._convolution_pointwise.default,
                        activation,
                        weight,
                        args[2],
                        *tail,
                        epilogue.attr,
                        [],
                        epilogue.algorithm,
                    )
                else:
                    first = epilogue.nodes[0]
                    other = as_nchw(operand(epilogue.other, first))
                    fused = call(
                        aten_mkldnn._convolution_pointwise.binary,
                        activation,
                        other,
                        weight,
                        args[2],
                        *tail,
                        epilogue.attr,
                        1.0,
                        epilogue.algorithm or None,
                        [],
                        "",
                        fake=_fake_binary,
                    )
                fused.meta[REWRITE] = FUSED_CONVOLUTION
                nhwc[node] = call(aten.permute.default, fused, _TO_NHWC)
            elif node.target is aten.convolution.default:
                args = _positional(node)
                activation = as_nchw(operand(args[0], node))
                found = _epilogue(node, inside) if fuse else None
                # An add of two convolutions (a downsampling block's residual) is the first's.
                if found is not None and not any(n in absorbed or n in fusing for n in found.nodes):
                    fusing[found.nodes[-1]] = (node, activation, found)
                    absorbed.update(found.nodes[:-1])
                    continue
                weight = call(ChannelsLastWeight(), args[1], fake=_channels_last, rewrite=True)
                marker = marker or weight
                conv = call(aten.convolution.default, activation, weight, *args[2:])
                nhwc[node] = call(aten.permute.default, conv, _TO_NHWC)
            else:
                nhwc[node] = call(node.target, *[operand(a, node) for a in node.args])
    back = {}
    for node in leaving:
        with graph.inserting_before(node):  # after its NHWC value, made before it
            back[node] = copy(nhwc[node], _TO_NCHW)
    inputs = list(dict.fromkeys(a for n in region for a in n.all_input_nodes if a not in inside))
    with unset_fake_temporarily():
        agrees = all(_region_agrees(inputs, region, made, node, back[node]) for node in leaving)
    if not agrees:
        for node in reversed(made):
            graph.erase_node(node)
        return []
    for node in leaving:
        node.replace_all_uses_with(back[node], delete_user_cb=lambda user: user not in inside)
    for node in reversed(region):
        graph.erase_node(node)
    for node in reversed(made):  # NHWC views of products only ever read as the products
        if not node.users and node.target is aten.permute.default:
            graph.erase_node(node)
    assert marker is not None, "a region has a convolution"
    return [marker] + [n for n in made if n.meta.get(REWRITE) == FUSED_CONVOLUTION]


def _region_agrees(
    inputs: list[fx.Node], region: list[fx.Node], made: list[fx.Node], old: fx.Node, new: fx.Node
) -> bool:
    order = {n: i for i, n in enumerate(old.graph.nodes)}
    values = _random_values(inputs)
    want = subgraph(inputs, region, old)(*values)
    got = subgraph(inputs, sorted(made, key=order.__getitem__), new)(*values)
    weights = [tensor_value(n.args[1]) for n in region if n.target is aten.convolution.default]
    reduction = max(int(w[0].numel()) for w in weights if w is not None)
    return _agrees(CHANNELS_LAST, got, want, reduction)


# --- pointwise convolutions as matrix products --------------------------------------------------


def _pointwise_convolution(node: fx.Node) -> bool:
    """An NCHW convolution eager runs with oneDNN (`_nchw_convolution`) with a 1x1 kernel,
    stride 1, no padding and one group: a matrix product of its weight and each sample's
    (channels x positions) view. 1-D ones stay convolutions: over four shapes the product was
    0.94-2.0x their convolution on two threads and 0.87-0.99x on one (eager's 1-D path is not
    oneDNN's NCHW reorder)."""
    if not _nchw_convolution(node):
        return False
    args = _arguments(node)
    weight = tensor_value(args["weight"])
    assert weight is not None  # `_nchw_convolution` checked it
    return (
        all(k == 1 for k in weight.shape[2:])
        and all(s == 1 for s in args["stride"])
        and all(p == 0 for p in args["padding"])
        and args["groups"] == 1
        and weight.is_contiguous()
        and (args["bias"] is None or isinstance(args["bias"], fx.Node))
    )


def pointwise_convolutions_as_matmuls(graph: fx.Graph) -> list[fx.Node]:
    """Compute each pointwise convolution (`_pointwise_convolution`) as the product of its
    weight and the activation's (channels x positions) view, its bias added after; the
    products made.

    oneDNN runs such a convolution on NCHW activations by reordering them to its blocked
    layout and back on every call, and on two threads it was slower than on one: a 1x1
    32->64 convolution at 28x28 took 145 µs on 2 threads, 62 on 1, where the same product as
    `addmm` took 55 and 64; batch 4, 669 against 137 (2-core AVX2). Over eight shapes from
    MobileNet and ResNet bottleneck blocks the product was 0.94-1.01x the convolution on one
    thread and 0.87-4.9x on two (geomean 1.7x); the whole-graph check keeps a graph where it
    loses from running slower than eager. A product is also a Task the agent's
    matmul schedules and epilogues take. Convolutions inside a channels-last region are not
    here: they were fused with their epilogue into oneDNN calls on a packed weight."""
    made = []
    for conv in list(graph.nodes):
        if not _pointwise_convolution(conv):
            continue
        args = _arguments(conv)
        nodes, product, out = _as_product(graph, conv, args)
        inputs = [args[n] for n in ("input", "weight", "bias") if isinstance(args[n], fx.Node)]
        with unset_fake_temporarily():  # a backend may compile under a fake mode
            values = _random_values(inputs)
            want = subgraph(inputs, [conv], conv)(*values)
            got = subgraph(inputs, nodes, out)(*values)
            agrees = _agrees(POINTWISE_CONVOLUTION, got, want, reduction=_shape(inputs[0])[1])
        if not agrees:
            for node in reversed(nodes):
                graph.erase_node(node)
            continue
        conv.replace_all_uses_with(out)
        graph.erase_node(conv)
        made.append(product)
    return made


def _as_product(
    graph: fx.Graph, conv: fx.Node, args: dict[str, Any]
) -> tuple[list[fx.Node], fx.Node, fx.Node]:
    """The nodes computing the pointwise convolution `conv` as a product, made before it;
    the product among them and the result."""
    x, weight, bias = args["input"], args["weight"], args["bias"]
    val = tensor_value(conv)
    assert val is not None
    batch, out_channels = val.shape[0], val.shape[1]
    channels = _shape(x)[1]
    positions = val.numel() // (batch * out_channels)
    nodes: list[fx.Node] = []

    def call(target: Any, *call_args: Any) -> fx.Node:
        node = graph.call_function(target, tuple(call_args))
        node.meta["val"] = _fake_call(target, *call_args)
        nodes.append(node)
        return node

    with graph.inserting_before(conv):
        matrix = call(aten.view.default, weight, [out_channels, channels])
        if batch == 1:
            columns = call(aten.view.default, x, [channels, positions])
            product = call(aten.mm.default, matrix, columns)
        else:
            # One weight for every sample: a batch of products reading it with stride 0.
            columns = call(aten.view.default, x, [batch, channels, positions])
            weights = call(aten.expand.default, matrix, [batch, out_channels, channels])
            product = call(aten.bmm.default, weights, columns)
        product.meta[REWRITE] = POINTWISE_CONVOLUTION
        result = product
        if bias is not None:
            column = call(aten.view.default, bias, [out_channels, 1])
            result = call(aten.add.Tensor, product, column)
        out = call(aten.view.default, result, list(val.shape))
    return nodes, product, out


# --- attention as one kernel ------------------------------------------------------------------

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
    val = tensor_value(node)
    return tuple(val.shape) if val is not None else ()


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
    """A matched attention: q, k, v, its nodes from them to its output, its scale, and the
    boolean mask whose True scores it fills with -inf, if any (with its value where it is a
    constant)."""

    def __init__(
        self,
        qkv: list[fx.Node],
        nodes: list[fx.Node],
        out: fx.Node,
        scale: float,
        mask: tuple[fx.Node, torch.Tensor | None] | None = None,
    ):
        self.qkv, self.nodes, self.out, self.scale, self.mask = qkv, nodes, out, scale, mask
        # The scores kept, as SDPA's boolean mask says it (True: kept): the fill's inverted;
        # and whether the mask is causal: True (filled) above the diagonal, exactly.
        self.kept: torch.Tensor | None = None
        self.causal = False
        if mask is not None and mask[1] is not None:
            with unset_fake_temporarily():  # a backend may compile under a fake mode
                value = mask[1]
                self.kept = ~value
                self.causal = value.dim() == 2 and bool(
                    torch.equal(value, torch.ones_like(value).triu(1))
                )

    def kwargs(self, keep: Any = None) -> dict[str, Any]:
        """The fused call's keyword arguments; `keep` the mask of scores kept, where the mask
        is not causal."""
        if self.causal:
            return {"scale": self.scale, "is_causal": True}
        if self.mask is not None:
            return {"scale": self.scale, "attn_mask": keep}
        return {"scale": self.scale}


def _attention_at(softmax: fx.Node) -> _Attention | None:
    """The attention whose softmax this is; None if it is not one: softmax(masked(view(bmm(q',
    kᵀ')) · scale)) → (expand) → view → bmm(·, v') → view, where q', kᵀ', v' are matmul's
    batched views of rank-4 q, kᵀ and v, the scale is on either side of the view, and masked
    (optional) fills with -inf where a constant boolean mask is True (a causal mask by hand)."""
    args: Any = softmax.args
    if args[2] is not False or int(args[1]) % 4 != 3 or len(_shape(softmax)) != 4:
        return None
    nodes = [softmax]
    scores = _input(softmax)
    mask = _constant_mask(scores)
    if mask is not None and scores is not None:
        nodes.append(scores)  # the masked_fill
        scores = _input(scores)
    scale = 1.0

    def scaled(node: fx.Node | None) -> fx.Node | None:
        nonlocal scale
        scaling = _calls(node, frozenset(_SCALES))
        factor: Any = scaling.args[1] if scaling is not None else None
        if scaling is None or len(scaling.users) != 1 or not isinstance(factor, (int, float)):
            return node
        scale = _SCALES[scaling.target](float(factor))
        nodes.append(scaling)
        return _input(scaling)

    scores = _calls(scaled(scores), RESHAPES)
    if scores is None or len(scores.users) != 1:
        return None
    inner = scaled(_input(scores)) if scale == 1.0 else _input(scores)
    first = _calls(inner, aten.bmm.default)
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
    if mask is not None and not _broadcasts(_shape(mask[0]), _shape(softmax)):
        return None
    return _Attention([q, k, v], sorted(set(nodes), key=order.__getitem__), out, scale, mask)


def _constant_mask(node: fx.Node | None) -> tuple[fx.Node, torch.Tensor | None] | None:
    """(the mask node, its value where it is a constant: one KOPE folded) where `node` is
    masked_fill(x, mask, -inf) of a boolean mask, and x's only user."""
    fill = _calls(node, aten.masked_fill.Scalar)
    if fill is None or len(fill.args) < 3 or fill.args[2] != float("-inf"):
        return None
    mask, scores = fill.args[1], _input(fill)
    if not isinstance(mask, fx.Node) or scores is None or len(scores.users) != 1:
        return None
    val = tensor_value(mask)
    if val is None or val.dtype != torch.bool:
        return None
    if mask.op != "get_attr":
        return mask, None
    try:
        value = operator.attrgetter(str(mask.target))(fill.graph.owning_module)
    except AttributeError:
        return None
    return (mask, value) if isinstance(value, torch.Tensor) else None


def _broadcasts(shape: Sequence[int], full: Sequence[int]) -> bool:
    """Whether a tensor of `shape` broadcasts to `full` without growing its rank beyond."""
    if len(shape) > len(full):
        return False
    return all(m in (1, f) for m, f in zip(reversed(shape), reversed(full), strict=False))


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
        keep = None
        if found.mask is not None and found.kept is not None and not found.causal:
            keep = _constant(graph, f"{found.mask[0].target}_kept", found.kept, out)
        elif found.mask is not None and found.kept is None:  # computed: inverted as it runs
            with graph.inserting_before(out):
                keep = graph.call_function(aten.logical_not.default, (found.mask[0],))
            mode = detect_fake_mode([found.mask[0].meta["val"]])
            assert mode is not None
            with mode:
                keep.meta["val"] = aten.logical_not.default(found.mask[0].meta["val"])
        val = _fake_attention(found)
        with graph.inserting_after(out):
            fused = graph.call_function(
                aten.scaled_dot_product_attention.default,
                tuple(found.qkv),
                found.kwargs(keep),
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
    mask = found.mask[0].meta["val"] if found.mask is not None else None
    keep = None if found.kept is None else mode.from_tensor(found.kept, static_shapes=True)
    with mode:
        if mask is not None and keep is None:
            keep = aten.logical_not.default(mask)
        out: torch.Tensor = aten.scaled_dot_product_attention.default(*values, **found.kwargs(keep))
    return out


def _constant(graph: fx.Graph, name: str, value: torch.Tensor, before: fx.Node) -> fx.Node:
    """A constant of the graph's module, read by a new get_attr node inserted before
    `before`."""
    owner = graph.owning_module
    assert owner is not None
    base, index = name.replace(".", "_"), 0
    while hasattr(owner, f"{base}{index}"):
        index += 1
    owner.register_buffer(f"{base}{index}", value, persistent=False)
    with graph.inserting_before(before):
        node = graph.get_attr(f"{base}{index}")
    mode = detect_fake_mode([before.meta.get("val")])
    node.meta["val"] = mode.from_tensor(value, static_shapes=True) if mode is not None else value
    return node


_CPU_ATTENTION = aten._scaled_dot_product_flash_attention_for_cpu.default
_CPU_ATTENTION_ARGS = ("query", "key", "value", "dropout_p", "is_causal")


def attention_calls(graph: fx.Graph) -> list[fx.Node]:
    """Each call of ATen's CPU attention with no dropout, whose output alone is read,
    as one `scaled_dot_product_attention` (the op it was traced from); the new nodes."""
    made = []
    for node in list(graph.nodes):
        if _calls(node, _CPU_ATTENTION) is None:
            continue
        bound = {**dict(zip(_CPU_ATTENTION_ARGS, node.args, strict=False)), **node.kwargs}
        if bound.get("dropout_p", 0.0) != 0.0:
            continue
        users = list(node.users)
        outputs = [u for u in users if u.target is operator.getitem and u.args[1] == 0]
        unread = [u for u in users if u.target is operator.getitem and not u.users]
        if not outputs or len(set(outputs) | set(unread)) != len(users):
            continue
        kwargs = {
            "attn_mask": bound.get("attn_mask"),
            "is_causal": bool(bound.get("is_causal", False)),
            "scale": bound.get("scale"),
        }
        # ATen's CPU attention takes grouped heads (fewer of k and v than of q) as they are;
        # `scaled_dot_product_attention` only when asked to.
        query, key = (bound[name].meta.get("val") for name in ("query", "key"))
        if not isinstance(query, torch.Tensor) or not isinstance(key, torch.Tensor):
            continue
        if query.dim() == key.dim() == 4 and query.shape[1] != key.shape[1]:
            kwargs["enable_gqa"] = True
        with graph.inserting_after(node):
            call = graph.call_function(
                aten.scaled_dot_product_attention.default,
                (bound["query"], bound["key"], bound["value"]),
                kwargs,
            )
        call.meta["val"] = outputs[0].meta["val"]
        call.meta[REWRITE] = ATTENTION_CALL
        for user in users:
            user.replace_all_uses_with(call)
            graph.erase_node(user)
        graph.erase_node(node)
        made.append(call)
    return made


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
    if found.mask is None:
        want = subgraph(found.qkv, found.nodes, found.out)(*values)
        got = aten.scaled_dot_product_attention.default(*values, scale=found.scale)
        return _agrees(FUSED_ATTENTION, got, want, reduction=int(values[1].shape[2]))
    node, mask = found.mask
    kept = found.kept
    if mask is None:  # computed as the model runs: checked with a causal one of its shape
        shape = _shape(node)
        mask = torch.ones(shape[-2:], dtype=torch.bool).triu(1).expand(shape)
        kept = ~mask
    want = subgraph([*found.qkv, node], found.nodes, found.out)(*values, mask)
    got = aten.scaled_dot_product_attention.default(*values, **found.kwargs(kept))
    return _agrees(FUSED_ATTENTION, got, want, reduction=int(values[1].shape[2]))
