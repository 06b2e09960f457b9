"""torch.gather along the last dim: 64 of 512 columns per row, of a 256x512 matrix."""

import torch
import torch.nn as nn

ROWS, COLS, PICKS = 256, 512, 64


class Model(nn.Module):
    """torch.gather(x, 1, index), index of shape (ROWS, PICKS)"""

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.gather(x, 1, index)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS), torch.randint(0, COLS, (ROWS, PICKS))]


def get_init_inputs() -> list[int]:
    return []
