"""Linear layer with bias: three rows, 129 in features, 65 out features."""

import torch
import torch.nn as nn

BATCH, IN_FEATURES, OUT_FEATURES = 3, 129, 65


class Model(nn.Module):
    """nn.Linear(in_features, out_features)"""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs() -> list[int]:
    return [IN_FEATURES, OUT_FEATURES]
