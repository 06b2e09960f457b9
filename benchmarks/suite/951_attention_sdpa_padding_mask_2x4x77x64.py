"""Attention with a padding mask, scaled_dot_product_attention(q, k, v, attn_mask): batch 2,
4 heads, 77 tokens, head dim 64, the second sequence's last 20 keys masked out (a BERT-style
encoder's self-attention over a padded batch)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, HEADS, TOKENS, HEAD_DIM = 2, 4, 77, 64


class Model(nn.Module):
    """F.scaled_dot_product_attention(q, k, v, attn_mask=keep), keep: B x 1 x 1 x keys, bool"""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor
    ) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def get_inputs() -> list[torch.Tensor]:
    shape = (BATCH, HEADS, TOKENS, HEAD_DIM)
    keep = torch.ones(BATCH, 1, 1, TOKENS, dtype=torch.bool)
    keep[1, ..., TOKENS - 20 :] = False
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape), keep]


def get_init_inputs() -> list[int]:
    return []
