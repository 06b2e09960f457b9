"""2-D pointwise (1x1) convolution, 32 -> 64 channels, of 1x32x32x32."""

import torch
import torch.nn as nn

INPUT_SHAPE = (1, 32, 32, 32)
IN_CHANNELS, OUT_CHANNELS = 32, 64


class Model(nn.Module):
    """nn.Conv2d(in_channels, out_channels, 1)"""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(INPUT_SHAPE)]


def get_init_inputs() -> list[int]:
    return [IN_CHANNELS, OUT_CHANNELS]
