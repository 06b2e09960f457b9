"""Causal attention, scaled_dot_product_attention(q, k, v, is_causal=True): batch 2, 8 heads,
128 tokens, head dim 64 (a decoder's self-attention)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, HEADS, TOKENS, HEAD_DIM = 2, 8, 128, 64


class Model(nn.Module):
    """F.scaled_dot_product_attention(q, k, v, is_causal=True)"""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs() -> list[torch.Tensor]:
    shape = (BATCH, HEADS, TOKENS, HEAD_DIM)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs() -> list[int]:
    return []
