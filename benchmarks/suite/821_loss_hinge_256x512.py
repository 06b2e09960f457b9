"""Hinge loss mean(clamp(1 - pred * target, min=0)) of 256x512 scores, targets in +-1."""

import torch
import torch.nn as nn

ROWS, COLS = 256, 512


class Model(nn.Module):
    """torch.mean(torch.clamp(1 - pred * target, min=0))"""

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.mean(torch.clamp(1 - pred * target, min=0))


def get_inputs() -> list[torch.Tensor]:
    target = torch.randint(0, 2, (ROWS, COLS)).float() * 2 - 1
    return [torch.randn(ROWS, COLS), target]


def get_init_inputs() -> list[int]:
    return []
