"""Item embeddings (id 0 = padding) and learned position embeddings."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from recsys.nn.masking import length_mask


class ItemEmbedding(nn.Module):
    """The item table ``[num_items, d]``, shared as input and output embeddings (tied).

    Row 0 is padding: it starts at zero and never receives a gradient. Lookups are masked
    by length, so whatever id sits at a padded position contributes an exact zero vector.
    Rows start as ``N(0, 1/d)``, so embeddings have norm about 1 and inner products start at
    the scale of a unit-variance logit.
    """

    def __init__(self, num_items: int, dim: int):
        super().__init__()
        if num_items < 2:
            raise ValueError(f"num_items must be >= 2 (id 0 is padding), got {num_items}")
        self.table = nn.Embedding(num_items, dim, padding_idx=0)
        nn.init.normal_(self.table.weight, std=1.0 / math.sqrt(dim))
        with torch.no_grad():
            self.table.weight[0].zero_()

    @property
    def weight(self) -> Tensor:
        """``[num_items, d]``."""
        return self.table.weight

    def forward(self, seq: Tensor, lengths: Tensor) -> Tensor:
        """``seq [B, L]`` ids, ``lengths [B]`` -> ``[B, L, d]``, zero at padded positions."""
        h = self.table(seq)  # [B, L, d]
        return h * length_mask(lengths, seq.shape[1]).to(h.dtype)[..., None]


class PositionEmbedding(nn.Module):
    """Learned absolute positions ``[max_len, d]``; position 0 is the oldest click."""

    def __init__(self, max_len: int, dim: int):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, dim))
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(dim))

    def forward(self, seq_len: int) -> Tensor:
        """-> ``[seq_len, d]``; raises if ``seq_len > max_len``."""
        if seq_len > self.max_len:
            raise ValueError(f"sequence length {seq_len} exceeds max_len {self.max_len} of the position table")
        return self.weight[:seq_len]
