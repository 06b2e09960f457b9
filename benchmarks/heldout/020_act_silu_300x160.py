"""SiLU of a 300x160 matrix."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """F.silu(x)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(300, 160)]


def get_init_inputs() -> list[int]:
    return []
