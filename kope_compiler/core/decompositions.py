"""Decompositions used when an operator does not lower as a whole, or lowers wrongly.

torch-mlir's table covers most of ATen. KOPE adds decompositions for the fused inference fast
paths PyTorch takes in eval mode, which torch-mlir does not lower
(`nn.TransformerEncoderLayer` → `aten._transformer_encoder_layer_fwd`).

`REFERENCE_DECOMPOSITIONS` are for operators torch-mlir lowers to something other than what
eager computes: their Task stays the ATen operator (its eager call, label and baseline), but
its reference lowering is imported from the decomposition (`kope.core.lowering.import_group`).
torch-mlir picks the index of argmax, argmin, max.dim and min.dim with an ordered compare against
the running extreme (`arith.cmpf ogt`/`olt`), which a NaN never wins and which nothing wins once
the extreme is NaN, so a row with a NaN gets the index of its extreme before the first NaN;
eager takes a NaN for the extreme and returns the first NaN's index. Its clamp, hardtanh (relu6),
threshold, maximum and minimum turn a NaN into a number; eager keeps it. Its ELU computes
`exp(x) - 1`, which loses what eager's `expm1` keeps for x near 0. PyTorch's own decomposition
of the CPU attention masks a causal attention's hidden keys by adding -inf, which makes a hidden
+inf score NaN where eager hides it.

Interpolations (`F.interpolate`) are native kernels in eager, but PyTorch's tracer takes them
apart: Python kernels registered at the Autograd and CompositeImplicitAutograd keys, which run
under aot_autograd's Python dispatcher, trace a 1x3x16x16 bicubic upsample as ~160 index,
clamp and arithmetic nodes before any partitioner sees it. `traced_whole` keeps them one node
each while KOPE traces, so that the partition imports them at the coarsest level torch-mlir
lowers; the decompositions the tracer would have applied join `decomposition_table` for those
torch-mlir does not lower whole.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._decomp
import torch.nn.functional as F
from torch_mlir.extras.fx_decomp_util import get_decomposition_table

aten = torch.ops.aten


def _self_attention(
    x: torch.Tensor,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
) -> torch.Tensor:
    batch, length, embed = x.shape
    head_dim = embed // num_heads
    qkv = F.linear(x, qkv_weight, qkv_bias)
    q, k, v = (
        t.reshape(batch, length, num_heads, head_dim).transpose(1, 2)
        for t in torch.split(qkv, embed, dim=-1)
    )
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_dim)
    attended = torch.matmul(torch.softmax(scores, dim=-1), v)
    merged = attended.transpose(1, 2).reshape(batch, length, embed)
    return F.linear(merged, proj_weight, proj_bias)


def transformer_encoder_layer_fwd(
    src: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: torch.Tensor,
    norm_bias_1: torch.Tensor,
    norm_weight_2: torch.Tensor,
    norm_bias_2: torch.Tensor,
    ffn_weight_1: torch.Tensor,
    ffn_bias_1: torch.Tensor,
    ffn_weight_2: torch.Tensor,
    ffn_bias_2: torch.Tensor,
    mask: torch.Tensor | None = None,
    mask_type: int | None = None,
) -> torch.Tensor:
    """The eval fast path of `nn.TransformerEncoderLayer` in plain ATen ops (no masks)."""
    if mask is not None:
        raise NotImplementedError("attention masks are not decomposed")
    if src.dim() != 3:
        raise NotImplementedError("only batched (3-D) inputs are decomposed")

    def attention(x: torch.Tensor) -> torch.Tensor:
        return _self_attention(x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias)

    def feed_forward(x: torch.Tensor) -> torch.Tensor:
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
        return F.linear(hidden, ffn_weight_2, ffn_bias_2)

    def norm1(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)

    def norm2(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)

    x = src
    if norm_first:
        x = x + attention(norm1(x))
        return x + feed_forward(norm2(x))
    x = norm1(x + attention(x))
    return norm2(x + feed_forward(x))


_KOPE_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
}


def _first_extreme(x: torch.Tensor, dim: int | None, keepdim: bool, extreme: Any) -> Any:
    """(values, indices) of `extreme` (`torch.amax` or `torch.amin`) of a floating `x` along
    `dim` (all elements when None), the indices those of the first element equal to the
    extreme or NaN, as eager's argmax and argmin choose them (amax and amin propagate a NaN,
    so a row with one has NaN for its extreme and only NaNs are hits). NotImplemented for
    another `x` (integers lower exactly; a single element has index 0 either way): traced as
    the operator itself."""
    if not x.is_floating_point() or x.dim() == 0:
        return NotImplemented
    rank = x.dim()
    whole = dim is None
    if dim is None:
        x, dim = x.reshape(-1), 0
    dim %= x.dim()
    size = x.shape[dim]
    values = extreme(x, dim, keepdim=True)
    hits = (x == values) | torch.isnan(x)
    place = [1] * x.dim()
    place[dim] = size
    positions = torch.arange(size, device=x.device).view(place)
    indices = torch.where(hits, positions, size).amin(dim, keepdim=keepdim)
    if whole and keepdim:  # all elements, dims kept: a 1x...x1 result
        values, indices = values.view([1] * rank), indices.view([1] * rank)
    return values if keepdim else values.squeeze(dim), indices


def argmax(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    """`aten.argmax` as eager computes it, NaN first (see `REFERENCE_DECOMPOSITIONS`)."""
    found = _first_extreme(x, dim, keepdim, torch.amax)
    return found if found is NotImplemented else found[1]


def argmin(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    """`aten.argmin` as eager computes it, NaN first (see `REFERENCE_DECOMPOSITIONS`)."""
    found = _first_extreme(x, dim, keepdim, torch.amin)
    return found if found is NotImplemented else found[1]


def max_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> Any:
    """`aten.max.dim` (values, indices) as eager computes it (see `REFERENCE_DECOMPOSITIONS`)."""
    return _first_extreme(x, dim, keepdim, torch.amax)


def min_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> Any:
    """`aten.min.dim` (values, indices) as eager computes it (see `REFERENCE_DECOMPOSITIONS`)."""
    return _first_extreme(x, dim, keepdim, torch.amin)


Bound = torch.Tensor | float | int | bool | None


def _bounded(x: torch.Tensor, bound: Bound, beyond: Callable[..., torch.Tensor]) -> torch.Tensor:
    """`x` with `bound` where `x` lies beyond it or the bound is NaN (a NaN in `x` stays)."""
    if bound is None:
        return x
    if isinstance(bound, torch.Tensor):
        take = beyond(x, bound) | (bound != bound)
    elif math.isnan(bound):
        take = torch.ones_like(x, dtype=torch.bool)
    else:
        take = beyond(x, bound)
    return torch.where(take, bound, x)


def clamp(x: torch.Tensor, lo: Bound = None, hi: Bound = None) -> torch.Tensor:
    """`aten.clamp` (Scalar and Tensor bounds) as eager computes it: a NaN in `x` or in a bound
    gives NaN; a low bound above the high one gives the high one (see
    `REFERENCE_DECOMPOSITIONS`)."""
    return _bounded(_bounded(x, lo, torch.lt), hi, torch.gt)


def clamp_min(x: torch.Tensor, lo: Bound) -> torch.Tensor:
    return clamp(x, lo, None)


def clamp_max(x: torch.Tensor, hi: Bound) -> torch.Tensor:
    return clamp(x, None, hi)


def hardtanh(x: torch.Tensor, lo: float = -1.0, hi: float = 1.0) -> torch.Tensor:
    return clamp(x, lo, hi)


def threshold(x: torch.Tensor, threshold: float, value: float) -> torch.Tensor:
    """`aten.threshold`: `value` where `x <= threshold`, a NaN kept."""
    return torch.where(x <= threshold, value, x)


def maximum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`aten.maximum`, NaN if either is."""
    return torch.where(a != a, a, torch.where((b != b) | (b > a), b, a))


