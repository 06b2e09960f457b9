"""Argmax over the last dim (int64 indices), of a 129x1001 tensor."""

import torch
import torch.nn as nn

SHAPE = (129, 1001)


class Model(nn.Module):
    """x.argmax(dim=-1)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.argmax(dim=-1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(SHAPE)]


def get_init_inputs() -> list[int]:
    return []
