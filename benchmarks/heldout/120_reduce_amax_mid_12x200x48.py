"""Max over the middle dim of a 12x200x48 tensor."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """x.amax(1)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.amax(1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(12, 200, 48)]


def get_init_inputs() -> list[int]:
    return []
