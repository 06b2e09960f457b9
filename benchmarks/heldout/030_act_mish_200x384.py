"""Mish of a 200x384 matrix."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """F.mish(x)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.mish(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(200, 384)]


def get_init_inputs() -> list[int]:
    return []
