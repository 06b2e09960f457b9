"""Linear layer: 48 rows, 384 in features, 192 out features."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """nn.Linear(in_features, out_features)"""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(48, 384)]


def get_init_inputs() -> list[int]:
    return [384, 192]
