"""Depthwise 2-D convolution, 3x3, padding 1, 96 channels, of 1x96x20x20."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """nn.Conv2d(c, c, 3, padding=1, groups=c)"""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, groups=in_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(1, 96, 20, 20)]


def get_init_inputs() -> list[int]:
    return [96, 96]
