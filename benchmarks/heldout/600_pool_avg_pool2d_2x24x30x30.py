"""2x2 average pooling of 2x24x30x30."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """F.avg_pool2d(x, 2)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x, 2)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(2, 24, 30, 30)]


def get_init_inputs() -> list[int]:
    return []
