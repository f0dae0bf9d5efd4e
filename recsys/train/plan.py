"""The step budget and the validation cadence of one run, from its resolved config and the
:class:`~recsys.run.settings.Facts` of its data.

An *epoch* is as many samples as there are training targets (:meth:`~recsys.run.settings.Facts.epoch_steps`),
at ``train.batch_size`` samples a step on each process.

- ``train.max_steps = 0`` (the default): ``train.max_epochs`` epochs; the plateau stop ends
  almost every run long before.
- ``train.eval_every = 0`` (the default): validate on a cadence that grows with the run: every
  ``first`` steps at the start, where ``first`` is one pass over the training users (clamped to
  ``[MIN_FIRST, MAX_FIRST]``), then every ``EVAL_GROWTH`` of the steps taken so far once that is
  longer. ``train.patience`` validations without improvement then cover a fixed share of the run
  (about 60% of the steps to the best validation with patience 5) on every dataset, and the
  number of validations grows with the logarithm of the run's length.

The plan's line opens with the batch and the learning rate, and where the batch is not the base
value (:data:`~recsys.run.settings.BASE_BATCH`) but what the rule of
:func:`~recsys.run.settings.scaled_batch` gives, it says so.

Both are modes of the plan rather than values the resolver fills in (:mod:`recsys.run.settings`):
a resumed run may extend ``train.max_epochs``, and a cadence that grows is not one number. The weight
decay is the resolved ``train.weight_decay`` (its automatic value, a fixed shrinkage per epoch, is
decided with the other automatic values). A run that fixes ``max_steps`` or ``eval_every`` gets
exactly those values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from recsys.config import Config, TrainConfig, require_resolved
from recsys.run.settings import BASE_BATCH, Facts, min_target, scaled_batch

EVAL_GROWTH = 0.1  # automatic cadence: validate after another 10% of the steps taken so far
MIN_FIRST = 250  # automatic cadence: the first validations are at least this many steps apart ...
MAX_FIRST = 2500  # ... and at most this many
# the plateau stop waits for this many samples (5,000 steps at 128) where that is more than an epoch: on
# MovieLens 100K's 94 validation users a curve often pauses for some 1,500 steps after 2-3 epochs and then
# rises again; stopped there, comirec_sa K = 1 tested 0.2755 against 0.3100 trained on (docs/defaults.md,
# "The earliest plateau stop")
MIN_STOP_SAMPLES = 640_000
MIN_STOP_EPOCHS = 10  # ... or for at most this many epochs, on a log so small that they are fewer samples


@dataclass(frozen=True)
class TrainPlan:
    """The step budget, the validation cadence and the weight decay of one run.

    Attributes:
        max_steps: the last step.
        first: steps between validations at the start.
        growth: after ``first / growth`` steps, validate every ``growth * step`` steps (0: never
            grows, a fixed cadence of ``first``).
        epoch_steps: steps of one epoch (as many samples as training targets).
        weight_decay: the optimiser's weight decay (``train.weight_decay``).
        targets: training targets an epoch (:meth:`~recsys.run.settings.Facts.targets`).
        world_size: processes, each drawing ``train.batch_size`` samples a step.
        earliest_stop: the first step the plateau stop may end the run at (:meth:`plateau_reached`):
            one epoch and :data:`MIN_STOP_SAMPLES`, at most :data:`MIN_STOP_EPOCHS` epochs (0: one epoch).
    """

    max_steps: int
    first: int
    growth: float
    epoch_steps: int
    weight_decay: float
    targets: int
    world_size: int
    earliest_stop: int = 0

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
        the run has reached :attr:`earliest_stop` (or its last step): a curve cannot have flattened
        before the model has seen the data once, and on a small validation set an early pause or
        noisy peak would otherwise end a still-rising run."""
        return 0 < patience <= bad_evals and step >= self.stop_floor

    @property
    def stop_floor(self) -> int:
        """The step from which the plateau stop may end the run."""
        return min(max(self.epoch_steps, self.earliest_stop), self.max_steps)

    def _floor_reason(self) -> str:
        if self.stop_floor < max(self.epoch_steps, self.earliest_stop):
            return "the last step"
        if self.stop_floor == self.epoch_steps:
            return "one epoch"
        return (
            f"{MIN_STOP_EPOCHS} epochs"
            if self.stop_floor == MIN_STOP_EPOCHS * self.epoch_steps
            else f"{MIN_STOP_SAMPLES:,} samples"
        )

    def batch_clause(self, train: TrainConfig) -> str:
        """The batch and the learning rate, and why where the rule scaled the batch (a value that is
        the rule's, set or automatic): ``"batch 4,096 (for 73.6M targets), lr 0.001"``."""
        each, processes = train.batch_size, self.world_size
        batch = f"batch {each:,}" if processes == 1 else f"batch {processes} × {each:,}"
        if each != BASE_BATCH and each == scaled_batch(self.targets, processes):
            batch += f" (for {_count(self.targets)} targets)"
        return f"{batch}, lr {train.lr:.3g}"

    def describe(self, train: TrainConfig) -> str:
        """One line for the run's log, for the resolved ``train`` the plan was made from."""
        require_resolved(Config(train=train), "TrainPlan.describe", section="train.")
        budget = f"{self.batch_clause(train)}; up to {self.max_steps:,} steps"
        if train.max_steps == 0:
            budget += f" ({train.max_epochs:g} epochs of {self.epoch_steps:,} steps)"
        cadence = (
            f"validation every {self.first:,} steps, then every {self.growth:.0%} of the steps so far"
            if self.growth
            else f"validation every {self.first:,} steps"
        )
        stop = (
            f"early stop after {train.patience} validations without improvement, not before step "
            f"{self.stop_floor:,} ({self._floor_reason()})"
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


def plan_training(train: TrainConfig, facts: Facts) -> TrainPlan:
    """The :class:`TrainPlan` for the resolved ``train`` on ``facts``' training sequences, with
    ``facts.world_size`` processes each drawing ``train.batch_size`` samples a step."""
    require_resolved(Config(train=train), "plan_training", section="train.")
    epoch_steps = facts.epoch_steps(train)
    max_steps = train.max_steps or max(1, math.ceil(train.max_epochs * epoch_steps))
    targets = facts.targets(min_target(train))
    earliest = min(math.ceil(MIN_STOP_SAMPLES / facts.samples_per_step(train)), MIN_STOP_EPOCHS * epoch_steps)
    common = (epoch_steps, train.weight_decay, targets, facts.world_size, earliest)
    if train.eval_every:
        return TrainPlan(max_steps, train.eval_every, 0.0, *common)
    users = facts.users(min_target(train))
    first = min(MAX_FIRST, max(MIN_FIRST, math.ceil(users / facts.samples_per_step(train))))
    return TrainPlan(max_steps, first, EVAL_GROWTH, *common)


def _count(n: int) -> str:
    """``n`` in a few digits: 73,615,744 -> ``"73.6M"``, 4,200 -> ``"4,200"``."""
    for size, unit in ((1e9, "B"), (1e6, "M")):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:,}"
