"""Helpers for right-padded click sequences: validity masks, last-click gather, argument checks.

All of them work on device tensors without host synchronisation (no ``.item()``, no
data-dependent Python branching), so they are safe on the training hot path.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_batch(seq: Tensor, lengths: Tensor) -> None:
    """Raise ``ValueError`` naming the argument unless ``seq [B, L]`` and ``lengths [B]`` are integer.

    Only shapes and dtypes are checked (checking values would need a host sync).
    """
    if seq.dim() != 2:
        raise ValueError(f"seq must be [B, L], got shape {tuple(seq.shape)}")
    if seq.dtype.is_floating_point or seq.dtype.is_complex or seq.dtype == torch.bool:
        raise ValueError(f"seq must be an integer tensor of item ids, got {seq.dtype}")
    if lengths.shape != (seq.shape[0],):
        raise ValueError(f"lengths must have shape [{seq.shape[0]}], got {tuple(lengths.shape)}")
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be an integer tensor, got {lengths.dtype}")


def length_mask(lengths: Tensor, seq_len: int) -> Tensor:
    """``lengths [B]`` -> ``[B, seq_len]`` bool, True at the valid positions ``0 .. length-1``."""
    return torch.arange(seq_len, device=lengths.device)[None, :] < lengths[:, None]


def recency_index(lengths: Tensor, seq_len: int) -> Tensor:
    """``[B, seq_len]`` long: valid position ``i`` of a row -> ``length - 1 - i`` (clicks back
    from its most recent one); the count goes on around the window at padded positions
    (``length - 1 - i + seq_len``), so each row is a permutation and a padding row gets the
    position it has in the left-padded window of ``seq_len`` rows (what the whole-window filters
    read there: :mod:`recsys.nn.frequency`)."""
    i = torch.arange(seq_len, device=lengths.device)[None, :]
    back = lengths[:, None].long() - 1 - i
    return torch.where(back >= 0, back, back + seq_len)


def gather_last(x: Tensor, lengths: Tensor) -> Tensor:
    """The state at the last valid position: ``x [B, L, d]``, ``lengths [B]`` -> ``[B, d]``.

    Rows with ``length == 0`` give zeros (and pass no gradient into ``x``).
    """
    b, _, d = x.shape
    index = (lengths - 1).clamp(min=0).view(b, 1, 1).expand(b, 1, d)
    last = x.gather(1, index).squeeze(1)  # [B, d]
    return last * (lengths > 0).to(x.dtype)[:, None]
