"""SiLU (x * sigmoid(x)), elementwise, on a 128x256 matrix."""

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS, COLS = 128, 256


class Model(nn.Module):
    """F.silu(x)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS)]


def get_init_inputs() -> list[int]:
    return []
