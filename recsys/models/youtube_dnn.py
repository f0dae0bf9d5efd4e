"""YouTube DNN as ComiRec's baseline: the mean of the history embeddings, then a linear layer."""

from __future__ import annotations

from torch import Tensor, nn

from recsys.config import ModelConfig
from recsys.models.base import register
from recsys.models.sequence import SequenceModel, reject_attention_switches


class YouTubeDNN(SequenceModel):
    """``u = W · mean(h_0 .. h_{n-1}) + b`` -> ``[B, 1, d]``; a row of length 0 gives 0."""

    def __init__(self, num_items: int, dim: int):
        super().__init__(num_items, dim, num_interests=1)
        self.proj = nn.Linear(dim, dim)

    def encode(self, h: Tensor, lengths: Tensor) -> Tensor:
        mean = h.sum(dim=1) / lengths.clamp(min=1).to(h.dtype)[:, None]  # [B, d]; h is 0 at padding
        user = self.proj(mean) * (lengths > 0).to(h.dtype)[:, None]
        return user[:, None]  # [B, 1, d]


@register("youtube_dnn")
def build(cfg: ModelConfig, num_items: int, max_len: int, item_counts: Tensor | None = None) -> YouTubeDNN:
    reject_attention_switches(cfg)
    return YouTubeDNN(num_items, cfg.dim)
