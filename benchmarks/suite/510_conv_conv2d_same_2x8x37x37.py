"""2-D convolution, 3x3, padding 1 (same size), 8 -> 16 channels, of 2x8x37x37."""

import torch
import torch.nn as nn

INPUT_SHAPE = (2, 8, 37, 37)
IN_CHANNELS, OUT_CHANNELS = 8, 16


class Model(nn.Module):
    """nn.Conv2d(in_channels, out_channels, 3, padding=1)"""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(INPUT_SHAPE)]


def get_init_inputs() -> list[int]:
    return [IN_CHANNELS, OUT_CHANNELS]
