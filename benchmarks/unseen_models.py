"""Models the project was not developed on: eager vs KOPE vs inductor, as `benchmarks/e2e.py`.

Ten blocks of the architectures people compile today, at realistic small sizes, none of them
in KOPE's tests or its operator suite: a SwiGLU MLP, attention written by hand, causal
`scaled_dot_product_attention`, an `nn.TransformerEncoderLayer` (the fused fast path), a
ResNet bottleneck, a MobileNetV2 inverted residual (depthwise 3x3 over hundreds of
channels), a diffusion UNet residual block (GroupNorm + SiLU), a ConvNeXt block (depthwise
7x7, LayerNorm channels-last, a GELU MLP), a small conv net written as a newcomer would
(GroupNorm, SiLU, adaptive pooling, a linear head) and a ViT block (pre-norm attention and
MLP). Each is precompiled at `--precompile N` into one store, then eager, KOPE, inductor and
dynamo alone are timed interleaved in one process (`e2e.run`).

    python benchmarks/unseen_models.py [--precompile 4] [--no-inductor] [--models a,b]
                                       [--repeat 3] [--json out.json]

Run it on a quiet machine (`../shared/tools/quiet-check.sh`), with nothing else running.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import e2e
import torch
import torch.nn as nn
import torch.nn.functional as F


class SwiGluMlp(nn.Module):
    def __init__(self, dim: int = 384, hidden: int = 1024):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class HandAttention(nn.Module):
    """Separate q/k/v projections, masked scores, softmax, weighted sum: as written in papers."""

    def __init__(self, dim: int = 256, heads: int = 8, causal: bool = False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = d // self.heads
        q, k, v = (p(x).view(b, t, self.heads, h).transpose(1, 2) for p in (self.q, self.k, self.v))
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(h))
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        y = scores.softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class CausalSdpa(nn.Module):
    def __init__(self, dim: int = 256, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Bottleneck(nn.Module):
    def __init__(self, channels: int = 128, inner: int = 32):
        super().__init__()
        self.reduce = nn.Conv2d(channels, inner, 1, bias=False)
        self.conv = nn.Conv2d(inner, inner, 3, padding=1, bias=False)
        self.expand = nn.Conv2d(inner, channels, 1, bias=False)
        self.bns = nn.ModuleList(nn.BatchNorm2d(c) for c in (inner, inner, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bns[0](self.reduce(x)))
        y = F.relu(self.bns[1](self.conv(y)))
        return F.relu(self.bns[2](self.expand(y)) + x)


class InvertedResidual(nn.Module):
    def __init__(self, channels: int = 32, expand: int = 6):
        super().__init__()
        wide = channels * expand
        self.block = nn.Sequential(
            nn.Conv2d(channels, wide, 1, bias=False),
            nn.BatchNorm2d(wide),
            nn.ReLU6(),
            nn.Conv2d(wide, wide, 3, padding=1, groups=wide, bias=False),
            nn.BatchNorm2d(wide),
            nn.ReLU6(),
            nn.Conv2d(wide, channels, 1, bias=False),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class UNetResBlock(nn.Module):
    """A diffusion UNet's residual block: GroupNorm, SiLU, 3x3 conv, twice, and the skip."""

    def __init__(self, channels: int = 64, groups: int = 32):
        super().__init__()
        self.norm1, self.norm2 = nn.GroupNorm(groups, channels), nn.GroupNorm(groups, channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(F.silu(self.norm1(x)))
        return x + self.conv2(F.silu(self.norm2(y)))


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int = 96):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class SmallConvNet(nn.Module):
    """What a newcomer writes for a small image classifier."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.GroupNorm(8, 32),
            nn.SiLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1),
            nn.GroupNorm(8, 64),
            nn.SiLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class VitBlock(nn.Module):
    def __init__(self, dim: int = 192, heads: int = 3):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


UNSEEN: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "swiglu_mlp": lambda: (SwiGluMlp(), e2e._inputs(2, 64, 384)),
    "hand_attention": lambda: (HandAttention(causal=True), e2e._inputs(2, 128, 256)),
    "causal_sdpa": lambda: (CausalSdpa(), e2e._inputs(2, 128, 256)),
    "encoder_layer_256": lambda: (
        nn.TransformerEncoderLayer(256, 8, 512, dropout=0.0, batch_first=True),
        e2e._inputs(2, 64, 256),
    ),
    "bottleneck": lambda: (Bottleneck(), e2e._inputs(1, 128, 28, 28)),
    "inverted_residual": lambda: (InvertedResidual(), e2e._inputs(1, 32, 28, 28)),
    "unet_resblock": lambda: (UNetResBlock(), e2e._inputs(1, 64, 32, 32)),
    "convnext_block": lambda: (ConvNeXtBlock(), e2e._inputs(1, 96, 28, 28)),
    "small_convnet": lambda: (SmallConvNet(), e2e._inputs(4, 3, 32, 32)),
    "vit_block": lambda: (VitBlock(), e2e._inputs(2, 65, 192)),
}


if __name__ == "__main__":
    e2e.EXTRA_MODELS.update(UNSEEN)
    e2e.main(default_models=UNSEEN, doc=__doc__, default_budget=4)
