"""1-D convolution, kernel 3, padding 1, 17 -> 33 channels, of 4x17x129."""

import torch
import torch.nn as nn

INPUT_SHAPE = (4, 17, 129)
IN_CHANNELS, OUT_CHANNELS = 17, 33


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
