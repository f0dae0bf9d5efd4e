"""ComiRec-SA's self-attentive multi-interest head, on top of ``recsys.kernels.multi_interest``."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from recsys.kernels import multi_interest
from recsys.nn.embeddings import POSITIONS
from recsys.nn.masking import length_mask, recency_index


class SelfAttentiveHead(nn.Module):
    """``A = softmax_L(tanh((H + P) W1) W2)``, interests ``= Aᵀ H``.

    Args:
        dim: item embedding size ``d``.
        hidden: size of the tanh projection (ComiRec uses ``4 d``).
        num_interests: ``K``.
        max_len: longest sequence, for the learned position embeddings ``P [max_len, d]``.
        backend: kernel backend (``auto | triton | torch``).
        positions: ``recent`` (``P[0]`` marks the most recent click), ``absolute`` (``P[0]`` the
            oldest click of the window) or ``none``. ``recent`` reverses each row's valid clicks
            before the kernel, which numbers positions from the start: the interests ``Aᵀ H``
            are a sum over positions, so moving the clicks with their positions changes nothing
            else.

    With ``track_stats = True`` the forward pass also records ``last_max_logit``, the largest
    score ``tanh((H + P) W1) W2`` over valid positions (detached 0-d tensor, no host sync), read
    by ``recsys.nn.attention.max_attention_logit``.
    """

    def __init__(self, dim: int, hidden: int, num_interests: int, max_len: int, backend: str = "auto",
                 positions: str = "recent"):
        super().__init__()
        if positions not in (*POSITIONS, "none"):
            raise ValueError(f"model.positions: {positions!r} is not one of {[*POSITIONS, 'none']}")
        self.w1 = nn.Parameter(torch.empty(dim, hidden))
        self.w2 = nn.Parameter(torch.empty(hidden, num_interests))
        self.pos = None if positions == "none" else nn.Parameter(torch.empty(max_len, dim))
        self.positions = positions
        self.backend = backend
        nn.init.xavier_uniform_(self.w1)
        nn.init.xavier_uniform_(self.w2)
        if self.pos is not None:
            nn.init.normal_(self.pos, std=1.0 / math.sqrt(dim))
        self.track_stats = False
        self.last_max_logit: Tensor | None = None

    def forward(self, h: Tensor, lengths: Tensor, values: Tensor | None = None) -> Tensor:
        """``h [B, L, d]``, ``lengths [B]`` -> interests ``[B, K, d]``: ``Aᵀ h``, or ``Aᵀ values``
        for ``values [B, L, d]`` (the scores still read ``h``)."""
        if self.positions == "recent":  # row i <- the i-th most recent click
            index = recency_index(lengths, h.shape[1])[..., None].expand_as(h)
            h = h.gather(1, index)
            values = None if values is None else values.gather(1, index)
        if self.track_stats:
            with torch.no_grad():
                x = h if self.pos is None else h + self.pos[: h.shape[1]]
                scores = torch.tanh(x @ self.w1) @ self.w2  # [B, L, K]
                valid = length_mask(lengths, h.shape[1])[..., None]
                self.last_max_logit = scores.float().masked_fill(~valid, float("-inf")).amax()
        return multi_interest(h, lengths, self.w1, self.w2, pos=self.pos, values=values, backend=self.backend)
