"""ReLU, elementwise, on a 129x257 matrix."""

import torch
import torch.nn as nn

ROWS, COLS = 129, 257


class Model(nn.Module):
    """torch.relu(x)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS)]


def get_init_inputs() -> list[int]:
    return []
