"""Cross-entropy loss (mean) of 128x100 logits against 128 class targets."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, CLASSES = 128, 100


class Model(nn.Module):
    """F.cross_entropy(logits, targets)"""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(BATCH, CLASSES), torch.randint(0, CLASSES, (BATCH,))]


def get_init_inputs() -> list[int]:
    return []
