"""The argument checks of :func:`recsys.kernels.catalogue_logsumexp`."""

from __future__ import annotations

from torch import Tensor

__all__ = ["check_catalogue_logsumexp_args"]


def check_catalogue_logsumexp_args(user: Tensor, items: Tensor) -> None:
    """Raise ValueError unless ``user [R, d]`` and ``items [N, d]`` are floating point on one device."""
    if user.dim() != 2:
        raise ValueError(f"user must be [R, d], got {tuple(user.shape)}")
    if items.dim() != 2 or items.shape[1] != user.shape[1]:
        raise ValueError(f"items must be [N, {user.shape[1]}], got {tuple(items.shape)}")
    if user.device != items.device:
        raise ValueError(f"user and items are on different devices: {user.device}, {items.device}")
    if not (user.dtype.is_floating_point and items.dtype.is_floating_point):
        raise ValueError(f"user and items must be floating point, got {user.dtype} and {items.dtype}")
