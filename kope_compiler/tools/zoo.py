"""Small models that exercise the backend: each factory returns `(model, example_inputs)`.

They are the embedded default of `kope compile`, the model zoo of the tests, and the
workloads of `benchmarks/`. Weights are seeded, so every run sees the same model.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

Example = tuple[nn.Module, tuple[torch.Tensor, ...]]


class MLP(nn.Module):
    """Linear → GELU → Linear → GELU → Linear."""

    def __init__(self, d_in: int = 64, hidden: int = 128, d_out: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


class CNN(nn.Module):
    """Padded conv → batchnorm → ReLU → maxpool, twice, then a linear classifier."""

    def __init__(self, channels: int = 3, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        return self.fc(x.flatten(1))


class Attention(nn.Module):
    """Multi-head softmax self-attention written from linear layers."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        head_dim = dim // self.heads
        q, k, v = (
            t.reshape(batch, length, self.heads, head_dim).transpose(1, 2)
            for t in self.qkv(x).chunk(3, dim=-1)
        )
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
        out = scores.softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(batch, length, dim))


class TransformerBlock(nn.Module):
    """Pre-norm transformer encoder block: LayerNorm, attention, LayerNorm, GELU MLP."""

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 128):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class OddShapes(nn.Module):
    """Size-1 dimensions, broadcasting, a transposed (non-contiguous) input, reductions."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(1, 7))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = x.t()  # non-contiguous view
        h = torch.tanh(t * self.scale + y)  # (1,7) and (5,1) broadcast into (5,7)
        return h.sum(dim=0, keepdim=True), h.amax(dim=1)


def mlp() -> Example:
    torch.manual_seed(0)
    return MLP().eval(), (torch.randn(16, 64),)


def cnn() -> Example:
    torch.manual_seed(0)
    model = CNN().eval()
    with torch.no_grad():  # non-trivial running statistics
        for bn in (model.bn1, model.bn2):
            assert bn.running_mean is not None and bn.running_var is not None
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return model, (torch.randn(2, 3, 16, 16),)


def transformer_block() -> Example:
    torch.manual_seed(0)
    return TransformerBlock().eval(), (torch.randn(2, 16, 64),)


def encoder_layer() -> Example:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval()
    return layer, (torch.randn(2, 16, 64),)


def odd_shapes() -> Example:
    torch.manual_seed(0)
    x = torch.randn(7, 5)
    return OddShapes().eval(), (x, torch.randn(5, 1))


ZOO: dict[str, Callable[[], Example]] = {
    "mlp": mlp,
    "cnn": cnn,
    "transformer_block": transformer_block,
    "encoder_layer": encoder_layer,
    "odd_shapes": odd_shapes,
}
