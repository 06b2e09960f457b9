"""Softmax over the rows of a 96x512 matrix."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """torch.softmax(x, -1)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(96, 512)]


def get_init_inputs() -> list[int]:
    return []
