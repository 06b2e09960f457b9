"""Max over the last dim (amax), of a 256x512 tensor."""

import torch
import torch.nn as nn

SHAPE = (256, 512)


class Model(nn.Module):
    """x.amax(dim=-1)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.amax(dim=-1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(SHAPE)]


def get_init_inputs() -> list[int]:
    return []
