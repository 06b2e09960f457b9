"""GELU (tanh approximation) of a 96x700 matrix."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """F.gelu(x, approximate='tanh')"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(96, 700)]


def get_init_inputs() -> list[int]:
    return []
