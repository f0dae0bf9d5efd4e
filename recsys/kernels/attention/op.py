"""The public attention op: check the arguments, then run the Triton kernel or its PyTorch twin."""

from __future__ import annotations

from torch import Tensor

from recsys.kernels.attention import triton as kernel
from recsys.kernels.attention.checks import check_attention_args
from recsys.kernels.attention.reference import attention_ref
from recsys.kernels.common.backend import use_triton

__all__ = ["attention"]


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_lengths: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    backend: str = "auto",
    dropout: float = 0.0,
) -> Tensor:
    """Scaled dot-product attention with key padding, causal masking and logit soft-capping.

    Args:
        q: ``[B or 1, H, Lq, D]``; ``B = 1`` broadcasts shared learned queries over the batch.
        k: ``[B, H, Lk, D]``.
        v: ``[B, H, Lk, D]``.
        key_lengths: ``[B]`` int; keys at positions ``>= key_lengths[b]`` are masked.
        causal: query ``i`` sees keys ``j <= i``. With ``key_lengths``, query rows
            ``i >= key_lengths[b]`` are padding (right-padded self-attention): their output is 0
            and they contribute nothing to any gradient; the kernels skip their work.
        scale: logit scale, default ``1 / sqrt(D)``.
        softcap: if > 0, logits become ``softcap * tanh(logits / softcap)``.
        backend: ``"auto" | "triton" | "torch"``.
        dropout: attention-probability dropout (training only; pass 0 otherwise). The kernels do not
            implement it, so ``dropout > 0`` runs the PyTorch twin (``backend = "triton"`` refuses it).

    Returns:
        ``[B, H, Lq, D]``; rows with no visible key (causal: every padded row) are 0 and get zero
        gradients.
    """
    check_attention_args(q, k, v, key_lengths, causal)
    softcap = softcap or None
    if dropout:
        if backend == "triton":
            raise ValueError("attention: the Triton kernels have no attention dropout; use backend 'auto' or 'torch'")
        return attention_ref(
            q, k, v, key_lengths=key_lengths, causal=causal, scale=scale, softcap=softcap, dropout=dropout
        )
    if use_triton(backend, q.device):
        if kernel.triton_supports(q, v):  # the arguments are checked: straight to the kernels
            return kernel.flash_attention(q, k, v, key_lengths, causal, scale, softcap)
        if backend == "triton":  # the kernel's own error
            return kernel.triton_attention(
                q, k, v, key_lengths=key_lengths, causal=causal, scale=scale, softcap=softcap
            )
        # "auto" sends what the kernel does not cover (fp64, D > 128) to the twin
    return attention_ref(q, k, v, key_lengths=key_lengths, causal=causal, scale=scale, softcap=softcap)
