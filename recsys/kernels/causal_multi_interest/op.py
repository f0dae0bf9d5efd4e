"""The causal (prefix) multi-interest extraction: argument checks, backend choice and the autograd op.

ComiRec-SA pools a sequence into ``K`` interests, ``A = softmax_L(S)``, ``V = Aᵀ H``. Dense training
needs those interests at every prefix ``t`` of the sequence (position ``t`` predicts click
``t + 1`` from clicks ``<= t``). The scores ``S`` do not depend on ``t``, so every prefix comes out of
one online-softmax scan over the sequence: per ``(b, k)`` a running maximum, sum and weighted sum
of ``h``, read out at every ``t``. The Triton kernels (:mod:`.triton`) do that scan in blocks of
positions and never hold the ``[B, L, L, K]`` prefix weights; the PyTorch twin (:mod:`.reference`)
does hold them.

The backward is one reverse scan. With ``lse_t`` the log-sum-exp of ``scores[: t + 1]`` (saved by the
forward) and ``g_t`` the gradient of ``out_t``::

    S_l = g_l + exp(lse_l - lse_{l+1}) S_{l+1}                dh_l = Σ_k exp(s_l - lse_l) S_l
    U_l = <g_l, out_l> + exp(lse_l - lse_{l+1}) U_{l+1}        ds_l = <h_l, dh_l> - exp(s_l - lse_l) U_l

(per interest ``k``; ``lse`` is non-decreasing in ``t``, so every factor is at most 1).
"""

from __future__ import annotations

import torch
from torch import Tensor

from recsys.kernels.causal_multi_interest.reference import causal_multi_interest_ref
from recsys.kernels.common.backend import check_lengths, use_triton

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_DIM = 256  # d held in registers per program
MAX_INTERESTS = 32  # the backward keeps a [K, d] carry per program


def check_args(h: Tensor, scores: Tensor, lengths: Tensor) -> None:
    """Raise ValueError unless ``h [B, L, d]`` and ``scores [B, L, K]`` (floating point, one
    device) and ``lengths [B]`` (integer) fit together."""
    if h.dim() != 3:
        raise ValueError(f"h must be [B, L, d], got {tuple(h.shape)}")
    if scores.dim() != 3 or scores.shape[:2] != h.shape[:2]:
        raise ValueError(f"scores must be [{h.shape[0]}, {h.shape[1]}, K] to match h, got {tuple(scores.shape)}")
    if not (h.dtype.is_floating_point and scores.dtype.is_floating_point):
        raise ValueError(f"h and scores must be floating point, got {h.dtype} and {scores.dtype}")
    if h.device != scores.device:
        raise ValueError(f"h and scores are on different devices: {h.device}, {scores.device}")
    check_lengths(lengths, h.shape[0], "lengths")


def triton_supports(h: Tensor, scores: Tensor) -> bool:
    """Whether the kernels cover these inputs: fp16/bf16/fp32, ``d <= 256``, ``K <= 32``."""
    return (h.dtype in DTYPES and scores.dtype in DTYPES and h.shape[2] <= MAX_DIM
            and scores.shape[2] <= MAX_INTERESTS)


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
            ``d <= 256``, ``K <= 32``), else the PyTorch twin.

    Returns:
        ``[B, L, K, d]`` in ``h``'s dtype; under autocast ``h`` is first cast to the autocast dtype
        (as a matmul would be). The softmax and the sums run in fp32 (fp64 in the twin for fp64).
    """
    check_args(h, scores, lengths)
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
                    f"the Triton causal multi-interest kernels take fp16/bf16/fp32, d <= {MAX_DIM} and "
                    f"K <= {MAX_INTERESTS}; got {h.dtype}/{scores.dtype}, d = {h.shape[2]}, "
                    f"K = {scores.shape[2]} (use backend='torch')"
                )
        return causal_multi_interest_ref(h, scores, lengths)


# --------------------------------------------------------------------------------------------
# The registered operators (one path, eager and under torch.compile)
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("recsys::causal_multi_interest", mutates_args=())
def causal_multi_interest_op(h: Tensor, scores: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """``(out [B, L, K, d] in h's dtype, lse [B, L, K] fp32)`` of the Triton forward (contiguous
    inputs); ``lse[b, t, k]`` is the log-sum-exp of ``scores[b, : t + 1, k]`` (0 at padded ``t``)."""
    from recsys.kernels.causal_multi_interest import triton as kernels

    return kernels.forward(h, scores, lengths)


@causal_multi_interest_op.register_fake
def _(h, scores, lengths):
    b, seq_len, d = h.shape
    k = scores.shape[2]
    return h.new_empty((b, seq_len, k, d)), h.new_empty((b, seq_len, k), dtype=torch.float32)


@torch.library.custom_op("recsys::causal_multi_interest_backward", mutates_args=())
def causal_multi_interest_backward_op(h: Tensor, scores: Tensor, lengths: Tensor, out: Tensor, lse: Tensor,
                                      grad: Tensor) -> tuple[Tensor, Tensor]:
    """``(dh [B, L, d] in h's dtype, dscores [B, L, K] in scores' dtype)`` of the Triton backward."""
    from recsys.kernels.causal_multi_interest import triton as kernels

    return kernels.backward(h, scores, lengths, out, lse, grad)


@causal_multi_interest_backward_op.register_fake
def _(h, scores, lengths, out, lse, grad):
    return torch.empty_like(h), torch.empty_like(scores)


def _setup_context(ctx, inputs, output) -> None:
    h, scores, lengths = inputs
    out, lse = output
    ctx.save_for_backward(h, scores, lengths, out, lse)
    ctx.mark_non_differentiable(lse)


def _op_backward(ctx, grad, _dlse):
    h, scores, lengths, out, lse = ctx.saved_tensors
    dh, dscores = causal_multi_interest_backward_op(h, scores, lengths, out, lse, grad.contiguous())
    return dh, dscores, None


causal_multi_interest_op.register_autograd(_op_backward, setup_context=_setup_context)
