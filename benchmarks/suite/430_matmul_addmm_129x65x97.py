"""bias + a @ b (torch.addmm) of 129x65 by 65x97, with a broadcast row bias."""

import torch
import torch.nn as nn

M, K, N = 129, 65, 97


class Model(nn.Module):
    """torch.addmm(bias, a, b), bias of shape (N,)"""

    def forward(self, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.addmm(bias, a, b)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(N), torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs() -> list[int]:
    return []
