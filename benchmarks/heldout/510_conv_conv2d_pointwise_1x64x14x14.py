"""Pointwise (1x1) 2-D convolution, 64 -> 128 channels, of 1x64x14x14."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """nn.Conv2d(in_channels, out_channels, 1)"""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 1, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(1, 64, 14, 14)]


def get_init_inputs() -> list[int]:
    return [64, 128]
