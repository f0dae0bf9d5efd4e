"""Plain PyTorch twins of every kernel: the oracle in tests and the fallback where Triton can't run.

Each function has the same signature and semantics as its Triton counterpart. They compute in
the dtype of their inputs (matmuls accumulate in fp32 as PyTorch does), so comparing a twin run
in fp16/bf16 against the same twin run in fp64 measures "PyTorch's own error" at that precision.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def attention_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_lengths: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
) -> Tensor:
    """Masked softmax attention, materialising the full score matrix.

    Args:
        q: ``[B or 1, H, Lq, D]`` queries; a leading 1 broadcasts shared (learned) queries.
        k: ``[B, H, Lk, D]`` keys.
        v: ``[B, H, Lk, Dv]`` values.
        key_lengths: ``[B]`` int; keys at positions ``>= key_lengths[b]`` are masked.
        causal: query ``i`` sees keys ``j <= i`` only.
        scale: multiplies ``q kᵀ``; default ``1 / sqrt(D)``.
        softcap: if set, logits become ``softcap * tanh(logits / softcap)`` (after scaling).

    Returns:
        ``[B, H, Lq, Dv]``. A query row with no visible key is exactly 0, with zero gradients.
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
        key_ok = torch.arange(lk, device=q.device) < key_lengths.to(q.device).view(-1, 1)  # [B, Lk]
        visible = visible & key_ok[:, None, None, :]
    any_visible = visible.any(dim=-1, keepdim=True)  # [B, 1, Lq, 1]
    s = s.masked_fill(~visible, float("-inf")).masked_fill(~any_visible, 0.0)
    p = torch.softmax(s.float(), dim=-1).to(v.dtype).masked_fill(~any_visible, 0.0)
    return torch.matmul(p, v)


def multi_interest_ref(
    h: Tensor, lengths: Tensor, w1: Tensor, w2: Tensor, *, pos: Tensor | None = None,
    values: Tensor | None = None,
) -> Tensor:
    """ComiRec-SA self-attentive extraction: ``A = softmax_L(tanh((H + P) W1) W2)``, ``V = Aᵀ H``.

    It is attention with the K columns of ``W2`` as shared learned queries, keys
    ``tanh((H + P) W1)``, values ``H`` and scale 1, so it reuses :func:`attention_ref`.

    Args:
        h: ``[B, L, d]`` item embeddings of the (right-padded) click sequences.
        lengths: ``[B]`` int, valid clicks per sequence (0 allowed).
        w1: ``[d, hidden]``.
        w2: ``[hidden, K]``.
        pos: optional ``[L_max, d]`` (``L_max >= L``) position embeddings, added to ``h`` for the
            scores only (not to the values).
        values: optional ``[B, L, d_v]`` pooled instead of ``h`` (``V = Aᵀ values``).

    Returns:
        ``[B, K, d]`` (``[B, K, d_v]`` with ``values``) interests; 0 for a sequence of length 0.
    """
    x = h if pos is None else h + pos[: h.shape[1]]
    keys = torch.tanh(torch.matmul(x, w1))  # [B, L, hidden]
    queries = w2.t()[None, None]  # [1, 1, K, hidden]
    pooled = h if values is None else values
    out = attention_ref(queries, keys[:, None], pooled[:, None], key_lengths=lengths, scale=1.0)
    return out[:, 0]  # [B, K, d]
