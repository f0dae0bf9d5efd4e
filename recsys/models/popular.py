"""MostPopular: recommend the items clicked most in the training data, to everyone.

As an :class:`InterestModel` it has one interest of dimension 1: the interest is the
constant ``1`` and each item's embedding is ``log(1 + training clicks)``, so an inner-product
search ranks items by training popularity (ties in count are broken by the index). Row 0
(padding) gets a very low score. Nothing is trained (``trainable = False``); the counts are a
buffer, so they are saved with the run.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from recsys.config import ModelConfig
from recsys.models.base import InterestModel
from recsys.models.spec import ModelSpec, register

_PADDING_SCORE = -1e9  # below log1p(count) >= 0 of every real item


class MostPopular(InterestModel):
    """``item_counts [num_items]`` training click counts (index 0 = padding)."""

    num_interests = 1
    trainable = False
    scores: Tensor  # [num_items, 1] buffer

    def __init__(self, item_counts: np.ndarray | Tensor) -> None:
        super().__init__()
        if isinstance(item_counts, Tensor):
            counts = item_counts.detach().to("cpu", torch.float32)
        else:
            counts = torch.as_tensor(np.asarray(item_counts), dtype=torch.float32)
        if counts.ndim != 1 or len(counts) < 2:
            raise ValueError(f"item_counts: expected [num_items >= 2] (index 0 = padding), got {tuple(counts.shape)}")
        if (counts < 0).any():
            raise ValueError("item_counts: click counts must be >= 0")
        scores = torch.log1p(counts)
        scores[0] = _PADDING_SCORE
        self.register_buffer("scores", scores[:, None])  # [num_items, 1]

    def interests(self, seq: Tensor, lengths: Tensor) -> Tensor:
        """``seq [B, L]``, ``lengths [B]`` -> ``[B, 1, 1]`` ones (the same query for everyone)."""
        return self.scores.new_ones(seq.shape[0], 1, 1)

    def item_embeddings(self) -> Tensor:
        """``[num_items, 1]``: ``log(1 + training clicks)``; row 0 = padding, very low."""
        return self.scores


def build_popular(
    cfg: ModelConfig, num_items: int, max_len: int, item_counts: np.ndarray | Tensor | None
) -> MostPopular:
    """Spec builder: ``item_counts [num_items]`` from the training split (checked by ``build_model``)."""
    assert item_counts is not None
    return MostPopular(item_counts)


SPEC = register(ModelSpec(name="popular", build=build_popular, needs_item_counts=True, trainable=False))
