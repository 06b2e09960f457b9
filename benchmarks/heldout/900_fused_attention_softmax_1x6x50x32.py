"""Attention probabilities softmax(q @ k^T / sqrt(d)): batch 1, 6 heads, 50 tokens, head dim 32."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """torch.softmax(q @ k.transpose(-2, -1) * 32 ** -0.5, dim=-1)"""

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-2, -1) * 32**-0.5, dim=-1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(1, 6, 50, 32), torch.randn(1, 6, 50, 32)]


def get_init_inputs() -> list[int]:
    return []
