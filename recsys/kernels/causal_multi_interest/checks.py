"""The argument checks of :func:`recsys.kernels.causal_multi_interest`."""

from __future__ import annotations

from torch import Tensor

from recsys.kernels.common.backend import check_lengths

__all__ = ["check_causal_multi_interest_args"]


def check_causal_multi_interest_args(h: Tensor, scores: Tensor, lengths: Tensor) -> None:
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
