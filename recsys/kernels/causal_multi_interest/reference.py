"""PyTorch twin of the causal multi-interest extraction: the test oracle and the CPU fallback.

It materialises the ``[B, K, L, L]`` prefix-attention matrix (the Triton kernels never do), which
is exact and quick for the sequence lengths the models use (``L <= 200``). The softmax runs in fp32
(fp64 stays fp64), the pooling product in ``h``'s dtype, so the twin run in fp16/bf16 against
itself in fp64 measures PyTorch's own error at that precision.
"""

from __future__ import annotations

import torch
from torch import Tensor

from recsys.kernels.common.reference import at_least_fp32

__all__ = ["causal_multi_interest_ref"]


def causal_multi_interest_ref(h: Tensor, scores: Tensor, lengths: Tensor) -> Tensor:
    """Interest ``k`` at every prefix ``t``: ``out[b, t, k] = Σ_{l<=t} softmax_{l<=t}(scores[b, l, k]) h[b, l]``.

    Args:
        h: ``[B, L, d]`` item embeddings (or encoder states), right-padded.
        scores: ``[B, L, K]`` attention logits; they do not depend on the prefix ``t``.
        lengths: ``[B]`` int valid lengths (values outside ``[0, L]`` act as clamped).

    Returns:
        ``[B, L, K, d]`` in ``h``'s dtype; 0 at ``t >= lengths[b]`` (a sequence of length 0 is all
        zeros, with zero gradients). Values of ``h`` and ``scores`` at padded positions are never
        used, even when they are not finite.
    """
    b, seq_len, d = h.shape
    k = scores.shape[2]
    pos = torch.arange(seq_len, device=h.device)
    valid = pos[None, :] < lengths.to(h.device)[:, None]  # [B, L]
    # visible[b, t, l]: position l is in prefix t of a valid row t (l <= t < n implies l < n)
    visible = ((pos[:, None] >= pos[None, :])[None] & valid[:, :, None])[:, None]  # [B, 1, T, L]
    logits = at_least_fp32(scores).transpose(1, 2)[:, :, None, :]  # [B, K, 1, L]
    # a padded row t sees nothing: constant logits keep its softmax finite (and off the scores); zeroed below
    logits = torch.where(visible, logits, float("-inf")).masked_fill(~valid[:, None, :, None], 0.0)  # [B, K, T, L]
    weights = torch.softmax(logits, dim=-1).masked_fill(~visible, 0.0).to(h.dtype)
    values = h.masked_fill(~valid[:, :, None], 0.0)  # padded rows may hold anything, NaN included
    out = torch.bmm(weights.view(b, k * seq_len, seq_len), values)  # [B, K T, d]
    return out.view(b, k, seq_len, d).transpose(1, 2).contiguous()
