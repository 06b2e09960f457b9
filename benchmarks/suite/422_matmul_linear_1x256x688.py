"""Linear layer with bias at batch 1 (a decoding step): 256 in features, 688 out features."""

import torch
import torch.nn as nn

BATCH, IN_FEATURES, OUT_FEATURES = 1, 256, 688


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
