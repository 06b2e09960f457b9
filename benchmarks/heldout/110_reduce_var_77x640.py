"""Row variance (unbiased) of a 77x640 matrix."""

import torch
import torch.nn as nn


class Model(nn.Module):
    """x.var(-1)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.var(-1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(77, 640)]


def get_init_inputs() -> list[int]:
    return []
