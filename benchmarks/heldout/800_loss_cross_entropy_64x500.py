"""Cross-entropy loss (mean) of 64x500 logits against 64 class targets."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """F.cross_entropy(logits, targets)"""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(64, 500), torch.randint(0, 500, (64,))]


def get_init_inputs() -> list[int]:
    return []
