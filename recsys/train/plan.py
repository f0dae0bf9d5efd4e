"""What the config leaves open, derived from the data: the step budget, the validation cadence
and the weight decay.

An *epoch* here is as many samples as there are training targets (every click of a training user
with at least ``train.min_target`` clicks before it; with ``train.targets = "all"``, every click
with one before it), at ``train.batch_size`` samples a step. For last-position training a sample is
one history and an epoch one pass over the targets. For dense training a sample is a window that
carries up to ``data.max_len`` targets, so an epoch covers each target many times over; counting
the epoch in targets instead (a dense epoch some 15× fewer steps on MovieLens 100K) made the
budget end dense runs still improving and the automatic decay 15× stronger a step (dense comirec_sa
there lost a fifth of its recall to it, 0.2393 against 0.2968: docs/results.md, "Dense training"). Counted in samples,
the step budget and the decay a step do not depend on the objective.

- ``train.max_steps = 0`` (the default): ``train.max_epochs`` epochs; the plateau stop ends
  almost every run long before.
- ``train.eval_every = 0`` (the default): validate on a cadence that grows with the run: every
  ``first`` steps at the start, where ``first`` is one pass over the training users (clamped to
  ``[MIN_FIRST, MAX_FIRST]``), then every ``EVAL_GROWTH`` of the steps taken so far once that is
  longer. ``train.patience`` validations without improvement then cover a fixed share of the run
  (about 60% of the steps to the best validation with patience 5) on every dataset, and the
  number of validations grows with the logarithm of the run's length.
- ``train.weight_decay = -1`` (the default) with AdamW: the decoupled decay that shrinks the
  weights by a fixed factor per epoch, the model spec's ``epoch_decay`` (``exp(-epoch_decay)`` a
  pass, :func:`recsys.models.spec.epoch_decay`), i.e.
  ``weight_decay = epoch_decay / (lr * epoch_steps)``. The data term of the loss is a mean over the
  samples while a prior's weight should fall as ``1 / samples``; a constant per-step decay
  regularises a large dataset as much as a small one over each step, and so far more over its
  longer run. On taobao the best constant was 0.05, on amazon-beauty 0.2 to 0.5 (four times more
  steps per epoch on taobao): both are about 0.15 a pass (docs/results.md, "Weight decay per
  epoch"). With ``optimizer = "adam"`` the automatic decay is 0 (plain Adam).

A run that fixes ``max_steps``, ``eval_every`` or ``weight_decay`` gets exactly those values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from recsys.config import Config, TrainConfig
from recsys.models.spec import epoch_decay

EVAL_GROWTH = 0.1  # automatic cadence: validate after another 10% of the steps taken so far
MIN_FIRST = 250  # automatic cadence: the first validations are at least this many steps apart ...
MAX_FIRST = 2500  # ... and at most this many


@dataclass(frozen=True)
class TrainPlan:
    """The step budget, the validation cadence and the weight decay of one run.

    Attributes:
        max_steps: the last step.
        first: steps between validations at the start.
        growth: after ``first / growth`` steps, validate every ``growth * step`` steps (0: never
            grows, a fixed cadence of ``first``).
        epoch_steps: steps of one epoch (as many samples as training targets); the plateau stop
            does not end a run before it (:meth:`plateau_reached`).
        weight_decay: the optimiser's weight decay.
    """

    max_steps: int
    first: int
    growth: float
    epoch_steps: int
    weight_decay: float

    def validates_at(self, step: int, last: int) -> bool:
        """True when ``step`` is due for a validation, the previous one having been at ``last``
        (0 before the first); the last step always validates."""
        if step >= self.max_steps:
            return True
        if self.growth == 0:
            return step % self.first == 0
        return step - last >= max(self.first, int(self.growth * last))

    def plateau_reached(self, step: int, bad_evals: int, patience: int) -> bool:
        """True when ``patience`` (> 0) validations in a row have not improved on the best and
        the run has taken one epoch (at least one pass over its training targets): a curve cannot have
        flattened before the model has seen the data once (an early noisy peak would otherwise
        end a still-rising run)."""
        return 0 < patience <= bad_evals and step >= min(self.epoch_steps, self.max_steps)

    def describe(self, train: TrainConfig) -> str:
        """One line for the run's log."""
        budget = f"up to {self.max_steps:,} steps"
        if train.max_steps == 0:
            budget += f" ({train.max_epochs:g} epochs of {self.epoch_steps:,} steps)"
        cadence = (
            f"validation every {self.first:,} steps, then every {self.growth:.0%} of the steps so far"
            if self.growth
            else f"validation every {self.first:,} steps"
        )
        stop = (
            f"early stop after {train.patience} validations without improvement, not before step "
            f"{min(self.epoch_steps, self.max_steps):,} (one epoch)"
            if train.patience
            else "no early stop"
        )
        if train.patience and train.lr_drops:
            back = f"going back to the best weights at lr × {train.lr_drop_factor:g}"
            stop += f", the first {train.lr_drops} plateau(s) {back}"
        decay = f"weight decay {self.weight_decay:.3g}"
        scored = (
            f"validating the weights averaged over about {1 / (1 - train.ema_decay):,.0f} steps "
            f"(train.ema_decay {train.ema_decay:g})"
            if train.ema_decay
            else "validating the last weights"
        )
        return f"plan: {budget}; {cadence}; {stop}; {decay}; {scored}"


