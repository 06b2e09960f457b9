"""Max pooling 3x3, stride 2, padding 1, of 2x16x37x37."""

import torch
import torch.nn as nn
import torch.nn.functional as F

INPUT_SHAPE = (2, 16, 37, 37)


class Model(nn.Module):
    """F.max_pool2d(x, 3, stride=2, padding=1)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, 3, stride=2, padding=1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(INPUT_SHAPE)]


def get_init_inputs() -> list[int]:
    return []
