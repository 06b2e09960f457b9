"""Adaptive average pooling to 1x1 (global average), of 4x32x16x16."""

import torch
import torch.nn as nn
import torch.nn.functional as F

INPUT_SHAPE = (4, 32, 16, 16)


class Model(nn.Module):
    """F.adaptive_avg_pool2d(x, 1)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(x, 1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(INPUT_SHAPE)]


def get_init_inputs() -> list[int]:
    return []
