"""Item embeddings (id 0 = padding) and learned position embeddings."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recsys.nn.masking import length_mask, recency_index


class ItemEmbedding(nn.Module):
    """The item table ``[num_items, d]``, shared as input and output embeddings (tied).

    Row 0 is padding: it starts at zero and never receives a gradient. Lookups are masked
    by length, so whatever id sits at a padded position contributes an exact zero vector.
    Rows start as ``N(0, 1/d)``, so embeddings have norm about 1 and inner products start at
    the scale of a unit-variance logit.

    A row-sparse training step (:mod:`recsys.train.sparse_rows`) reads a few thousand gathered rows
    instead of the whole table: inside :meth:`reading` the ids of the step are positions in those
    rows, and :attr:`weight` is them.
    """

    def __init__(self, num_items: int, dim: int):
        super().__init__()
        if num_items < 2:
            raise ValueError(f"num_items must be >= 2 (id 0 is padding), got {num_items}")
        self.table = nn.Embedding(num_items, dim, padding_idx=0)
        nn.init.normal_(self.table.weight, std=1.0 / math.sqrt(dim))
        with torch.no_grad():
            self.table.weight[0].zero_()
        self._rows: Tensor | None = None  # the gathered rows of a row-sparse step, while it reads them

    @property
    def weight(self) -> Tensor:
        """``[num_items, d]``, or ``[T, d]`` gathered rows inside :meth:`reading`."""
        return self.table.weight if self._rows is None else self._rows

    @contextlib.contextmanager
    def reading(self, rows: Tensor) -> Iterator[None]:
        """Look ids up in ``rows [T, d]`` (row 0 must be the padding row) instead of the table
        inside the block: the ids given to the model are then row positions in ``rows``."""
        self._rows = rows
        try:
            yield
        finally:
            self._rows = None

    def forward(self, seq: Tensor, lengths: Tensor) -> Tensor:
        """``seq [B, L]`` ids, ``lengths [B]`` -> ``[B, L, d]``, zero at padded positions."""
        h = self.table(seq) if self._rows is None else F.embedding(seq, self._rows)  # [B, L, d]
        return h * length_mask(lengths, seq.shape[1]).to(h.dtype)[..., None]


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
