"""Training throughput and the time a run has left, for the trainer's progress lines and summary.

Throughput counts training time only: validations and checkpoints run inside
:meth:`RunMeter.paused`, so a log window that holds a validation reports the speed of its steps,
and the summary's rate (:meth:`RunMeter.average`) is the whole run's, not its last window's.
A sample is one training window; a target is one position that feeds the loss (one per sample
with ``train.predict_at = "last"``, every valid position of the window with ``"all"``).

The time left is estimated from what can end the run, never from the step cap alone (which the
plateau stop usually beats by orders of magnitude): the step at which the plateau stop ends the
run if no validation improves on the best again, the step cap when that comes first or there is
no plateau stop, and the deadline of the ``train.max_minutes`` budget. Before the first
validation a run with a plateau stop has no such step, and the line says nothing about the time
left (unless the budget bounds it).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from recsys.config import TrainConfig
from recsys.train.plan import TrainPlan

__all__ = ["VALID_SHARE", "Rates", "RunMeter"]

# the automatic cadence (train.eval_every = 0) defers a due validation while validations would pass this
# share of the wall time: on a million-item log one can cost as much as thousands of steps
VALID_SHARE = 0.1


@dataclass(frozen=True)
class Rates:
    """Samples and targets trained per second of training time."""

    samples_per_s: float
    targets_per_s: float

    def describe(self) -> str:
        """``"1,234 samples/s"``, with ``", 5,678 targets/s"`` when targets are not samples."""
        text = f"{self.samples_per_s:,.0f} samples/s"
        if round(self.targets_per_s) != round(self.samples_per_s):
            text += f", {self.targets_per_s:,.0f} targets/s"
        return text


class RunMeter:
    """One run's clock, from the step it starts at (0, or the step a resume continues from).

    Args:
        plan: the run's step budget and validation cadence.
        train: its ``train`` config (``patience``).
        start_step: the step this process starts at.
        samples_per_step: training windows per step over all ranks.
        clock: seconds, monotonic (a fake one in tests).
        deadline: the ``clock`` time at which the ``train.max_minutes`` budget of the whole run
            runs out (``inf``: no budget).
    """

    def __init__(
        self,
        plan: TrainPlan,
        train: TrainConfig,
        *,
        start_step: int,
        samples_per_step: int,
        clock: Callable[[], float] = time.perf_counter,
        deadline: float = math.inf,
    ):
        self.plan, self.train, self.start_step, self.samples_per_step, self.clock = (
            plan,
            train,
            start_step,
            samples_per_step,
            clock,
        )
        self.start = self.window_start = clock()
        self.deadline = deadline
        self.paused_s = self.window_paused_s = 0.0  # time spent inside paused(), over the run and the window
        self.last_pause, self.last_pause_end = 0.0, self.start  # the latest pause's length, and when it ended
        self.samples = self.targets = 0.0  # trained over the run
        self._plateau: tuple[tuple[int, int], int] | None = None  # ((last_eval, bad_evals), its plateau stop)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside is not training time (wrap validations and checkpoints in it)."""
        began = self.clock()
        try:
            yield
        finally:
            self.last_pause_end = self.clock()
            self.last_pause = spent = self.last_pause_end - began
            self.paused_s += spent
            self.window_paused_s += spent

    def may_validate(self) -> bool:
        """Whether a validation the plan has due may run now. With the automatic cadence
        (``train.eval_every = 0``) it waits until the training since the latest pause (the last
        validation and checkpoint) took ``(1 - VALID_SHARE) / VALID_SHARE`` times as long as that
        pause, so validation stays under :data:`VALID_SHARE` of the wall time; on a small log it
        never waits. A fixed cadence never waits."""
        if self.train.eval_every:
            return True
        return self.clock() - self.last_pause_end >= (1 - VALID_SHARE) / VALID_SHARE * self.last_pause

    def log(self, steps: int, targets: float | None = None) -> Rates:
        """The rates of a log window of ``steps`` steps that trained ``targets`` targets (over
        all ranks; None: one per sample), and start the next window."""
        now = self.clock()
        samples = steps * self.samples_per_step
        targets = samples if targets is None else targets
        seconds = max(now - self.window_start - self.window_paused_s, 1e-9)
        self.samples += samples
        self.targets += targets
        self.window_start, self.window_paused_s = now, 0.0
        return Rates(samples / seconds, targets / seconds)

    def average(self) -> Rates:
        """The rates over every window logged so far (the run's, for its summary)."""
        seconds = max(self.window_start - self.start - (self.paused_s - self.window_paused_s), 1e-9)
        return Rates(self.samples / seconds, self.targets / seconds)

    def time_left(self, step: int, last_eval: int, bad_evals: int, validated: bool, drops_left: int = 0) -> str:
        """``"~45s left"``-style text for the progress line at ``step`` (``""`` when nothing can
        be said yet); ``last_eval`` and ``bad_evals`` are the latest validation's step and the
        validations since the best; ``validated``: there has been one (see the module docstring);
        ``drops_left``: plateaus that will lower the rate rather than stop (``train.lr_drops``)."""
        now = self.clock()
        elapsed = now - self.start
        steps_per_s = (step - self.start_step) / max(elapsed, 1e-9)
        stop, plateau = self.plan.max_steps, False
        if self.train.patience and validated:
            plateau_stop = self.plateau_stop(last_eval, bad_evals)
            stop, plateau = min(stop, plateau_stop), plateau_stop < stop
        known = not self.train.patience or validated
        seconds = (stop - step) / max(steps_per_s, 1e-9)
        budget = self.deadline - now if self.deadline < math.inf else None
        if budget is not None and (not known or budget < seconds):
            return f"at most {max(budget, 0):,.0f}s left (train.max_minutes)"
        if not known:
            return ""
        if plateau and drops_left:
            return f"~{seconds:,.0f}s to a plateau without a new best (then a lower rate)"
        return f"~{seconds:,.0f}s left" + (" without a new best" if plateau else "")

    def plateau_stop(self, last_eval: int, bad_evals: int) -> int:
        """The step at which the plateau stop ends the run if no validation after ``last_eval``
        improves on the best (``bad_evals`` validations have not so far; never before one epoch,
        :meth:`TrainPlan.plateau_reached`), capped at the last step; computed once per validation."""
        key = (last_eval, bad_evals)
        if self._plateau is None or self._plateau[0] != key:
            step, bad = last_eval, bad_evals
            while step < self.plan.max_steps and not self.plan.plateau_reached(step, bad, self.train.patience):
                last = step
                step += 1
                while step < self.plan.max_steps and not self.plan.validates_at(step, last):
                    step += 1
                bad += 1
            self._plateau = (key, step)
        return self._plateau[1]
