"""RMS norm over the last dim of a 64x1000 matrix."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """nn.RMSNorm(cols)"""

    def __init__(self, cols: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(cols)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(64, 1000)]


def get_init_inputs() -> list[int]:
    return [1000]
