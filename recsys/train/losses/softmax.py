"""``train.loss = "softmax"``: cross-entropy of each target against the catalogue, exact
(:class:`ExactSoftmax`, ``train.full_softmax = true``) or over negatives shared by the batch with
the logQ correction (:class:`SampledSoftmax`). :class:`SharedNegatives` is the draw that the
sampled softmax and other losses over shared negatives (``recsys/train/losses/bpr.py``) share.
"""

from __future__ import annotations

import torch
from torch import Tensor

from recsys.config import Config
from recsys.train.losses.catalogue import CatalogueLoss, LossRows, register_loss
from recsys.train.losses.functions import (
    LossOutput,
    chunked_softmax_loss,
    draw_from,
    interest_proposal,
    make_sampler,
    mixture_log_expected_count,
    sampled_softmax_loss,
)


class ExactSoftmax(CatalogueLoss):
    """Softmax cross-entropy over the whole catalogue, a chunk of items at a time
    (:func:`~recsys.train.losses.functions.chunked_softmax_loss`); ``train.z_loss`` applies."""

    reads_every_row = True

    def __init__(self, cfg: Config, device: torch.device):
        self.z_loss, self.backend, self.device = cfg.train.z_loss, cfg.model.backend, device

    def draw(self) -> tuple[Tensor, Tensor]:
        empty = torch.empty(0, dtype=torch.long, device=self.device)
        return empty, torch.empty(0, device=self.device)

    def __call__(self, rows: LossRows, negatives: Tensor, hard_uniforms: Tensor) -> LossOutput:
        return chunked_softmax_loss(
            rows.user,
            rows.targets,
            rows.item_emb,
            z_loss=self.z_loss,
            interests=rows.interests,
            backend=self.backend,
            mask=rows.mask,
            count=rows.count,
        )


class SharedNegatives(CatalogueLoss):
    """``train.num_negatives`` ids a step shares across its rows: drawn from ``train.sampler``, and
    with ``train.hard_negatives`` a share of them near the batch's interests; :meth:`negatives`
    completes the draw inside the step and gives each id's log expected count (the logQ terms)."""

    def __init__(self, cfg: Config, item_counts: Tensor, device: torch.device, generator: torch.Generator):
        t = cfg.train
        self.device, self.generator = device, generator
        self.sampler = make_sampler(t.sampler, item_counts.shape[0], item_counts=item_counts, alpha=t.sampler_alpha)
        self.num_negatives = t.num_negatives
        self.num_hard = round(t.hard_negatives * t.num_negatives)  # drawn near the interests
        self.num_base = t.num_negatives - self.num_hard  # drawn from the sampler
        self.temperature = t.hard_negative_temperature

    def draw(self) -> tuple[Tensor, Tensor]:
        base = self.sampler.sample(self.num_base, generator=self.generator, device=self.device)
        return base, torch.rand(self.num_hard, generator=self.generator, device=self.device)

    def negatives(self, rows: LossRows, base: Tensor, hard_uniforms: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(negatives [S], log expected count of each target [R], of each negative [S])``: the
        base draw plus the hard draws from :func:`interest_proposal` of the rows' proposal
        interests; logQ is the exact expected count under that mixture."""
        probs = None
        negatives = base
        if self.num_hard:
            probs = interest_proposal(rows.proposal_interests, rows.item_emb, self.temperature)  # [N]
            negatives = torch.cat([base, draw_from(probs, hard_uniforms)])

        def log_q(ids: Tensor) -> Tensor:
            if probs is None:
                return self.sampler.log_expected_count(ids, self.num_negatives)
            return mixture_log_expected_count(ids, self.sampler, self.num_base, probs, self.num_hard)

        # logQ is a function of catalogue ids: the base draw's as drawn (a form that gathers rows
        # renumbers the step's ids), the hard draws' as rows of the whole table they were drawn from
        q_targets, q_base = rows.catalogue_ids if rows.catalogue_ids is not None else (rows.targets, base)
        q_negatives = torch.cat([q_base, negatives[self.num_base :]]) if self.num_hard else q_base
        return negatives, log_q(q_targets), log_q(q_negatives)


class SampledSoftmax(SharedNegatives):
    """Softmax cross-entropy over each row's target and the shared negatives
    (:func:`~recsys.train.losses.functions.sampled_softmax_loss`), with ``train.logq``,
    ``train.remove_accidental_hits`` and ``train.z_loss``."""

    def __init__(self, cfg: Config, item_counts: Tensor, device: torch.device, generator: torch.Generator):
        super().__init__(cfg, item_counts, device, generator)
        t = cfg.train
        self.logq, self.remove_hits, self.z_loss, self.backend = (
            t.logq,
            t.remove_accidental_hits,
            t.z_loss,
            cfg.model.backend,
        )

    def __call__(self, rows: LossRows, negatives: Tensor, hard_uniforms: Tensor) -> LossOutput:
        negatives, log_q_targets, log_q_negatives = self.negatives(rows, negatives, hard_uniforms)
        return sampled_softmax_loss(
            rows.user,
            rows.targets,
            rows.item_emb,
            negatives,
            log_q_target=log_q_targets if self.logq else None,
            log_q_neg=log_q_negatives if self.logq else None,
            remove_accidental_hits=self.remove_hits,
            z_loss=self.z_loss,
            interests=rows.interests,
            backend=self.backend,
            mask=rows.mask,
            count=rows.count,
        )


def build_softmax(cfg: Config, item_counts: Tensor, device: torch.device, generator: torch.Generator) -> CatalogueLoss:
    """The exact softmax where ``train.full_softmax`` (resolved) says so, else the sampled one."""
    if cfg.train.full_softmax is True:
        return ExactSoftmax(cfg, device)
    return SampledSoftmax(cfg, item_counts, device, generator)


register_loss("softmax", build_softmax)
