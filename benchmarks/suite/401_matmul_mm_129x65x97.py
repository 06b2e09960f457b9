"""Matrix multiply (torch.mm) of 129x65 by 65x97."""

import torch
import torch.nn as nn

M, K, N = 129, 65, 97


class Model(nn.Module):
    """a @ b"""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a, b)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs() -> list[int]:
    return []
