"""Mean squared error loss of two 256x512 matrices."""

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS, COLS = 256, 512


class Model(nn.Module):
    """F.mse_loss(pred, target)"""

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(pred, target)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(ROWS, COLS), torch.randn(ROWS, COLS)]


def get_init_inputs() -> list[int]:
    return []
