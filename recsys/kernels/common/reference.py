"""PyTorch helpers the ops' twins share.

The twins compute in the dtype of their inputs (matmuls accumulate in fp32 as PyTorch does),
softmaxes in at least fp32, so comparing a twin run in fp16/bf16 against the same twin run in
fp64 measures "PyTorch's own error" at that precision.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["at_least_fp32", "length_softmax"]


def at_least_fp32(x: Tensor) -> Tensor:
    """``x`` in fp32, or unchanged when it is already fp32 or wider (fp64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def length_softmax(scores: Tensor, lengths: Tensor) -> Tensor:
    """Softmax over the sequence axis with padding masked: ``scores [B, L, K]`` -> ``A [B, L, K]``.

    Positions ``>= lengths[b]`` get weight 0; a row of length 0 is all zeros (with zero
    gradients), never NaN. Computed in fp32 (fp64 stays fp64).
    """
    positions = torch.arange(scores.shape[1], device=scores.device)
    valid = positions[None, :, None] < lengths.to(scores.device)[:, None, None]
    s = at_least_fp32(scores).masked_fill(~valid, float("-inf")).masked_fill(~valid.any(dim=1, keepdim=True), 0.0)
    return torch.softmax(s, dim=1).masked_fill(~valid, 0.0)
