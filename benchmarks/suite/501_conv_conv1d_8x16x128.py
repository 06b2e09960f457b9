"""1-D convolution, kernel 3, padding 1, 16 -> 32 channels, of 8x16x128."""

import torch
import torch.nn as nn

INPUT_SHAPE = (8, 16, 128)
IN_CHANNELS, OUT_CHANNELS = 16, 32


class Model(nn.Module):
    """nn.Conv1d(in_channels, out_channels, 3, padding=1)"""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(INPUT_SHAPE)]


def get_init_inputs() -> list[int]:
    return [IN_CHANNELS, OUT_CHANNELS]
