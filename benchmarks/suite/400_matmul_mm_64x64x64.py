"""Matrix multiply (torch.mm) of 64x64 by 64x64."""

import torch
import torch.nn as nn

M, K, N = 64, 64, 64


class Model(nn.Module):
    """a @ b"""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a, b)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs() -> list[int]:
    return []
