"""``train.loss = "bpr"``: Bayesian personalised ranking (Rendle et al., UAI 2009) over the shared
negatives, ``mean_j softplus(s_neg_j - s_target)`` a row: each target should outscore each negative.

It is the example of adding a loss (docs/training.md, "Your own loss"): one module, a subclass of
:class:`~recsys.train.losses.CatalogueLoss` (here of :class:`~recsys.train.losses.softmax.SharedNegatives`,
whose draw it reuses) and one :func:`~recsys.train.losses.register_loss` call, imported by the
package. BPR needs no logQ correction (it compares pairs, not a partition function), so
``train.logq`` does not apply; a negative equal to the row's target is left out of its mean.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from recsys.config import Config
from recsys.train.losses.catalogue import CatalogueLoss, LossRows, register_loss
from recsys.train.losses.functions import LossOutput, masked_mean, negative_logits
from recsys.train.losses.softmax import SharedNegatives


class BPR(SharedNegatives):
    """BPR over the shared negatives; ``log_z`` reports the logsumexp of each row's target and
    negative logits (what the softmax's would be), for the same monitoring."""

    def __init__(self, cfg: Config, item_counts: Tensor, device: torch.device, generator: torch.Generator):
        super().__init__(cfg, item_counts, device, generator)
        self.backend = cfg.model.backend

    def __call__(self, rows: LossRows, negatives: Tensor, hard_uniforms: Tensor) -> LossOutput:
        negatives, _, _ = self.negatives(rows, negatives, hard_uniforms)
        pos = (rows.user * rows.item_emb[rows.targets]).sum(dim=1).float()  # [R]
        neg = negative_logits(rows.user, rows.item_emb[negatives], rows.interests, backend=self.backend)  # [R, S]
        real = negatives[None, :] != rows.targets[:, None]  # [R, S] accidental hits left out
        pairs = F.softplus(neg - pos[:, None]) * real
        per_row = pairs.sum(dim=1) / real.sum(dim=1).clamp_min(1)  # [R]
        log_z = torch.logsumexp(torch.cat([pos[:, None], neg.masked_fill(~real, -math.inf)], dim=1), dim=1)
        row_max = torch.maximum(pos, neg.amax(dim=1)).detach()
        if rows.mask is None:
            return LossOutput(loss=per_row.mean(), log_z=log_z.detach().mean(), max_logit=row_max.max())
        return LossOutput(
            loss=masked_mean(per_row, rows.mask, rows.count),
            log_z=masked_mean(log_z.detach(), rows.mask, rows.count),
            max_logit=row_max.masked_fill(~rows.mask, -math.inf).max(),
        )


def build_bpr(cfg: Config, item_counts: Tensor, device: torch.device, generator: torch.Generator) -> CatalogueLoss:
    return BPR(cfg, item_counts, device, generator)


register_loss("bpr", build_bpr)
