"""GELU (tanh approximation), elementwise, on a 128x256 matrix."""

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS, COLS = 128, 256


class Model(nn.Module):
    """F.gelu(x, approximate="tanh")"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS)]


def get_init_inputs() -> list[int]:
    return []
