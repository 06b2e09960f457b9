"""GELU (tanh approximation), elementwise, on a 257x513 matrix."""

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS, COLS = 257, 513


class Model(nn.Module):
    """F.gelu(x, approximate="tanh")"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS)]


def get_init_inputs() -> list[int]:
    return []
