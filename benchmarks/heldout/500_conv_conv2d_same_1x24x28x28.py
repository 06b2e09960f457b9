"""2-D convolution, 3x3, padding 1, 24 -> 48 channels, of 1x24x28x28."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """nn.Conv2d(in_channels, out_channels, 3, padding=1)"""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(1, 24, 28, 28)]


def get_init_inputs() -> list[int]:
    return [24, 48]
