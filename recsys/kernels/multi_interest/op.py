"""The public multi-interest op: check the arguments, then run the fused Triton kernels or the
PyTorch twin."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from recsys.kernels.common.backend import use_triton
from recsys.kernels.multi_interest import triton as kernel
from recsys.kernels.multi_interest.checks import check_multi_interest_args
from recsys.kernels.multi_interest.reference import multi_interest_ref

__all__ = ["multi_interest"]


def multi_interest(
    h: Tensor,
    lengths: Tensor,
    w1: Tensor,
    w2: Tensor,
    *,
    pos: Tensor | None = None,
    values: Tensor | None = None,
    score_cap: float | None = None,
    return_scores: bool = False,
    backend: str = "auto",
) -> Tensor | tuple[Tensor, Tensor]:
    """ComiRec-SA self-attentive multi-interest extraction.

    ``A = softmax over L of S``, ``S = tanh((H + P) W1) W2`` (padding masked; with
    ``score_cap`` ``S`` becomes ``cap · tanh(S / cap)``), interests ``= Aᵀ H``
    (``= Aᵀ values`` when given).

    Args:
        h: ``[B, L, d]`` item embeddings, right-padded.
        lengths: ``[B]`` int valid lengths (0 gives zero interests).
        w1: ``[d, hidden]``.
        w2: ``[hidden, K]``.
        pos: optional ``[L_max, d]`` position embeddings added for the scores only.
        values: optional ``[B, L, d_v]`` pooled instead of ``h``. The fused Triton kernel pools
            ``h`` itself, so with ``values`` "auto" runs the PyTorch twin and "triton" is an error.
        score_cap: bound on the attention scores (0 or None: none).
        return_scores: also return the scores ``S [B, L, K]`` (fp32, differentiable; the
            softmax over the valid positions of each column is the attention ``A``; 0 at padded
            positions). The fused kernel writes them anyway, so this costs nothing extra.
        backend: ``"auto" | "triton" | "torch"``.

    Returns:
        ``[B, K, d]`` (``[B, K, d_v]`` with ``values``); with ``return_scores``
        ``(interests, scores)``.
    """
    check_multi_interest_args(h, lengths, w1, w2, pos, values, score_cap)
    extra: dict[str, Any] = {"score_cap": score_cap or None, "return_scores": return_scores}
    if values is not None:
        if backend == "triton":
            raise ValueError("the Triton multi-interest kernel pools h itself: values= needs backend 'auto' or 'torch'")
        return multi_interest_ref(h, lengths, w1, w2, pos=pos, values=values, **extra)
    # "auto" sends what the kernel does not cover (fp64, d > 128) to the twin; "triton" raises
    if use_triton(backend, h.device) and (backend == "triton" or kernel.triton_supports(h, w1)):
        return kernel.triton_multi_interest(h, lengths, w1, w2, pos=pos, **extra)
    return multi_interest_ref(h, lengths, w1, w2, pos=pos, **extra)
