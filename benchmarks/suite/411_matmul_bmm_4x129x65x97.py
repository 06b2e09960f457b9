"""Batched matrix multiply (torch.bmm) of 4 129x65 by 65x97 products."""

import torch
import torch.nn as nn

B, M, K, N = 4, 129, 65, 97


class Model(nn.Module):
    """torch.bmm(a, b)"""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(B, M, K), torch.randn(B, K, N)]


def get_init_inputs() -> list[int]:
    return []
