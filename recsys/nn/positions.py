"""Learned position embeddings of click sequences (the item table is :class:`recsys.items.ItemTable`)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from recsys.nn.masking import recency_index

POSITIONS = ("recent", "absolute")


class PositionEmbedding(nn.Module):
    """Learned positions ``[max_len, d]`` of right-padded click sequences.

    ``recent``: position 0 is each row's most recent click, 1 the one before, ... (so the
    latest click always gets the same vector, whatever the row's length). ``absolute``: position
    0 is the oldest click of the window (ComiRec's code); with right padding the latest click's
    position then varies with the length.
    """

    def __init__(self, max_len: int, dim: int, mode: str = "recent"):
        super().__init__()
        if mode not in POSITIONS:
            raise ValueError(f"model.positions: {mode!r} is not one of {list(POSITIONS)}")
        self.max_len, self.mode = max_len, mode
        self.weight = nn.Parameter(torch.empty(max_len, dim))
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(dim))

    def forward(self, lengths: Tensor, seq_len: int) -> Tensor:
        """``lengths [B]`` -> ``[B, seq_len, d]`` (``recent``) or ``[1, seq_len, d]`` (``absolute``);
        raises if ``seq_len > max_len``."""
        if seq_len > self.max_len:
            raise ValueError(f"sequence length {seq_len} exceeds max_len {self.max_len} of the position table")
        if self.mode == "recent":
            return self.weight[recency_index(lengths, seq_len)]
        return self.weight[None, :seq_len]
