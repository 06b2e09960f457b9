"""Batch norm in eval mode (running statistics), of a 4x37x15x15 NCHW tensor."""

import torch
import torch.nn as nn

N, C, H, W = 4, 37, 15, 15


class Model(nn.Module):
    """nn.BatchNorm2d(channels) with random running statistics and affine parameters."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(channels)
        with torch.no_grad():
            self.norm.running_mean.copy_(0.1 * torch.randn(channels))
            self.norm.running_var.copy_(0.5 + torch.rand(channels))
            self.norm.weight.copy_(1 + 0.1 * torch.randn(channels))
            self.norm.bias.copy_(0.1 * torch.randn(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(N, C, H, W)]


def get_init_inputs() -> list[int]:
    return [C]