def minimum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`aten.minimum`, NaN if either is."""
    return torch.where(a != a, a, torch.where((b != b) | (b < a), b, a))


def elu(x: torch.Tensor, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Any:
    """`aten.elu` (SELU and CELU are made of it) with `expm1`, as eager computes it: torch-mlir
    computes `exp(x) - 1`, which is 0 for x = -1e-8 (see `REFERENCE_DECOMPOSITIONS`)."""
    negative = torch.expm1(x * input_scale) * (alpha * scale)
    return torch.where(x > 0, x * scale, negative)


def celu(x: torch.Tensor, alpha: float = 1.0) -> Any:
    """`aten.celu`, as eager computes it: an ELU whose input is scaled by 1 / alpha."""
    return elu(x, alpha, 1.0, 1.0 / alpha)


def flash_attention_for_cpu(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> Any:
    """`aten._scaled_dot_product_flash_attention_for_cpu` (what `scaled_dot_product_attention`
    runs on the CPU) as eager computes it: a key the causal mask hides has its score set to
    -inf, where PyTorch's decomposition adds -inf, which makes a hidden +inf score NaN and
    the row NaN (eager: the row's visible keys only); a row with every score -inf attends to
    nothing (0). The output in eager's layout (q's: heads inner or not), with the log-sum-exp
    of each row's scores. NotImplemented with dropout."""
    if dropout_p != 0.0:
        return NotImplemented
    if key.shape[1] != query.shape[1]:  # grouped heads: each group's k and v shared
        groups = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    factor = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    root = math.sqrt(factor)  # both operands scaled by the root, as eager's math path does
    scores = torch.matmul(query * root, (key * root).transpose(-2, -1))
    if attn_mask is not None:
        scores = scores + attn_mask  # a boolean mask reaches here as 0 / -inf, as in eager
    if is_causal:
        rows = torch.arange(query.shape[-2], device=query.device).unsqueeze(-1)
        hidden = torch.arange(key.shape[-2], device=query.device) > rows  # top-left aligned
        scores = torch.where(hidden, -math.inf, scores)
    weights = torch.softmax(scores, dim=-1)
    nothing = (scores == -math.inf).all(dim=-1, keepdim=True)
    output = torch.matmul(torch.where(nothing, 0.0, weights), value)
    if query.transpose(1, 2).is_contiguous() and not query.is_contiguous():
        output = output.transpose(1, 2).contiguous().transpose(1, 2)  # q's layout, as eager's
    return output, torch.logsumexp(scores, dim=-1)


