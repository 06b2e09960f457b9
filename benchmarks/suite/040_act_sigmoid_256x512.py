"""Sigmoid, elementwise, on a 256x512 matrix."""

import torch
import torch.nn as nn

ROWS, COLS = 256, 512


class Model(nn.Module):
    """torch.sigmoid(x)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS)]


def get_init_inputs() -> list[int]:
    return []
