"""Row sum of a 300x200 matrix."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """x.sum(-1)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(-1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(300, 200)]


def get_init_inputs() -> list[int]:
    return []
