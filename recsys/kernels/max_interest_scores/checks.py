"""The argument checks of :func:`recsys.kernels.max_interest_scores`."""

from __future__ import annotations

from torch import Tensor

__all__ = ["check_max_interest_scores_args"]


def check_max_interest_scores_args(interests: Tensor, items: Tensor) -> None:
    """Raise ValueError unless ``interests [B, K, d]`` and ``items [S, d]`` are floating point on one device."""
    if interests.dim() != 3:
        raise ValueError(f"interests must be [B, K, d], got {tuple(interests.shape)}")
    if items.dim() != 2 or items.shape[1] != interests.shape[2]:
        raise ValueError(f"items must be [S, {interests.shape[2]}], got {tuple(items.shape)}")
    if interests.device != items.device:
        raise ValueError(f"interests and items are on different devices: {interests.device}, {items.device}")
    if not (interests.dtype.is_floating_point and items.dtype.is_floating_point):
        raise ValueError(f"interests and items must be floating point, got {interests.dtype} and {items.dtype}")
