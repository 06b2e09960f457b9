"""Layer norm over the last dim (affine) of a 200x384 matrix."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """nn.LayerNorm(cols)"""

    def __init__(self, cols: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(cols)
        with torch.no_grad():
            self.norm.weight.copy_(1 + 0.1 * torch.randn(cols))
            self.norm.bias.copy_(0.1 * torch.randn(cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(200, 384)]


def get_init_inputs() -> list[int]:
    return [384]
