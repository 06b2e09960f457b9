"""Batched matrix multiply (torch.bmm) of 8 64x64 by 64x64 products."""

import torch
import torch.nn as nn

B, M, K, N = 8, 64, 64, 64


class Model(nn.Module):
    """torch.bmm(a, b)"""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(B, M, K), torch.randn(B, K, N)]


def get_init_inputs() -> list[int]:
    return []
