"""Public kernel entry points: check arguments, then run the Triton kernel or its PyTorch twin.

``backend="auto"`` picks Triton for CUDA tensors (and for CPU tensors when
``TRITON_INTERPRET=1`` is set, which is how the kernel tests run without a GPU) and the
PyTorch twin otherwise. ``backend="triton"`` or ``"torch"`` forces one.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from recsys.kernels import reference

BACKENDS = ("auto", "triton", "torch")


def triton_available(device: torch.device) -> bool:
    """True where the Triton kernels can run on tensors of ``device``."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


def _use_triton(backend: str, device: torch.device) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    if backend == "triton":
        if not triton_available(device):
            raise RuntimeError(
                f"backend='triton' needs CUDA tensors or TRITON_INTERPRET=1, got a {device.type} tensor"
            )
        return True
    return triton_available(device)


def _check_lengths(key_lengths: Tensor | None, batch: int, name: str) -> None:
    if key_lengths is None:
        return
    if key_lengths.shape != (batch,):
        raise ValueError(f"{name} must have shape [{batch}], got {tuple(key_lengths.shape)}")
    if key_lengths.dtype.is_floating_point or key_lengths.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got {key_lengths.dtype}")


def check_attention_args(q: Tensor, k: Tensor, v: Tensor, key_lengths: Tensor | None, causal: bool) -> None:
    """Raise ValueError unless ``q [B or 1, H, Lq, D]``, ``k [B, H, Lk, D]``, ``v [B, H, Lk, Dv]`` (one
    dtype, one device), ``key_lengths [B]`` int (or None) and ``causal`` fit together."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be 4-d [B, H, L, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    b, h, lk, d = k.shape
    if v.shape[:3] != (b, h, lk):
        raise ValueError(f"v {tuple(v.shape)} does not match k {tuple(k.shape)} in [B, H, Lk]")
    if q.shape[0] not in (1, b) or q.shape[1] != h or q.shape[3] != d:
        raise ValueError(f"q {tuple(q.shape)} must be [{b} or 1, {h}, Lq, {d}] to match k")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if causal and q.shape[2] != lk:
        raise ValueError(f"causal attention needs Lq == Lk, got {q.shape[2]} and {lk}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    _check_lengths(key_lengths, b, "key_lengths")


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
) -> Tensor:
    """Scaled dot-product attention with key padding, causal masking and logit soft-capping.

    Args:
        q: ``[B or 1, H, Lq, D]``; ``B = 1`` broadcasts shared learned queries over the batch.
        k: ``[B, H, Lk, D]``.
        v: ``[B, H, Lk, D]``.
        key_lengths: ``[B]`` int; keys at positions ``>= key_lengths[b]`` are masked.
        causal: query ``i`` sees keys ``j <= i``.
        scale: logit scale, default ``1 / sqrt(D)``.
        softcap: if > 0, logits become ``softcap * tanh(logits / softcap)``.
        backend: ``"auto" | "triton" | "torch"``.

    Returns:
        ``[B, H, Lq, D]``; rows with no visible key are 0 (and get zero gradients).
    """
    check_attention_args(q, k, v, key_lengths, causal)
    softcap = softcap or None
    if _use_triton(backend, q.device):
        from recsys.kernels.triton_attention import flash_attention, triton_attention, triton_supports

        if triton_supports(q, v):  # the arguments are checked: straight to the kernels
            return flash_attention(q, k, v, key_lengths, causal, scale, softcap)
        if backend == "triton":  # the kernel's own error
            return triton_attention(q, k, v, key_lengths=key_lengths, causal=causal, scale=scale, softcap=softcap)
        # "auto" sends what the kernel does not cover (fp64, D > 128) to the twin
    return reference.attention_ref(
        q, k, v, key_lengths=key_lengths, causal=causal, scale=scale, softcap=softcap
    )


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
    if h.dim() != 3:
        raise ValueError(f"h must be [B, L, d], got {tuple(h.shape)}")
    b, seq_len, d = h.shape
    if w1.dim() != 2 or w1.shape[0] != d:
        raise ValueError(f"w1 must be [{d}, hidden], got {tuple(w1.shape)}")
    if w2.dim() != 2 or w2.shape[0] != w1.shape[1]:
        raise ValueError(f"w2 must be [{w1.shape[1]}, K], got {tuple(w2.shape)}")
    if pos is not None and (pos.dim() != 2 or pos.shape[0] < seq_len or pos.shape[1] != d):
        raise ValueError(f"pos must be [L_max >= {seq_len}, {d}], got {tuple(pos.shape)}")
    if values is not None and (values.dim() != 3 or values.shape[:2] != h.shape[:2]):
        raise ValueError(f"values must be [{b}, {seq_len}, d_v], got {tuple(values.shape)}")
    _check_lengths(lengths, b, "lengths")
    if score_cap is not None and not score_cap >= 0:
        raise ValueError(f"score_cap must be >= 0 (0 or None: no cap), got {score_cap}")
    extra = {"score_cap": score_cap or None, "return_scores": return_scores}
    if values is not None:
        if backend == "triton":
            raise ValueError("the Triton multi-interest kernel pools h itself: values= needs backend 'auto' or 'torch'")
        return reference.multi_interest_ref(h, lengths, w1, w2, pos=pos, values=values, **extra)
    if _use_triton(backend, h.device):
        from recsys.kernels.triton_multi_interest import triton_multi_interest, triton_supports

        # "auto" sends what the kernel does not cover (fp64, d > 128) to the twin; "triton" raises
        if backend == "triton" or triton_supports(h, w1):
            return triton_multi_interest(h, lengths, w1, w2, pos=pos, **extra)
    return reference.multi_interest_ref(h, lengths, w1, w2, pos=pos, **extra)


def max_interest_scores(interests: Tensor, items: Tensor, *, backend: str = "auto") -> Tensor:
    """``out[b, s] = max_k <interests[b, k], items[s]>``: each item scored by the user's best
    matching interest (the score retrieval ranks by; ``train.negative_scores = "max"``).

    Args:
        interests: ``[B, K, d]``.
        items: ``[S, d]``, same device.
        backend: ``"auto" | "triton" | "torch"``.

    Returns:
        ``[B, S]`` float32 (float64 for float64 inputs). The inputs are multiplied in the autocast
        dtype where autocast is on for their device, else in their common dtype. The gradient of
        each score goes to its winning interest (Triton: the first of tied ones; the twin splits
        ties evenly). The Triton kernels never hold the ``[B, K, S]`` product; "auto" sends fp64,
        ``d > 256``, ``K > 127`` and fp32 on CUDA (the kernels' IEEE fp32 products spill there) to
        the twin.
    """
    if interests.dim() != 3:
        raise ValueError(f"interests must be [B, K, d], got {tuple(interests.shape)}")
    if items.dim() != 2 or items.shape[1] != interests.shape[2]:
        raise ValueError(f"items must be [S, {interests.shape[2]}], got {tuple(items.shape)}")
    if interests.device != items.device:
        raise ValueError(f"interests and items are on different devices: {interests.device}, {items.device}")
    if not (interests.dtype.is_floating_point and items.dtype.is_floating_point):
        raise ValueError(f"interests and items must be floating point, got {interests.dtype} and {items.dtype}")
    device_type = interests.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
    else:
        dtype = torch.promote_types(interests.dtype, items.dtype)
    interests, items = interests.to(dtype), items.to(dtype)
    if _use_triton(backend, interests.device):
        from recsys.kernels.triton_max_scores import max_interest_scores_op, triton_supports

        # "auto" leaves fp32 on CUDA to the twin: the kernel's IEEE fp32 products spill registers
        # on sm_90 (6 KB of stack per thread, tests/kernels/sm90.py); bf16/fp16 is the fast path
        ieee_on_gpu = dtype == torch.float32 and interests.device.type == "cuda"
        if triton_supports(interests) and (backend == "triton" or not ieee_on_gpu):
            return max_interest_scores_op(interests, items)[0]
        if backend == "triton":
            raise ValueError(f"the Triton kernel needs fp16/bf16/fp32, d <= 256 and K <= 127; got "
                             f"{dtype}, d = {interests.shape[2]}, K = {interests.shape[1]}")
    with torch.autocast(device_type, enabled=False):
        return reference.max_interest_scores_ref(interests, items)
