"""3x3 padded conv (16 -> 32 channels), batch norm (eval), ReLU, of 1x16x32x32."""

import torch
import torch.nn as nn

INPUT_SHAPE = (1, 16, 32, 32)
IN_CHANNELS, OUT_CHANNELS = 16, 32


class Model(nn.Module):
    """relu(batch_norm(conv3x3(x))), batch norm with random running statistics"""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(out_channels)
        with torch.no_grad():
            self.norm.running_mean.copy_(0.1 * torch.randn(out_channels))
            self.norm.running_var.copy_(0.5 + torch.rand(out_channels))
            self.norm.weight.copy_(1 + 0.1 * torch.randn(out_channels))
            self.norm.bias.copy_(0.1 * torch.randn(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x)))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(INPUT_SHAPE)]


def get_init_inputs() -> list[int]:
    return [IN_CHANNELS, OUT_CHANNELS]
