"""Stop a run that diverges, before it writes a checkpoint of broken weights.

A run diverges when its loss or its gradient norm stops being finite, or when its loss climbs
far above where it started (:data:`LOSS_FACTOR` times the first step's loss): a learning rate
many orders of magnitude too large does both within a few steps, and every later number it
reports (validation recall included) describes a broken model.

The check reads only what the trainer already brings to the host: the log window's mean loss
and gradient norm at every log step, and the partial window before every validation. The first
step's loss stays on the device until the first check (one host read per run), so the training
steps themselves never wait for the GPU, with eager launches and under CUDA graphs alike.
Under DDP every rank checks its own losses and the ranks agree before anyone stops.

A diverged run raises :class:`TrainingDiverged` (the CLI prints it as one line and exits with
status 2); the checkpoint and best weights of its last validation before the divergence stay as
they were.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from recsys.config import TrainConfig
from recsys.train import distributed

if TYPE_CHECKING:
    from recsys.run import RunDir

__all__ = ["LOSS_FACTOR", "DivergenceGuard", "TrainingDiverged"]

# a loss this many times its start (at least 1) has diverged: a fresh model's sampled softmax
# already scores about log(negatives + 1), and training only lowers it
LOSS_FACTOR = 10.0


class TrainingDiverged(ValueError):
    """The loss or the gradients of a run diverged; the message says where and what to change.

    A ValueError like the config's errors: a setting (almost always ``train.lr``) is wrong for
    the data, and the CLI reports it as one line, as ``recsys tune`` fails the trial alone."""


class DivergenceGuard:
    """Watches one run's losses (see the module docstring).

    Args:
        train: the run's ``train`` config (its learning rate and clipping go into the advice).
        run: the run directory (the message says whether it keeps a checkpoint).
        device: this rank's device (for the ranks' agreement under DDP).
        start_loss: the first step's loss of the run being resumed (:meth:`state`), so a resumed
            run is held to the same bound as the uninterrupted one; None for a new run.
    """

    def __init__(self, train: TrainConfig, run: RunDir, device: torch.device, start_loss: float | None = None):
        self.train, self.run, self.device = train, run, device
        self.start_loss = start_loss
        self._first: Tensor | None = None  # the first step's loss, on the device until the first check

    def watch(self, loss: Tensor) -> None:
        """Called with every step's 0-d loss; keeps a device copy of the first (no host sync)."""
        if self.start_loss is None and self._first is None:
            self._first = loss.detach().float().clone()

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps for a resume: ``{"start_loss": float}`` once known."""
        start = self._start()
        return {} if start is None else {"start_loss": start}

    def check(self, step: int, loss: float, grad_norm: float) -> None:
        """Raise :class:`TrainingDiverged` when ``loss`` or ``grad_norm`` (host floats: a window's
        means at ``step``; ``grad_norm`` 0 without clipping) show a divergence on any rank."""
        problem = self.problem(loss, grad_norm)
        if distributed.all_true(problem is None, self.device):
            return
        kept = (
            f"{self.run.path} keeps the checkpoint and best weights of its last validation"
            if self.run.has_checkpoint()
            else "no checkpoint had been written yet"
        )
        advice = f"lower train.lr (now {self.train.lr:g})" + (
            "; train.grad_clip = 0 leaves the gradients unclipped" if not self.train.grad_clip else ""
        )
        raise TrainingDiverged(f"training diverged at step {step}: {problem or 'on another rank'}; {advice}; {kept}")

    def problem(self, loss: float, grad_norm: float) -> str | None:
        """What is wrong with a window's mean ``loss`` and ``grad_norm``, or None."""
        if not math.isfinite(loss):
            return f"the loss is {loss}"
        if not math.isfinite(grad_norm):
            return f"the gradient norm is {grad_norm}"
        start = self._start()
        if start is not None and loss > LOSS_FACTOR * max(start, 1.0):
            return f"the loss rose to {loss:.4g}, over {LOSS_FACTOR:g} times its start ({start:.4g})"
        return None

    def _start(self) -> float | None:
        if self.start_loss is None and self._first is not None:
            self.start_loss = float(self._first)  # the one host read of the guard's own
            self._first = None
        return self.start_loss
