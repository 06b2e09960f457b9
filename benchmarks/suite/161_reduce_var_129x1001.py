"""Variance (unbiased) over the last dim, of a 129x1001 tensor."""

import torch
import torch.nn as nn

SHAPE = (129, 1001)


class Model(nn.Module):
    """x.var(dim=-1)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.var(dim=-1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(SHAPE)]


def get_init_inputs() -> list[int]:
    return []
