"""Euclidean vector norm over the middle dim, of a 8x256x128 tensor."""

import torch
import torch.nn as nn

SHAPE = (8, 256, 128)


class Model(nn.Module):
    """torch.linalg.vector_norm(x, dim=1)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(x, dim=1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(SHAPE)]


def get_init_inputs() -> list[int]:
    return []
