"""Softmax over the last dim, of a 37x1001 matrix."""

import torch
import torch.nn as nn

ROWS, COLS = 37, 1001


class Model(nn.Module):
    """torch.softmax(x, dim=-1)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS)]


def get_init_inputs() -> list[int]:
    return []
