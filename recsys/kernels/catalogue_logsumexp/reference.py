"""PyTorch twin of the catalogue logsumexp kernels: the oracle in tests and the fallback where
Triton can't run. It holds the ``[R, N]`` logits; the training loss's memory-bounded torch path
is :func:`recsys.train.losses.chunked_softmax_loss`'s chunk loop."""

from __future__ import annotations

import torch
from torch import Tensor

from recsys.kernels.common.reference import at_least_fp32

__all__ = ["catalogue_logsumexp_ref"]


def catalogue_logsumexp_ref(user: Tensor, items: Tensor) -> tuple[Tensor, Tensor]:
    """``user [R, d]``, ``items [N, d]`` (one dtype) -> ``(lse [R], row_max [R])``, float32 at
    least: ``logsumexp_j`` and ``max_j`` of ``<user[r], items[j]>`` (``-inf`` when ``N = 0``);
    ``row_max`` carries no gradient."""
    logits = at_least_fp32(user @ items.T)  # [R, N]
    if items.shape[0] == 0:  # amax has no identity to return
        return torch.logsumexp(logits, dim=1), logits.new_full((user.shape[0],), -torch.inf)
    return torch.logsumexp(logits, dim=1), logits.detach().amax(dim=1)