def shared_negatives(train: TrainConfig, world_size: int = 1) -> int:
    """Sampled negatives shared by a batch: ``train.num_negatives``, where 0 means 10 per row of
    the global batch (``train.batch_size`` × ``world_size`` processes, which share the negatives),
    so N processes draw what one process draws at the same global batch."""
    return train.num_negatives or 10 * train.batch_size * world_size


def fused_exact_softmax(cfg: Config, device: torch.device) -> bool:
    """Whether a run's exact softmax would run on its fused kernel
    (:func:`recsys.kernels.catalogue_logsumexp`: CUDA under the bf16 autocast of ``train.amp``,
    kernels not forced to their twins), where it costs about what sampling does; what the
    automatic ``train.full_softmax`` resolves with (:func:`recsys.models.resolve`)."""
    return device.type == "cuda" and cfg.train.amp and cfg.model.backend != "torch"


def training_targets(lengths: np.ndarray, min_target: int) -> int:
    """Samples in one pass over training sequences of ``lengths [R]`` clicks: each click with at
    least ``min_target`` clicks before it is a target."""
    return int(np.maximum(np.asarray(lengths) - min_target, 0).sum())


def automatic_weight_decay(train: TrainConfig, model: str, epoch_steps: int) -> float:
    """AdamW's decay for a fixed shrinkage per epoch (module docstring); 0 for plain Adam."""
    if train.optimizer != "adamw":
        return 0.0
    return epoch_decay(model) / (train.lr * epoch_steps)


def plan_training(train: TrainConfig, model: str, train_lengths: np.ndarray, world_size: int = 1) -> TrainPlan:
    """The :class:`TrainPlan` for ``train`` and the model named ``model`` on training sequences
    of ``train_lengths [R]`` clicks (:attr:`~recsys.data.split.Split.train_lengths`), with
    ``world_size`` processes each drawing ``train.batch_size`` samples a step (an epoch: as many
    samples as targets, module docstring)."""
    samples_per_step = train.batch_size * world_size
    min_target = 1 if train.targets == "all" else train.min_target
    targets = training_targets(train_lengths, min_target)
    users = int((np.asarray(train_lengths) > min_target).sum())
    epoch_steps = max(1, math.ceil(targets / samples_per_step))
    max_steps = train.max_steps or max(1, math.ceil(train.max_epochs * epoch_steps))
    decay = train.weight_decay if train.weight_decay >= 0 else automatic_weight_decay(train, model, epoch_steps)
    if train.eval_every:
        return TrainPlan(max_steps, train.eval_every, 0.0, epoch_steps, decay)
    first = min(MAX_FIRST, max(MIN_FIRST, math.ceil(users / samples_per_step)))
    return TrainPlan(max_steps, first, EVAL_GROWTH, epoch_steps, decay)
