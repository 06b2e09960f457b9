"""2-D convolution, 3x3, stride 2, padding 1, 16 -> 32 channels, of 1x16x64x64."""

import torch
import torch.nn as nn

INPUT_SHAPE = (1, 16, 64, 64)
IN_CHANNELS, OUT_CHANNELS = 16, 32


class Model(nn.Module):
    """nn.Conv2d(in_channels, out_channels, 3, stride=2, padding=1)"""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(INPUT_SHAPE)]


def get_init_inputs() -> list[int]:
    return [IN_CHANNELS, OUT_CHANNELS]
