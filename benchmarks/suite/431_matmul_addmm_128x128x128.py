"""bias + a @ b (torch.addmm) of 128x128 by 128x128, with a broadcast row bias."""

import torch
import torch.nn as nn

M, K, N = 128, 128, 128


class Model(nn.Module):
    """torch.addmm(bias, a, b), bias of shape (N,)"""

    def forward(self, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.addmm(bias, a, b)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(N), torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs() -> list[int]:
    return []
