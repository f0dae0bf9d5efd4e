"""The public causal (prefix) multi-interest op: check the arguments, choose the backend; the registered op.

ComiRec-SA pools a sequence into ``K`` interests, ``A = softmax_L(S)``, ``V = Aᵀ H``. Dense training
needs those interests at every prefix ``t`` of the sequence (position ``t`` predicts click
``t + 1`` from clicks ``<= t``). The scores ``S`` do not depend on ``t``, so every prefix comes out of
one online-softmax scan over the sequence: per ``(b, k)`` a running maximum, sum and weighted sum
of ``h``, read out at every ``t``. The Triton kernels (:mod:`.triton`) do that scan in blocks of
positions and never hold the ``[B, L, L, K]`` prefix weights; the PyTorch twin (:mod:`.reference`)
does hold them.

The gradients, per interest, with ``lse_t`` the log-sum-exp of ``scores[: t + 1]`` (saved by the
forward), ``w_tl = exp(s_l - lse_t)`` the prefix weights (at most 1) and ``g_t`` the gradient of
``out_t``::

    dh_l = Σ_k Σ_{l <= t < n} w_tl g_t        ds_l = Σ_{l <= t < n} w_tl (<g_t, h_l> - <g_t, out_t>)

Summed from the end they are one reverse scan (``S_l = g_l + exp(lse_l - lse_{l+1}) S_{l+1}``,
``dh_l = Σ_k exp(s_l - lse_l) S_l``); the kernels take the direct form, blockwise (see :mod:`.triton`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from recsys.kernels.causal_multi_interest import triton as kernel
from recsys.kernels.causal_multi_interest.checks import check_causal_multi_interest_args
from recsys.kernels.causal_multi_interest.reference import causal_multi_interest_ref
from recsys.kernels.common.backend import use_triton

__all__ = ["causal_multi_interest", "triton_supports"]

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_DIM = 256  # d held in registers per program


def triton_supports(h: Tensor, scores: Tensor) -> bool:
    """Whether the kernels cover these inputs: fp16/bf16/fp32 and ``d <= 256``."""
    return h.dtype in DTYPES and scores.dtype in DTYPES and h.shape[2] <= MAX_DIM


def causal_multi_interest(h: Tensor, scores: Tensor, lengths: Tensor, *, backend: str = "auto") -> Tensor:
    """Interest ``k`` at every prefix ``t``: the softmax over ``l <= t`` of ``scores[b, l, k]`` pooling ``h[b, l]``.

    ``out[b, t, k] = Σ_{l <= t} softmax_{l <= t}(scores[b, l, k]) h[b, l]`` for ``t < lengths[b]``,
    0 for ``t >= lengths[b]``. Differentiable in ``h`` and ``scores``.

    Args:
        h: ``[B, L, d]`` item embeddings or encoder states, right-padded; what is pooled.
        scores: ``[B, L, K]`` attention logits, one column per interest. They must not depend on the
            prefix (a recency bias linear in position, ALiBi-style, is added by the caller: its
            ``t`` term cancels in the softmax). Read in fp32 whatever their dtype.
        lengths: ``[B]`` int valid lengths (values outside ``[0, L]`` act as clamped; 0 gives
            zeros, with zero gradients). Entries of ``h`` and ``scores`` at padded positions are
            never used.
        backend: ``"auto" | "triton" | "torch"``; "auto" takes the Triton kernels on CUDA (and on
            CPU under ``TRITON_INTERPRET=1``) where they cover the inputs (fp16/bf16/fp32,
            ``d <= 256``), else the PyTorch twin.

    Returns:
        ``[B, L, K, d]`` in ``h``'s dtype; under autocast ``h`` is first cast to the autocast dtype
        (as a matmul would be). The softmax and the sums run in fp32 (fp64 in the twin for fp64).
    """
    check_causal_multi_interest_args(h, scores, lengths)
    device_type = h.device.type
    if torch.is_autocast_enabled(device_type):
        h = h.to(torch.get_autocast_dtype(device_type))
    lengths = lengths.to(h.device)
    with torch.autocast(device_type, enabled=False):
        if use_triton(backend, h.device):
            if triton_supports(h, scores):
                return causal_multi_interest_op(h.contiguous(), scores.contiguous(), lengths.contiguous())[0]
            if backend == "triton":
                raise ValueError(
                    f"the Triton causal multi-interest kernels take fp16/bf16/fp32 and d <= {MAX_DIM}; got "
                    f"h {h.dtype}, scores {scores.dtype}, d = {h.shape[2]} (use backend='torch')"
                )
        return causal_multi_interest_ref(h, scores, lengths)


# --------------------------------------------------------------------------------------------
# The registered operators (one path, eager and under torch.compile)
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("recsys::causal_multi_interest", mutates_args=())
def causal_multi_interest_op(h: Tensor, scores: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """``(out [B, L, K, d] in h's dtype, lse [B, L, K] fp32)`` of the Triton forward (contiguous
    inputs); ``lse[b, t, k]`` is the log-sum-exp of ``scores[b, : t + 1, k]`` (0 at padded ``t``)."""
    return kernel.forward(h, scores, lengths)


@causal_multi_interest_op.register_fake
def _(h: Tensor, scores: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    b, seq_len, d = h.shape
    k = scores.shape[2]
    return h.new_empty((b, seq_len, k, d)), h.new_empty((b, seq_len, k), dtype=torch.float32)


@torch.library.custom_op("recsys::causal_multi_interest_backward", mutates_args=())
def causal_multi_interest_backward_op(
    h: Tensor, scores: Tensor, lengths: Tensor, lse: Tensor, grad: Tensor
) -> tuple[Tensor, Tensor]:
    """``(dh [B, L, d] in h's dtype, dscores [B, L, K] in scores' dtype)`` of the Triton backward."""
    return kernel.backward(h, scores, lengths, lse, grad)


@causal_multi_interest_backward_op.register_fake
def _(h: Tensor, scores: Tensor, lengths: Tensor, lse: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(h), torch.empty_like(scores)


def _setup_context(ctx: Any, inputs: tuple[Tensor, Tensor, Tensor], output: tuple[Tensor, Tensor]) -> None:
    h, scores, lengths = inputs
    _, lse = output
    ctx.save_for_backward(h, scores, lengths, lse)
    ctx.mark_non_differentiable(lse)


def _op_backward(ctx: Any, grad: Tensor, _dlse: Tensor | None) -> tuple[Tensor, Tensor, None]:
    h, scores, lengths, lse = ctx.saved_tensors
    dh, dscores = causal_multi_interest_backward_op(h, scores, lengths, lse, grad.contiguous())
    return dh, dscores, None


causal_multi_interest_op.register_autograd(_op_backward, setup_context=_setup_context)
