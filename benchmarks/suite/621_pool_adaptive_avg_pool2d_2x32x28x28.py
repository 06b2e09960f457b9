"""Adaptive average pooling to 7x7, of 2x32x28x28."""

import torch
import torch.nn as nn
import torch.nn.functional as F

INPUT_SHAPE = (2, 32, 28, 28)


class Model(nn.Module):
    """F.adaptive_avg_pool2d(x, 7)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(x, 7)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(INPUT_SHAPE)]


def get_init_inputs() -> list[int]:
    return []
