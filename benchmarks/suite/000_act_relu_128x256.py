"""ReLU, elementwise, on a 128x256 matrix."""

import torch
import torch.nn as nn

ROWS, COLS = 128, 256


class Model(nn.Module):
    """torch.relu(x)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS)]


def get_init_inputs() -> list[int]:
    return []
