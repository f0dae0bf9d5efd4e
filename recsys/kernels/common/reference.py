"""Plain PyTorch twins of every kernel: the oracle in tests and the fallback where Triton can't run.

Each function has the same signature and semantics as its Triton counterpart. They compute in
the dtype of their inputs (matmuls accumulate in fp32 as PyTorch does), so comparing a twin run
in fp16/bf16 against the same twin run in fp64 measures "PyTorch's own error" at that precision.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _at_least_fp32(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


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
    p = torch.softmax(_at_least_fp32(s), dim=-1).to(v.dtype).masked_fill(~any_visible, 0.0)
    return torch.matmul(p, v)


def length_softmax(scores: Tensor, lengths: Tensor) -> Tensor:
    """Softmax over the sequence axis with padding masked: ``scores [B, L, K]`` -> ``A [B, L, K]``.

    Positions ``>= lengths[b]`` get weight 0; a row of length 0 is all zeros (with zero
    gradients), never NaN. Computed in fp32 (fp64 stays fp64).
    """
    valid = torch.arange(scores.shape[1], device=scores.device)[None, :, None] < lengths.to(scores.device)[:, None, None]
    s = _at_least_fp32(scores).masked_fill(~valid, float("-inf")).masked_fill(~valid.any(dim=1, keepdim=True), 0.0)
    return torch.softmax(s, dim=1).masked_fill(~valid, 0.0)


def cap_scores(scores: Tensor, score_cap: float | None) -> Tensor:
    """``score_cap · tanh(scores / score_cap)`` (bounded in ``(-cap, cap)``); unchanged when 0/None."""
    return score_cap * torch.tanh(scores / score_cap) if score_cap else scores


def multi_interest_ref(
    h: Tensor, lengths: Tensor, w1: Tensor, w2: Tensor, *, pos: Tensor | None = None,
    values: Tensor | None = None, score_cap: float | None = None, return_scores: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """ComiRec-SA self-attentive extraction: ``A = softmax_L(tanh((H + P) W1) W2)``, ``V = Aᵀ H``.

    It is attention with the K columns of ``W2`` as shared learned queries, keys
    ``tanh((H + P) W1)``, values ``H`` and scale 1.

    Args:
        h: ``[B, L, d]`` item embeddings of the (right-padded) click sequences.
        lengths: ``[B]`` int, valid clicks per sequence (0 allowed).
        w1: ``[d, hidden]``.
        w2: ``[hidden, K]``.
        pos: optional ``[L_max, d]`` (``L_max >= L``) position embeddings, added to ``h`` for the
            scores only (not to the values).
        values: optional ``[B, L, d_v]`` pooled instead of ``h`` (``V = Aᵀ values``).
        score_cap: if > 0, the scores become ``cap · tanh(S / cap)`` before the softmax.
        return_scores: also return the (capped) scores ``S [B, L, K]`` (fp32, or fp64 for fp64 inputs), differentiable:
            the logits whose softmax over valid positions is ``A``; 0 at padded positions.

    Returns:
        ``[B, K, d]`` (``[B, K, d_v]`` with ``values``) interests; 0 for a sequence of length 0.
        With ``return_scores``: ``(interests, scores)``.
    """
    x = h if pos is None else h + pos[: h.shape[1]]
    scores = cap_scores(_at_least_fp32(torch.matmul(torch.tanh(torch.matmul(x, w1)), w2)), score_cap)  # [B, L, K]
    pooled = h if values is None else values
    a = length_softmax(scores, lengths)  # [B, L, K]
    out = torch.matmul(a.transpose(1, 2).to(pooled.dtype), pooled)  # [B, K, d]
    if not return_scores:
        return out
    padded = torch.arange(scores.shape[1], device=scores.device)[None, :] >= lengths.to(scores.device)[:, None]
    return out, scores.masked_fill(padded[..., None], 0.0)


def max_interest_scores_ref(interests: Tensor, items: Tensor) -> Tensor:
    """``interests [B, K, d]``, ``items [S, d]`` (one dtype) -> ``[B, S]`` float32 (at least)
    ``max_k <interests[b, k], items[s]>``, through the ``[B, K, S]`` product; ``amax`` shares the
    gradient of a tie evenly between the tied interests."""
    scores = torch.einsum("bkd,sd->bks", interests, items).amax(dim=1)
    return _at_least_fp32(scores)
