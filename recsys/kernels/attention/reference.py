"""PyTorch twin of the attention kernel: the oracle in tests and the fallback where Triton can't run.

Same signature and semantics as :func:`recsys.kernels.attention.triton.triton_attention`; it
materialises the full ``[B, H, Lq, Lk]`` score matrix, padded query rows included.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from recsys.kernels.common.reference import at_least_fp32

__all__ = ["attention_ref"]


def attention_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_lengths: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    dropout: float = 0.0,
) -> Tensor:
    """Masked softmax attention, materialising the full score matrix.

    Args:
        q: ``[B or 1, H, Lq, D]`` queries; a leading 1 broadcasts shared (learned) queries.
        k: ``[B, H, Lk, D]`` keys.
        v: ``[B, H, Lk, Dv]`` values.
        key_lengths: ``[B]`` int; keys at positions ``>= key_lengths[b]`` are masked.
        causal: query ``i`` sees keys ``j <= i`` only. With ``key_lengths``, query rows
            ``i >= key_lengths[b]`` are padding too (right-padded self-attention): they see no key.
        scale: multiplies ``q kᵀ``; default ``1 / sqrt(D)``.
        softcap: if set, logits become ``softcap * tanh(logits / softcap)`` (after scaling).
        dropout: drop each attention probability with this chance and rescale the rest by
            ``1 / (1 - dropout)`` (BERT's and SASRec's attention dropout; pass 0 outside training).

    Returns:
        ``[B, H, Lq, Dv]``. A query row with no visible key (causal: every padded row) is exactly
        0 and contributes nothing to any gradient.
    """
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # [B, H, Lq, Lk]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    visible = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    if causal:
        visible = torch.tril(visible)
    visible = visible.expand(k.shape[0], 1, lq, lk)  # [B, 1, Lq, Lk]
    if key_lengths is not None:
        lengths = key_lengths.to(q.device).view(-1, 1)
        key_ok = torch.arange(lk, device=q.device) < lengths  # [B, Lk]
        visible = visible & key_ok[:, None, None, :]
        if causal:  # right-padded self-attention: query rows past the length are padding
            query_ok = torch.arange(lq, device=q.device) < lengths  # [B, Lq]
            visible = visible & query_ok[:, None, :, None]
    any_visible = visible.any(dim=-1, keepdim=True)  # [B, 1, Lq, 1]
    s = s.masked_fill(~visible, float("-inf")).masked_fill(~any_visible, 0.0)
    p = torch.softmax(at_least_fp32(s), dim=-1).to(v.dtype).masked_fill(~any_visible, 0.0)
    if dropout:
        p = torch.nn.functional.dropout(p, dropout)
    return torch.matmul(p, v)
