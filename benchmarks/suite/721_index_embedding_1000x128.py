"""Embedding lookup: a 1000x128 table, 8x64 token ids."""

import torch
import torch.nn as nn

VOCAB, DIM = 1000, 128
BATCH, TOKENS = 8, 64


class Model(nn.Module):
    """nn.Embedding(vocab, dim)(ids)"""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randint(0, VOCAB, (BATCH, TOKENS))]


def get_init_inputs() -> list[int]:
    return [VOCAB, DIM]
