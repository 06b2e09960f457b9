"""Matrix multiply of 200x300 by 300x100."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """torch.mm(a, b)"""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a, b)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(200, 300), torch.randn(300, 100)]


def get_init_inputs() -> list[int]:
    return []
