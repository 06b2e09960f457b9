"""Attention probabilities softmax(q @ k^T / sqrt(d)): batch 2, 8 heads, 128 tokens, head dim 64."""

import math

import torch
import torch.nn as nn

BATCH, HEADS, TOKENS, HEAD_DIM = 2, 8, 128, 64


class Model(nn.Module):
    """torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1), scale = 1 / sqrt(head_dim)"""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.scale = 1 / math.sqrt(head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1)


def get_inputs() -> list[torch.Tensor]:
    shape = (BATCH, HEADS, TOKENS, HEAD_DIM)
    return [torch.randn(shape), torch.randn(shape)]


def get_init_inputs() -> list[int]:
    return [HEAD_DIM]
