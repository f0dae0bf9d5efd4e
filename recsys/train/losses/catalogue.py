"""The loss interface of a training step: :class:`CatalogueLoss`, the :class:`LossRows` it reads,
and the registry of losses (``train.loss``).

A training step computes one read-out user vector per target row and hands the rows to its loss;
the loss scores them against the catalogue (all of it, or negatives it draws) and returns a
:class:`~recsys.train.losses.functions.LossOutput`. Random draws happen outside the step
(:meth:`CatalogueLoss.draw`), so a CUDA graph of the step replays with fresh ones. Adding a loss is
one module: a subclass and a :func:`register_loss` call (``recsys/train/losses/bpr.py`` is one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from recsys.config import Config
from recsys.train.losses.functions import LossOutput


@dataclass(frozen=True)
class LossRows:
    """What a step hands its loss: ``R`` target rows (``R = B``, or ``B·L`` dense, times
    ``train.predict_next``).

    Attributes:
        user: ``[R, d]`` read-out user vectors (:func:`~recsys.train.losses.functions.readout`).
        targets: ``[R]`` long item ids (anything where ``mask`` is False).
        item_emb: ``[N, d]`` the item table, or a row-sparse step's gathered rows (ids renumbered).
        interests: ``[R / m, K, d]`` the interests that score negatives by their best match
            (``train.negative_readout = "max"``, K > 1), else None (score by ``user``).
        proposal_interests: ``[B, K, d]`` each sample's interests (the hard-negative proposal).
        mask: ``[R]`` bool, False rows left out (padding, missing following clicks), or None.
        count: 0-d, what masked means divide by under DDP (:func:`~recsys.train.losses.functions.masked_mean`).
        catalogue_ids: ``(targets, negatives [S_base])`` as catalogue ids, before a form of the
            item table that gathers the step's rows renumbered them (what a sampler's
            probabilities are a function of); None: ``targets`` and the negatives are catalogue ids.
    """

    user: Tensor
    targets: Tensor
    item_emb: Tensor
    interests: Tensor | None
    proposal_interests: Tensor
    mask: Tensor | None
    count: Tensor | None
    catalogue_ids: tuple[Tensor, Tensor] | None = None


class CatalogueLoss:
    """A training loss over the catalogue.

    Attributes:
        reads_every_row: it scores every item each step (the exact softmax), so the row-sparse item
            table cannot apply.
    """

    reads_every_row = False

    def draw(self) -> tuple[Tensor, Tensor]:
        """This step's random inputs, drawn outside the step: ``([S] negative ids, [H] uniforms for
        the hard draws)``, empty where the loss draws none. Their shapes are the same every step."""
        raise NotImplementedError

    def __call__(self, rows: LossRows, negatives: Tensor, hard_uniforms: Tensor) -> LossOutput:
        """The loss of ``rows`` given :meth:`draw`'s tensors (ids renumbered by a row-sparse step)."""
        raise NotImplementedError


# name -> build(cfg resolved, item_counts [num_items], device, generator)
LossBuilder = Callable[[Config, Tensor, torch.device, torch.Generator], CatalogueLoss]
_LOSSES: dict[str, LossBuilder] = {}


def register_loss(name: str, build: LossBuilder) -> None:
    """Make ``train.loss = name`` build its loss with ``build``."""
    if name in _LOSSES:
        raise ValueError(f"loss {name!r} registered twice")
    _LOSSES[name] = build


def loss_names() -> list[str]:
    """Every registered ``train.loss``, sorted."""
    return sorted(_LOSSES)


def make_loss(cfg: Config, item_counts: Tensor, device: torch.device, generator: torch.Generator) -> CatalogueLoss:
    """The loss ``cfg.train.loss`` names, for the resolved ``cfg``."""
    if cfg.train.loss not in _LOSSES:
        raise ValueError(f"train.loss: unknown loss {cfg.train.loss!r}; known: {', '.join(loss_names())}")
    return _LOSSES[cfg.train.loss](cfg, item_counts, device, generator)
