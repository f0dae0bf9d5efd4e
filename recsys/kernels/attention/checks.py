"""The argument checks of :func:`recsys.kernels.attention`, shared with the Triton entry point
:func:`recsys.kernels.attention.triton.triton_attention`."""

from __future__ import annotations

from torch import Tensor

from recsys.kernels.common.backend import check_lengths

__all__ = ["check_attention_args"]


def check_attention_args(q: Tensor, k: Tensor, v: Tensor, key_lengths: Tensor | None, causal: bool) -> None:
    """Raise ValueError unless ``q [B or 1, H, Lq, D]``, ``k [B, H, Lk, D]``, ``v [B, H, Lk, Dv]`` (one
    dtype, one device), ``key_lengths [B]`` int (or None) and ``causal`` fit together."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-d [B, H, L, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
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
    check_lengths(key_lengths, b, "key_lengths")
