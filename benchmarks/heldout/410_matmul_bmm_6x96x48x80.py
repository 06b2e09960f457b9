"""Batched matrix multiply of 6 96x48 by 48x80 products."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """torch.bmm(a, b)"""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(6, 96, 48), torch.randn(6, 48, 80)]


def get_init_inputs() -> list[int]:
    return []
