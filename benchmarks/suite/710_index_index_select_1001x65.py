"""torch.index_select of 129 rows (with repeats) from a 1001x65 matrix."""

import torch
import torch.nn as nn

ROWS, COLS, PICKS = 1001, 65, 129


class Model(nn.Module):
    """torch.index_select(x, 0, index)"""

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 0, index)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS), torch.randint(0, ROWS, (PICKS,))]


def get_init_inputs() -> list[int]:
    return []
