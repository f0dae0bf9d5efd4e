"""Dynamic (capsule) routing for ComiRec-DR and MIND, after ComiRec's ``CapsuleNetwork``.

Given the history ``H [B, L, d]`` the layer forms per-interest predictions
``Ĥ [B, K, L, d]`` with a bilinear map, then routes for ``iters`` iterations::

    w     = softmax over K of the routing logits b [B, K, L], set to 0 at padded positions
    z_k   = squash(sum_l w_kl Ĥ_kl)
    b_kl += <Ĥ_kl, z_k>                       (all but the last iteration)

As in ComiRec's code, the iterations before the last see ``Ĥ`` with the gradient stopped, and
the routing logits carry no gradient at all (they only depend on stopped quantities), so
the gradient reaches ``Ĥ`` through the last iteration's weighted sum only. Those iterations run
under ``torch.no_grad`` here, which computes the same values and gradients with less memory.

Deliberate differences from ComiRec's code:

- with ``positions="recent"`` (the library's default) the per-position map ``W_l`` belongs to the
  ``l``-th most recent click instead of the ``l``-th slot of the right-padded window, for the
  reason ComiRec-SA's learned positions count back from the latest click
  (:class:`recsys.nn.multi_interest.SelfAttentiveHead`); ``"absolute"`` is ComiRec's indexing;
- the per-position bilinear weights start at ``N(0, 1/d)`` instead of ``N(0, 1)``, so ``Ĥ`` has
  the scale of the item embeddings (ComiRec's tiny Glorot-initialised embeddings made the
  ``N(0, 1)`` map roughly scale-preserving; our embeddings start at norm about 1);
- the shared (MIND) map has no bias, so padded positions predict exactly zero;
- random initial logits are used in training only; in eval mode a fixed table drawn at
  construction (and saved in the state dict) makes interests deterministic.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from recsys.nn.masking import length_mask, recency_index

BILINEAR = ("per_position", "shared")
INIT_LOGITS = ("zeros", "normal")


def squash(z: Tensor, eps: float = 1e-9) -> Tensor:
    """Capsule squash over the last axis: ``z · |z|² / (1 + |z|²) / sqrt(|z|² + eps)`` (norm < 1)."""
    n = (z * z).sum(dim=-1, keepdim=True)
    return z * (n / (1.0 + n) / torch.sqrt(n + eps))


class CapsuleRouting(nn.Module):
    """``h [B, L, d]`` (zero at padded positions), ``lengths [B]`` -> interest capsules ``[B, K, d]``.

    Args:
        dim: ``d`` (item and capsule size).
        num_interests: ``K``.
        max_len: longest sequence (the per-position map has one ``[K·d, d]`` matrix per position).
        bilinear: ``"per_position"`` (ComiRec-DR, ``bilinear_type=2``: ``Ĥ_l = W_l h_l`` with
            ``W [max_len, K·d, d]``) or ``"shared"`` (MIND, ``bilinear_type=0``: one ``[d, d]``
            map, its output repeated for every interest).
        init_logits: ``"zeros"`` (ComiRec-DR) or ``"normal"`` (MIND: a standard normal
            truncated at ±2, like ``tf.truncated_normal``, fresh for every batch in training).
        iters: routing iterations (ComiRec: 3).
        positions: which click each per-position map ``W_l`` reads: ``"recent"`` (``l`` clicks
            back from the latest) or ``"absolute"`` (slot ``l`` of the window, as ComiRec).
            The shared map has no positions and ignores it.
    """

    eval_logits: Tensor  # [K, max_len] buffer: the routing logits at evaluation (init_logits "normal")

    def __init__(
        self,
        dim: int,
        num_interests: int,
        max_len: int,
        *,
        bilinear: str,
        init_logits: str,
        iters: int = 3,
        positions: str = "recent",
    ):
        super().__init__()
        if positions not in ("recent", "absolute"):
            raise ValueError(f"model.positions: the routing layer needs 'recent' or 'absolute', got {positions!r}")
        self.positions = positions
        if bilinear not in BILINEAR:
            raise ValueError(f"bilinear must be one of {BILINEAR}, got {bilinear!r}")
        if init_logits not in INIT_LOGITS:
            raise ValueError(f"init_logits must be one of {INIT_LOGITS}, got {init_logits!r}")
        if iters < 1:
            raise ValueError(f"routing iters must be >= 1, got {iters}")
        self.dim, self.num_interests, self.max_len, self.iters = dim, num_interests, max_len, iters
        self.bilinear, self.init_logits = bilinear, init_logits
        if bilinear == "per_position":
            self.weight = nn.Parameter(torch.empty(max_len, num_interests * dim, dim))
            nn.init.normal_(self.weight, std=1.0 / math.sqrt(dim))
        else:
            self.linear = nn.Linear(dim, dim, bias=False)
        if init_logits == "normal":
            self.register_buffer("eval_logits", _truncated_normal((num_interests, max_len), None))

    def predictions(self, h: Tensor) -> Tensor:
        """``h [B, L, d]`` -> ``Ĥ [B, K, L, d]``."""
        b, seq_len, d = h.shape
        if self.bilinear == "per_position":
            hat = torch.einsum("lod,bld->blo", self.weight[:seq_len], h)  # [B, L, K·d]
            return hat.view(b, seq_len, self.num_interests, d).transpose(1, 2)
        return self.linear(h)[:, None].expand(b, self.num_interests, seq_len, d)

    def initial_logits(self, batch: int, seq_len: int, like: Tensor) -> Tensor:
        """Routing logits before the first iteration: ``[B, K, L]``."""
        shape = (batch, self.num_interests, seq_len)
        if self.init_logits == "zeros":
            return like.new_zeros(shape)
        if self.training:
            return _truncated_normal(shape, like)
        return self.eval_logits[:, :seq_len].to(like.dtype).expand(shape)

    def routing_weights(self, hat: Tensor, lengths: Tensor) -> Tensor:
        """The last iteration's coupling weights ``[B, K, L]`` (no gradient; 0 at padded positions)."""
        b, _, seq_len, _ = hat.shape
        mask = length_mask(lengths, seq_len).to(hat.dtype)[:, None]  # [B, 1, L]
        with torch.no_grad():
            hat = hat.detach()
            logits = self.initial_logits(b, seq_len, hat)
            for _ in range(self.iters - 1):
                w = torch.softmax(logits, dim=1) * mask
                caps = squash(torch.einsum("bkl,bkld->bkd", w, hat))
                logits = logits + torch.einsum("bkld,bkd->bkl", hat, caps)
            return torch.softmax(logits, dim=1) * mask

    def forward(self, h: Tensor, lengths: Tensor, return_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Capsules ``[B, K, d]``; with ``return_weights`` also the last coupling weights
        ``[B, K, L]`` in click order (no gradient; 0 at padded positions)."""
        seq_len = h.shape[1]
        if seq_len > self.max_len:
            raise ValueError(f"sequence length {seq_len} exceeds the routing layer's max_len {self.max_len}")
        index = None
        if self.bilinear == "per_position" and self.positions == "recent":  # row l <- l-th most recent click
            index = recency_index(lengths, seq_len)
            h = h.gather(1, index[..., None].expand_as(h))
        hat = self.predictions(h)  # [B, K, L, d]
        w = self.routing_weights(hat, lengths)  # [B, K, L]
        caps = squash(torch.einsum("bkl,bkld->bkd", w, hat))
        if not return_weights:
            return caps
        if index is not None:  # the recency permutation is its own inverse: back to click order
            w = w.gather(2, index[:, None].expand_as(w))
        return caps, w


def routing_scores(weights: Tensor) -> Tensor:
    """Coupling weights ``[B, K, L]`` -> scores ``[B, L, K]`` whose softmax over the valid clicks
    is each capsule's share of every click, ``w_kl / sum_l w_kl`` (the multi-interest
    diagnostics read capsules like attention)."""
    return torch.log(weights.clamp_min(1e-30)).transpose(1, 2)


def _truncated_normal(shape: tuple[int, ...], like: Tensor | None) -> Tensor:
    """Standard normal truncated at ±2 (``tf.truncated_normal``), on ``like``'s device/dtype."""
    out = torch.empty(shape) if like is None else like.new_empty(shape)
    return nn.init.trunc_normal_(out, std=1.0, a=-2.0, b=2.0)
