"""Group norm (6 groups, affine), of a 4x36x15x15 NCHW tensor."""

import torch
import torch.nn as nn

N, C, H, W = 4, 36, 15, 15
GROUPS = 6


class Model(nn.Module):
    """nn.GroupNorm(groups, channels) with random affine parameters."""

    def __init__(self, groups: int, channels: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)
        with torch.no_grad():
            self.norm.weight.copy_(1 + 0.1 * torch.randn(channels))
            self.norm.bias.copy_(0.1 * torch.randn(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(N, C, H, W)]


def get_init_inputs() -> list[int]:
    return [GROUPS, C]
