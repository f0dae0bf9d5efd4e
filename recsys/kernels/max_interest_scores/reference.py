"""PyTorch twin of the max-over-interests score kernels: the oracle in tests and the fallback
where Triton can't run (or where its products would spill)."""

from __future__ import annotations

import torch
from torch import Tensor

from recsys.kernels.common.reference import at_least_fp32

__all__ = ["max_interest_scores_ref"]


def max_interest_scores_ref(interests: Tensor, items: Tensor) -> Tensor:
    """``interests [B, K, d]``, ``items [S, d]`` (one dtype) -> ``[B, S]`` float32 (at least)
    ``max_k <interests[b, k], items[s]>``, through the ``[B, K, S]`` product; ``amax`` shares the
    gradient of a tie evenly between the tied interests."""
    scores = torch.einsum("bkd,sd->bks", interests, items).amax(dim=1)
    return at_least_fp32(scores)
