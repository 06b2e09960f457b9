"""Average pooling 2x2, stride 2, of 4x16x32x32."""

import torch
import torch.nn as nn
import torch.nn.functional as F

INPUT_SHAPE = (4, 16, 32, 32)


class Model(nn.Module):
    """F.avg_pool2d(x, 2, stride=2)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x, 2, stride=2)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(INPUT_SHAPE)]


def get_init_inputs() -> list[int]:
    return []
