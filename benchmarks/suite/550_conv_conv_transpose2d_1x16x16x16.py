"""Transposed 2-D convolution, 4x4, stride 2, pad 1 (2x upsampling), 16 -> 8 ch, of 1x16x16x16."""

import torch
import torch.nn as nn

INPUT_SHAPE = (1, 16, 16, 16)
IN_CHANNELS, OUT_CHANNELS = 16, 8


class Model(nn.Module):
    """nn.ConvTranspose2d(in_channels, out_channels, 4, stride=2, padding=1)"""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose2d(in_channels, out_channels, 4, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(INPUT_SHAPE)]


def get_init_inputs() -> list[int]:
    return [IN_CHANNELS, OUT_CHANNELS]
