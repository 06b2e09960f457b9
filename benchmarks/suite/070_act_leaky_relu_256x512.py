"""Leaky ReLU (negative slope 0.01), elementwise, on a 256x512 matrix."""

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS, COLS = 256, 512


class Model(nn.Module):
    """F.leaky_relu(x, 0.01)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, 0.01)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS)]


def get_init_inputs() -> list[int]:
    return []
