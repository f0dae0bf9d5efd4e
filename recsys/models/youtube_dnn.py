"""YouTube DNN as ComiRec's baseline: the mean of the history embeddings, then a linear layer."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from recsys.config import ModelConfig
from recsys.models.sequence import SequenceModel
from recsys.models.spec import Automatic, ModelSpec, register
from recsys.nn.masking import length_mask


class YouTubeDNN(SequenceModel):
    """``u = W · mean(h_0 .. h_{n-1}) + b`` -> ``[B, 1, d]``; a row of length 0 gives 0."""

    def __init__(self, num_items: int, dim: int):
        super().__init__(num_items, dim, num_interests=1)
        self.proj = nn.Linear(dim, dim)

    def encode(self, h: Tensor, lengths: Tensor) -> Tensor:
        mean = h.sum(dim=1) / lengths.clamp(min=1).to(h.dtype)[:, None]  # [B, d]; h is 0 at padding
        user = self.proj(mean) * (lengths > 0).to(h.dtype)[:, None]
        return user[:, None]  # [B, 1, d]

    def encode_prefix(self, h: Tensor, lengths: Tensor) -> Tensor:
        count = torch.arange(1, h.shape[1] + 1, device=h.device, dtype=h.dtype)[None, :, None]
        mean = h.cumsum(dim=1) / count  # [B, L, d]: the mean of clicks 0..t
        return (self.proj(mean) * length_mask(lengths, h.shape[1]).to(h.dtype)[..., None])[:, :, None]


def build(cfg: ModelConfig, num_items: int, max_len: int, item_counts: Tensor | None = None) -> YouTubeDNN:
    return YouTubeDNN(num_items, cfg.dim)


# a mean of embeddings overfits sooner: it decays 0.5 a pass (docs/defaults.md, "Weight decay per epoch")
SPEC = register(ModelSpec(name="youtube_dnn", build=build, dense=True, automatic=Automatic(epoch_decay=0.5)))
