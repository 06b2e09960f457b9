"""Linear layer then SiLU: 32 rows, 192 in features, 384 out features."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """F.silu(nn.Linear(in_features, out_features)(x))"""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.linear(x))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(32, 192)]


def get_init_inputs() -> list[int]:
    return [192, 384]
