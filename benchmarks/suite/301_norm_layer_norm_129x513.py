"""Layer norm over the last dim (with affine weight and bias), of a 129x513 matrix."""

import torch
import torch.nn as nn

ROWS, COLS = 129, 513


class Model(nn.Module):
    """nn.LayerNorm(cols) with random affine parameters."""

    def __init__(self, cols: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(cols)
        with torch.no_grad():
            self.norm.weight.copy_(1 + 0.1 * torch.randn(cols))
            self.norm.bias.copy_(0.1 * torch.randn(cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS)]


def get_init_inputs() -> list[int]:
    return [COLS]
