"""PyTorch twin of the multi-interest kernels: the oracle in tests and the fallback where Triton can't run.

Same signature and semantics as :func:`recsys.kernels.multi_interest.triton.triton_multi_interest`
(plus ``values=``, which the fused kernel does not take).
"""

from __future__ import annotations

import torch
from torch import Tensor

from recsys.kernels.common.reference import at_least_fp32, length_softmax

__all__ = ["cap_scores", "multi_interest_ref"]


def cap_scores(scores: Tensor, score_cap: float | None) -> Tensor:
    """``score_cap · tanh(scores / score_cap)`` (bounded in ``(-cap, cap)``); unchanged when 0/None."""
    return score_cap * torch.tanh(scores / score_cap) if score_cap else scores


def multi_interest_ref(
    h: Tensor,
    lengths: Tensor,
    w1: Tensor,
    w2: Tensor,
    *,
    pos: Tensor | None = None,
    values: Tensor | None = None,
    score_cap: float | None = None,
    return_scores: bool = False,
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
    scores = cap_scores(at_least_fp32(torch.matmul(torch.tanh(torch.matmul(x, w1)), w2)), score_cap)  # [B, L, K]
    pooled = h if values is None else values
    a = length_softmax(scores, lengths)  # [B, L, K]
    out = torch.matmul(a.transpose(1, 2).to(pooled.dtype), pooled)  # [B, K, d]
    if not return_scores:
        return out
    padded = torch.arange(scores.shape[1], device=scores.device)[None, :] >= lengths.to(scores.device)[:, None]
    return out, scores.masked_fill(padded[..., None], 0.0)