# Operators whose torch-mlir lowering computes something else than eager: their reference
# lowering is imported from these (see the module docstring).
REFERENCE_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten.argmax.default: argmax,
    aten.argmin.default: argmin,
    aten.max.dim: max_dim,
    aten.min.dim: min_dim,
    # torch-mlir clamps with maxnumf/minnumf, which turn a NaN into the bound
    aten.clamp.default: clamp,
    aten.clamp.Tensor: clamp,
    aten.clamp_min.default: clamp_min,
    aten.clamp_min.Tensor: clamp_min,
    aten.clamp_max.default: clamp_max,
    aten.clamp_max.Tensor: clamp_max,
    aten.hardtanh.default: hardtanh,
    aten.threshold.default: threshold,
    aten.maximum.default: maximum,
    aten.minimum.default: minimum,
    aten.elu.default: elu,  # torch-mlir's exp(x) - 1 loses what expm1 keeps near 0
    aten.celu.default: celu,
    aten._scaled_dot_product_flash_attention_for_cpu.default: flash_attention_for_cpu,
}


FAST_PATHS = frozenset(_KOPE_DECOMPOSITIONS)  # fused eager kernels, faster whole than in parts

# Interpolations the tracer would take apart (see the module docstring), by their `default`
# (sizes) and `vec` (sizes or scales) overloads; the anti-aliased ones are left out, as their
# Python kernels call the native op.
_INTERPOLATIONS = (
    aten.upsample_nearest1d,
    aten.upsample_nearest2d,
    aten.upsample_nearest3d,
    aten._upsample_nearest_exact1d,
    aten._upsample_nearest_exact2d,
    aten._upsample_nearest_exact3d,
    aten.upsample_linear1d,
    aten.upsample_bilinear2d,
    aten.upsample_bicubic2d,
    aten.upsample_trilinear3d,
)
_DECOMPOSING_KEYS = (
    torch._C.DispatchKey.Autograd,
    torch._C.DispatchKey.CompositeImplicitAutograd,
)


@contextlib.contextmanager
def traced_whole() -> Iterator[None]:
    """While tracing, interpolations stay one node each: their Python kernels at the keys
    that decompose them are set aside (the C++ kernels below run, as in eager), and put back
    after. torch.export preserves operators the same way."""
    overloads = [op for packet in _INTERPOLATIONS for op in (packet.default, packet.vec)]
    set_aside = {
        op: {k: op.py_kernels.pop(k) for k in _DECOMPOSING_KEYS if k in op.py_kernels}
        for op in overloads
    }
    for op in overloads:
        op._dispatch_cache.clear()  # it remembers the Python kernel it resolved to
    try:
        yield
    finally:
        for op, kernels in set_aside.items():
            op.py_kernels.update(kernels)
            op._dispatch_cache.clear()


@functools.cache
def decomposition_table(fast_paths: bool = True) -> dict[Any, Callable[..., Any]]:
    """torch-mlir's decomposition table, plus PyTorch's for the interpolations `traced_whole`
    keeps (where torch-mlir's has none), plus KOPE's for fused fast paths if `fast_paths`."""
    table = dict(get_decomposition_table())
    for packet in _INTERPOLATIONS:
        decomposition = torch._decomp.decomposition_table.get(packet.default)
        if decomposition is not None:
            table.setdefault(packet.default, decomposition)
    if fast_paths:
        table.update(_KOPE_DECOMPOSITIONS)
    return table
