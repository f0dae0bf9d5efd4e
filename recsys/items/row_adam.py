"""Adam, row by row: the moments, step counts and weight average of a set of item rows, the
update of the rows a step touched, and the closed-form catch-up of the rows it did not.

The forms that update their rows themselves (:mod:`recsys.items.row_sparse`,
:mod:`recsys.items.sharded`) keep one :class:`RowAdam` each, over the rows they own: all of them
(row-sparse) or one rank's share (sharded). :class:`RowAdam` holds no rows, only their optimiser
state, addressed by a row's position in that state (its *slot*; row-sparse: the item id): the form
reads the rows it stores, :meth:`RowAdam.caught_up` brings them and their state to the current
step, :meth:`RowAdam.step` updates them, and the form writes them back.

**Rows a step does not touch.** A dense AdamW step still (a) shrinks such a row by the decoupled
decay, (b) moves it by its decaying momentum and decays its moments, and (c) folds it into the
weight average. All three are geometric in the number of steps, so they are caught up in closed
form whenever the row is next read or the whole table is, from a per-row count of the steps it is
up to date with (:meth:`RowAdam.caught_up`, :func:`average_catch_up`). Lazy Adam (TensorFlow
Addons' ``LazyAdam``, FBGEMM's row-wise optimisers) drops (b): a row rarely touched then moves
about a tenth as far as under dense Adam, whose momentum carries each gradient ``1 / (1 - beta1)``
steps, and on taobao that cost 30% of test recall. The catch-up is exact for the decay, the
moments and the average; the momentum's move holds Adam's bias corrections at the row's last write
and neglects ``eps`` beside ``sqrt(v̂)`` (docs/results.md, "Training at a million items", measures
its recall against the dense path).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from recsys.items.table import RowUpdates

__all__ = ["RowAdam", "average_catch_up"]


def _geometric(x: float, kf: Tensor, beta: float, beta_k: Tensor) -> Tensor:
    """``sum_{i=1..k} beta^(k-i) x^i`` for ``kf [R]`` float64 (``beta_k = beta^k``)."""
    if abs(beta - x) > 1e-9:
        return x * (beta_k - torch.pow(x, kf)) / (beta - x)
    return kf * torch.pow(beta, kf - 1) * x


def average_catch_up(done: Tensor, k: Tensor, beta: float, shrink: float, ratio: float) -> tuple[Tensor, ...]:
    """The coefficients ``(a, b, c)`` that bring a row's weight average ``k`` updates forward
    while the row moves as an untouched row does: ``avg' = a·avg + b·w + c·D``.

    The bias-corrected average after ``j`` updates is ``S_j / Z_j`` with ``S_j = beta·S_{j-1} + w_j``
    and ``Z_j = (1 - beta^j) / (1 - beta)`` (:class:`recsys.train.averaging.WeightAverage`). An
    untouched row moves as ``w_i = shrink^i·(w - D) + ratio^i·D`` (:meth:`RowAdam.caught_up`),
    so ``S_{j+k} = beta^k·S_j + (w - D)·G(shrink) + D·G(ratio)`` with the geometric sums
    ``G(x) = sum_{i=1..k} beta^(k-i) x^i``.

    Args:
        done: ``[R]`` long, updates the average has folded in so far (``j``).
        k: ``[R]`` long, updates to catch up.
        beta: the average's decay (``train.ema_decay``).
        shrink: ``1 - lr·weight_decay``, the decay's factor a step (1: none).
        ratio: the momentum's factor a step, ``beta1 / sqrt(beta2)``.

    Returns ``a, b, c`` ``[R]`` float64 (``1, 0, 0`` where ``k == 0``).
    """
    j, kf = done.double(), k.double()
    beta_k = torch.pow(beta, kf)
    g_shrink, g_ratio = _geometric(shrink, kf, beta, beta_k), _geometric(ratio, kf, beta, beta_k)
    z_then = (1 - torch.pow(beta, j)) / (1 - beta)
    z_now = ((1 - torch.pow(beta, j + kf)) / (1 - beta)).clamp_min(1e-300)  # 0 only where j = k = 0
    moved = k > 0
    a = torch.where(moved, beta_k * z_then / z_now, torch.ones_like(kf))
    b = torch.where(moved, g_shrink / z_now, torch.zeros_like(kf))
    c = torch.where(moved, (g_ratio - g_shrink) / z_now, torch.zeros_like(kf))
    return a, b, c


Caught = tuple[Tensor, Tensor, Tensor, Tensor | None]  # rows, exp_avg, exp_avg_sq, average: [R, d] each


class RowAdam:
    """Adam's two moments, each row's step count and the weight average of ``S`` rows, and the
    step and the catch-up that update them (module docstring).

    Args:
        rows: ``[S, d]`` the rows as they start (the average starts from them; not kept).
        updates: Adam's settings, the decay (decoupled, or L2 on the touched rows: untouched rows
            then keep their values) and the average's decay.
    """

    def __init__(self, rows: Tensor, updates: RowUpdates):
        if not 0.0 <= updates.ema_decay < 1.0:
            raise ValueError(f"train.ema_decay: must be in [0, 1), got {updates.ema_decay!r}")
        self.lr, (self.beta1, self.beta2), self.eps = updates.lr, updates.betas, updates.eps
        self.weight_decay, self.decoupled, self.ema_decay = updates.weight_decay, updates.decoupled, updates.ema_decay
        device = rows.device
        self.exp_avg = torch.zeros_like(rows)  # [S, d] Adam's first moment, per row
        self.exp_avg_sq = torch.zeros_like(rows)  # [S, d] its second moment
        self.steps = torch.zeros((), dtype=torch.long, device=device)  # optimiser steps taken
        self.current = torch.zeros(
            rows.shape[0], dtype=torch.long, device=device
        )  # [S] steps each row is up to date with
        self.average = rows.detach().clone() if self.ema_decay else None  # [S, d] bias-corrected average
        self.average_start = torch.zeros((), dtype=torch.long, device=device)  # the step the average (re)started at

    @property
    def shrink(self) -> float:
        """The decoupled decay's factor a step, ``1 - lr·weight_decay`` (1 without it)."""
        return 1.0 - self.lr * self.weight_decay if self.decoupled else 1.0

    @property
    def ratio(self) -> float:
        """How much an untouched row's Adam move shrinks a step: ``beta1 / sqrt(beta2)``."""
        return self.beta1 / math.sqrt(self.beta2)

    @torch.no_grad()
    def caught_up(self, rows: Tensor, slots: Tensor) -> Caught:
        """``rows [R, d]`` as stored, at ``slots [R]`` -> the rows, Adam moments and averages
        (``[R, d]`` each; the average None without one) as of the current step: what the steps
        since they were last written did to them as rows without a gradient.

        Such a step multiplies the moments by ``beta1`` and ``beta2``, shrinks the row by the
        decay and moves it by ``lr·q·ratio^i`` on its ``i``-th step, where ``q = m̂ / (sqrt(v̂) + eps)``
        at the row's last write and ``ratio = beta1 / sqrt(beta2)``: over ``k`` steps
        ``w_k = shrink^k·w - lr·q·ratio·(shrink^k - ratio^k) / (shrink - ratio)``. The bias
        corrections are held at the last write's (they change little over the momentum's few
        dozen steps once a run is past its first thousand), and ``eps`` at ``sqrt(v̂)``'s side.
        """
        written = self.current[slots]  # [R] the step each row was last brought to
        k = self.steps - written
        kf, t = k.double(), written.double()
        exp_avg, exp_avg_sq = self.exp_avg[slots], self.exp_avg_sq[slots]
        dtype = rows.dtype
        bias1 = (1 - torch.pow(self.beta1, t)).clamp_min(1e-30)[:, None].to(dtype)
        bias2 = (1 - torch.pow(self.beta2, t)).clamp_min(1e-30)[:, None].to(dtype)
        q = (exp_avg / bias1) / ((exp_avg_sq / bias2).sqrt() + self.eps)  # [R, d]
        shrink, ratio = self.shrink, self.ratio
        shrink_k, ratio_k = torch.pow(shrink, kf), torch.pow(ratio, kf)
        tail = (ratio * (shrink_k - ratio_k) / (shrink - ratio))[:, None].to(dtype)
        moved = rows * shrink_k[:, None].to(dtype) - self.lr * q * tail
        exp_avg = exp_avg * torch.pow(self.beta1, kf)[:, None].to(dtype)
        exp_avg_sq = exp_avg_sq * torch.pow(self.beta2, kf)[:, None].to(dtype)
        if self.average is None:
            return moved, exp_avg, exp_avg_sq, None
        a, b, c = average_catch_up(written - self.average_start, k, self.ema_decay, shrink, ratio)
        offset = self.lr * q * (ratio / (shrink - ratio))  # D of average_catch_up
        average = (
            self.average[slots] * a[:, None].to(dtype) + rows * b[:, None].to(dtype) + offset * c[:, None].to(dtype)
        )
        return moved, exp_avg, exp_avg_sq, average

    @torch.no_grad()
    def step(self, slots: Tensor, caught: Caught, grad: Tensor) -> Tensor:
        """Adam (with the decoupled decay, or L2) on the rows at ``slots [R]``, from ``caught``
        (:meth:`caught_up`, updated in place) with ``grad [R, d]``, then the weight average; the
        same arithmetic as ``torch.optim.AdamW`` for a row with a gradient. Stores the moments and
        averages, counts the step and returns the rows ``[R, d]``, which the caller stores. Slots
        may repeat only with equal ``caught`` and ``grad``. Capturable: the step count lives on
        the device."""
        rows, exp_avg, exp_avg_sq, average = caught
        if self.weight_decay and not self.decoupled:
            grad = grad + self.weight_decay * rows
        exp_avg.lerp_(grad, 1 - self.beta1)
        exp_avg_sq.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        step = (self.steps + 1).double()
        if self.weight_decay and self.decoupled:
            rows.mul_(self.shrink)
        bias1 = 1 - torch.pow(self.beta1, step)
        bias2_sqrt = torch.sqrt(1 - torch.pow(self.beta2, step))
        denom = (exp_avg_sq.sqrt() / bias2_sqrt.to(rows.dtype)).add_(self.eps)
        rows.addcdiv_(exp_avg, denom * (bias1 / self.lr).to(rows.dtype), value=-1.0)
        self.exp_avg.index_copy_(0, slots, exp_avg)
        self.exp_avg_sq.index_copy_(0, slots, exp_avg_sq)
        if self.average is not None and average is not None:
            folded = (step - self.average_start.double()).clamp_min(1)  # updates of the average, this one included
            share = ((1 - self.ema_decay) / (1 - torch.pow(self.ema_decay, folded))).to(rows.dtype)
            self.average.index_copy_(0, slots, average.add_((rows - average) * share))
        self.steps += 1
        self.current.index_put_((slots,), self.steps)
        return rows

    @torch.no_grad()
    def sync(self, rows: Tensor, chunk: int) -> None:
        """Bring ``rows [R, d]`` (the stored rows of slots ``0..R-1``, written in place), their
        moments and averages up to the current step, ``chunk`` rows at a time."""
        for start in range(0, rows.shape[0], chunk):
            slots = torch.arange(start, min(start + chunk, rows.shape[0]), device=rows.device)
            moved, exp_avg, exp_avg_sq, average = self.caught_up(rows[start : start + len(slots)], slots)
            rows[start : start + len(slots)] = moved
            self.exp_avg[start : start + len(slots)] = exp_avg
            self.exp_avg_sq[start : start + len(slots)] = exp_avg_sq
            if self.average is not None and average is not None:
                self.average[start : start + len(slots)] = average
        self.current.copy_(self.steps.expand_as(self.current))

    @torch.no_grad()
    def reset_average(self, rows: Tensor) -> None:
        """Average afresh from ``rows [R, d]`` (slots ``0..R-1``, caught up) from the current step."""
        if self.average is not None:
            self.average[: rows.shape[0]] = rows
        self.average_start.copy_(self.steps)

    def check_state(self, state: dict[str, Any], name: str, rows: int, form: str) -> None:
        """Refuse a resume state (:func:`state_of`'s) that is not for ``rows`` rows as wide as these
        with an average where this keeps one (``form``: the table's, in the messages)."""
        if not state:
            raise ValueError(
                f"checkpoint: it holds no {form} item table state (saved by a run with "
                'train.item_updates = "dense"); resume with that setting'
            )
        averaged = name in state["weights"]
        shape = (rows, self.exp_avg.shape[1])
        if averaged != (self.average is not None) or tuple(state["exp_avg"].shape) != shape:
            raise ValueError(
                f"checkpoint: its {form} item table is {tuple(state['exp_avg'].shape)} "
                f"{'with' if averaged else 'without'} a weight average; the run's is "
                f"{shape} at train.ema_decay {self.ema_decay}"
            )

    @torch.no_grad()
    def load(self, state: dict[str, Any], name: str, take: Any) -> None:
        """Put back a resume state (checked by :meth:`check_state`): ``take(tensor [N, ...])`` gives
        the part of each whole tensor these slots hold, from slot 0 (the rest are zeroed)."""
        for mine, whole in ((self.exp_avg, state["exp_avg"]), (self.exp_avg_sq, state["exp_avg_sq"])):
            part = take(whole)
            mine.zero_()[: part.shape[0]] = part
        self.steps.fill_(state["steps"])
        part = take(state["current"])
        self.current.copy_(self.steps.expand_as(self.current))[: part.shape[0]] = part
        if self.average is not None:
            part = take(state["weights"][name])
            self.average.zero_()[: part.shape[0]] = part
        self.average_start.fill_(state["average_start"])
        self.lr = float(state["lr"])


def state_of(
    exp_avg: Tensor, exp_avg_sq: Tensor, current: Tensor, average: Tensor | None, adam: RowAdam, name: str
) -> dict[str, Any]:
    """The resume state of a whole table's rows (``[N, d]``, ``[N, d]``, ``[N]``, ``[N, d]`` or
    None), as plain data: ``weights`` holds the average by the table's parameter name, as
    :meth:`recsys.train.averaging.WeightAverage.state_dict` does."""
    return {
        "exp_avg": exp_avg,
        "exp_avg_sq": exp_avg_sq,
        "steps": int(adam.steps),
        "current": current,
        "weights": {} if average is None else {name: average},
        "average_start": int(adam.average_start),
        "lr": adam.lr,
    }
