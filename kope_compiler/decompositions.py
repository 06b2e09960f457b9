"""Decompositions used when an operator does not lower as a whole.

torch-mlir's table covers most of ATen. KOPE adds decompositions for the fused inference fast
paths PyTorch takes in eval mode, which torch-mlir does not lower
(`nn.TransformerEncoderLayer` → `aten._transformer_encoder_layer_fwd`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
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


FAST_PATHS = frozenset(_KOPE_DECOMPOSITIONS)  # fused eager kernels, faster whole than in parts


@functools.cache
def decomposition_table(fast_paths: bool = True) -> dict[Any, Callable[..., Any]]:
    """torch-mlir's decomposition table, plus KOPE's for fused fast paths if `fast_paths`."""
    table = dict(get_decomposition_table())
    if fast_paths:
        table.update(_KOPE_DECOMPOSITIONS)
    return table
