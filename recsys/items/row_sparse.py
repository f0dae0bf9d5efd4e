"""Row-sparse training of the item table (``train.item_updates = "sparse"``): a step reads and
updates only the rows its batch touches.

At a million items a dense step reads and writes the whole ``[N, d]`` table several times over
(its gradient, clipping, AdamW's two moments and decay, the weight average) while the batch
touches a few thousand rows, so the step slows with the catalogue instead of the batch
(docs/results.md, "Training at a million items"). :class:`RowSparseTable` owns the table's
rows, their Adam moments and their weight average, and a step:

1. :meth:`RowSparseTable.step_rows` de-duplicates the batch's ids (history, targets, negatives,
   with the padding id 0 first) into a fixed number of slots ``T`` by sort and cumulative sum,
   so the step's shapes never change and a CUDA graph replays it; slots past the distinct ids
   hold id 0. Their rows, brought up to the current step (below), become a leaf ``[T, d]``
   that the model reads inside the block (:attr:`~recsys.items.table.ItemTable.weight`), and the
   batch's ids are renumbered to slots (slot 0 is id 0, so padding and masks keep their meaning).
2. The backward pass sums each slot's gradient over its occurrences into the leaf's ``grad``.
3. :meth:`RowSparseTable.collect` (under DDP: every rank's slots and gradients, gathered and
   summed, so every replica applies the same update) and :meth:`RowSparseTable.update`: Adam on
   the touched rows, with the global step's bias correction, as ``torch.optim.AdamW`` computes it.

**Rows the batch does not touch.** A dense AdamW step still (a) shrinks such a row by the
decoupled decay, (b) moves it by its decaying momentum and decays its moments, and (c) folds it
into the weight average. All three are geometric in the number of steps, so they are caught up in
closed form whenever the row is next read or the whole table is (:meth:`RowSparseTable.sync`,
before every validation and checkpoint), from a per-row count of the steps it is up to date with
(:meth:`RowSparseTable._caught_up`, :func:`average_catch_up`). Lazy Adam (TensorFlow Addons'
``LazyAdam``, FBGEMM's row-wise optimisers) drops (b): a row rarely touched then moves about a
tenth as far as under dense Adam, whose momentum carries each gradient ``1 / (1 - beta1)`` steps,
and on taobao that cost 30% of test recall. The catch-up is exact for the decay, the moments and
the average; the momentum's move holds Adam's bias corrections at the row's last write and
neglects ``eps`` beside ``sqrt(v̂)`` (docs/results.md, "Training at a million items", measures
its recall against the dense path).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from recsys.items.table import ItemTable, RowUpdates, register_form

__all__ = ["RowSparseTable", "average_catch_up", "unique_slots"]

SYNC_CHUNK = 1 << 16  # rows caught up at a time by RowSparseTable.sync: [chunk, d] temporaries


def unique_slots(ids: Tensor) -> tuple[Tensor, Tensor]:
    """De-duplicate ``ids [T]`` (long, >= 0) into ``T`` fixed slots, with no host sync.

    Returns ``(distinct [T], slot [T])``: the distinct ids in ascending order followed by zeros,
    and each id's slot, ``distinct[slot] == ids``. With ``ids[0] == 0`` (or any 0 among them)
    slot 0 holds id 0.
    """
    sorted_ids, order = torch.sort(ids)
    first = torch.ones_like(sorted_ids, dtype=torch.bool)
    first[1:] = sorted_ids[1:] != sorted_ids[:-1]
    sorted_slot = torch.cumsum(first, 0) - 1  # [T]
    distinct = torch.zeros_like(ids).scatter_(0, sorted_slot, sorted_ids)  # duplicates write equal values
    slot = torch.empty_like(ids).scatter_(0, order, sorted_slot)
    return distinct, slot


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
    untouched row moves as ``w_i = shrink^i·(w - D) + ratio^i·D`` (:meth:`RowSparseTable._caught_up`),
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


@register_form("sparse")
class RowSparseTable(ItemTable):
    """The item table's rows, their Adam moments and weight average, updated row by row
    (``train.item_updates = "sparse"``).

    Takes the rows of a dense table over (the same parameter, the same ``state_dict`` name) from
    the model's optimiser: the parameter stops requiring a gradient (so ``torch.optim`` and
    DistributedDataParallel leave it alone) and this table updates it in place, so evaluation,
    checkpoints and export see the same tensor as ever.

    Args:
        table: the dense table whose rows it takes over.
        updates: Adam's settings, the decay (decoupled, or L2 on the touched rows: untouched rows
            then keep their values), the average's decay and the processes training together.
        name: the rows' name in the model's ``state_dict`` (the checkpoint's average is keyed by it).
    """

    def __init__(self, table: ItemTable, updates: RowUpdates, name: str):
        if not 0.0 <= updates.ema_decay < 1.0:
            raise ValueError(f"train.ema_decay: must be in [0, 1), got {updates.ema_decay!r}")
        self._take_over(table)
        self.name = name
        weight = self.table.weight  # [N, d], updated in place
        weight.requires_grad_(False)
        self.lr, (self.beta1, self.beta2), self.eps = updates.lr, updates.betas, updates.eps
        self.weight_decay, self.decoupled = updates.weight_decay, updates.decoupled
        self.ema_decay, self.world_size = updates.ema_decay, updates.world_size
        num_items, device = weight.shape[0], weight.device
        self.exp_avg = torch.zeros_like(weight)  # [N, d] Adam's first moment, per row
        self.exp_avg_sq = torch.zeros_like(weight)  # [N, d] its second moment
        self.steps = torch.zeros((), dtype=torch.long, device=device)  # optimiser steps taken
        self.current = torch.zeros(num_items, dtype=torch.long, device=device)  # [N] steps each row is up to date with
        self.average = weight.detach().clone() if self.ema_decay else None  # [N, d] bias-corrected average
        self.average_start = torch.zeros((), dtype=torch.long, device=device)  # the step the average (re)started at
        self.gathered: Tensor | None = None  # [T, d] this step's rows (a leaf; its .grad after backward)
        self.ids: Tensor | None = None  # [T] their ids
        self._caught: tuple[Tensor, Tensor, Tensor, Tensor | None]  # their rows, moments, averages before the step
        self.update_ids: Tensor | None = None  # [T] (or [world T]) the ids the update writes ...
        self.update_grad: Tensor | None = None  # ... and their gradients, after collect()

    @classmethod
    def taking_over(cls, table: ItemTable, updates: RowUpdates, name: str) -> ItemTable:
        return cls(table, updates, name)

    @property
    def shrink(self) -> float:
        """The decoupled decay's factor a step, ``1 - lr·weight_decay`` (1 without it)."""
        return 1.0 - self.lr * self.weight_decay if self.decoupled else 1.0

    @property
    def ratio(self) -> float:
        """How much an untouched row's Adam move shrinks a step: ``beta1 / sqrt(beta2)``."""
        return self.beta1 / math.sqrt(self.beta2)

    @torch.no_grad()
    def _caught_up(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """``ids [R]`` -> their rows, Adam moments and averages (``[R, d]`` each; the average
        None without one) as of the current step: what the steps since they were last written
        did to them as rows without a gradient (module docstring).

        Such a step multiplies the moments by ``beta1`` and ``beta2``, shrinks the row by the
        decay and moves it by ``lr·q·ratio^i`` on its ``i``-th step, where ``q = m̂ / (sqrt(v̂) + eps)``
        at the row's last write and ``ratio = beta1 / sqrt(beta2)``: over ``k`` steps
        ``w_k = shrink^k·w - lr·q·ratio·(shrink^k - ratio^k) / (shrink - ratio)``. The bias
        corrections are held at the last write's (they change little over the momentum's few
        dozen steps once a run is past its first thousand), and ``eps`` at ``sqrt(v̂)``'s side.
        """
        written = self.current[ids]  # [R] the step each row was last brought to
        k = self.steps - written
        kf, t = k.double(), written.double()
        rows, exp_avg, exp_avg_sq = self.table.weight[ids], self.exp_avg[ids], self.exp_avg_sq[ids]
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
        average = self.average[ids] * a[:, None].to(dtype) + rows * b[:, None].to(dtype) + offset * c[:, None].to(dtype)
        return moved, exp_avg, exp_avg_sq, average

    @contextlib.contextmanager
    def step_rows(self, *ids: Tensor) -> Iterator[tuple[Tensor, ...]]:
        """Gather the rows of the step's ``ids`` (tensors of any shape, long) into a leaf ``[T, d]``
        (``T`` = 1 + their sizes) that the model reads inside the block, and yield the ids
        renumbered to its row positions, in the same shapes."""
        flat = torch.cat([ids[0].new_zeros(1), *(x.reshape(-1) for x in ids)])  # [T], id 0 first
        self.ids, slot = unique_slots(flat)
        self._caught = self._caught_up(self.ids)  # the update starts from them too (one process)
        self.gathered = self._caught[0].detach().requires_grad_()
        out, start = [], 1
        for x in ids:
            out.append(slot[start : start + x.numel()].view(x.shape))
            start += x.numel()
        self._rows, self._row_ids = self.gathered, self.ids
        try:
            yield tuple(out)
        finally:
            self._rows, self._row_ids = None, None

    @torch.no_grad()
    def collect(self) -> list[Tensor]:
        """After the backward pass: the ids and gradients the update applies (under DDP every
        rank's, summed over ranks and divided by their number, as DDP averages dense
        gradients); returns the gradient ``[T', d]`` for clipping, which scales it in place."""
        assert self.ids is not None and self.gathered is not None, "step_rows() first"
        rows = self.gathered
        grad = rows.grad if rows.grad is not None else torch.zeros_like(rows)
        ids = self.ids
        if self.world_size > 1:
            every_ids = [torch.empty_like(ids) for _ in range(self.world_size)]
            every_grad = [torch.empty_like(grad) for _ in range(self.world_size)]
            dist.all_gather(every_ids, ids)
            dist.all_gather(every_grad, grad)
            ids, slot = unique_slots(torch.cat(every_ids))
            grad = torch.zeros((ids.shape[0], grad.shape[1]), dtype=grad.dtype, device=grad.device).index_add_(
                0, slot, torch.cat(every_grad)
            ) / float(self.world_size)
        self.update_ids = ids
        self.update_grad = grad * (ids > 0)[:, None].to(grad.dtype)  # padding never moves
        return [self.update_grad]

    @torch.no_grad()
    def update(self) -> None:
        """Adam (with the decoupled decay, or L2) on the collected rows, then the weight average;
        the same arithmetic as ``torch.optim.AdamW`` for a row with a gradient. Capturable: the
        step count lives on the device."""
        assert self.update_ids is not None and self.update_grad is not None, "collect() first"
        ids, grad = self.update_ids, self.update_grad
        rows, exp_avg, exp_avg_sq, average = self._caught if ids is self.ids else self._caught_up(ids)
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
        self.table.weight.index_copy_(0, ids, rows)
        self.exp_avg.index_copy_(0, ids, exp_avg)
        self.exp_avg_sq.index_copy_(0, ids, exp_avg_sq)
        if self.average is not None and average is not None:
            folded = (step - self.average_start.double()).clamp_min(1)  # updates of the average, this one included
            share = ((1 - self.ema_decay) / (1 - torch.pow(self.ema_decay, folded))).to(rows.dtype)
            self.average.index_copy_(0, ids, average.add_((rows - average) * share))
        self.steps += 1
        self.current.index_put_((ids,), self.steps)

    @torch.no_grad()
    def sync(self) -> None:
        """Bring every row (and its average) up to the current step, in chunks of
        :data:`SYNC_CHUNK` rows: before the table is read whole (validation, checkpoints, a new rate)."""
        weight = self.table.weight
        for start in range(0, weight.shape[0], SYNC_CHUNK):
            ids = torch.arange(start, min(start + SYNC_CHUNK, weight.shape[0]), device=weight.device)
            rows, exp_avg, exp_avg_sq, average = self._caught_up(ids)
            weight[start : start + len(ids)] = rows
            self.exp_avg[start : start + len(ids)] = exp_avg
            self.exp_avg_sq[start : start + len(ids)] = exp_avg_sq
            if self.average is not None and average is not None:
                self.average[start : start + len(ids)] = average
        self.current.copy_(self.steps.expand_as(self.current))

    @contextlib.contextmanager
    def scored(self) -> Iterator[None]:
        """The table holds the weight average inside the block (after :meth:`sync`) and its own
        rows again after it (also when the block raises); the rows alone without an average."""
        self.sync()
        if self.average is None:
            yield
            return
        weight = self.table.weight
        own = weight.detach().clone()
        weight.copy_(self.average)
        try:
            yield
        finally:
            weight.copy_(own)

    def scale_lr(self, factor: float) -> None:
        """Multiply the rate by ``factor`` from the next step (the rows are caught up at the old one first)."""
        self.sync()
        self.lr *= factor

    @torch.no_grad()
    def reset_average(self) -> None:
        """Average afresh from the current rows (as :meth:`recsys.train.averaging.WeightAverage.reset` does)."""
        self.sync()
        if self.average is not None:
            self.average.copy_(self.table.weight)
        self.average_start.copy_(self.steps)

    def train_state(self) -> dict[str, Any]:
        """Plain data for the resume checkpoint (after :meth:`sync`, so every row is current):
        ``weights`` holds the average by the table's parameter name, as
        :meth:`recsys.train.averaging.WeightAverage.state_dict` does."""
        return {
            "exp_avg": self.exp_avg.clone(),
            "exp_avg_sq": self.exp_avg_sq.clone(),
            "steps": int(self.steps),
            "current": self.current.clone(),
            "weights": {} if self.average is None else {self.name: self.average.clone()},
            "average_start": int(self.average_start),
            "lr": self.lr,
        }

    @torch.no_grad()
    def load_train_state(self, state: dict[str, Any]) -> None:
        """Put back :meth:`train_state` (the table's own rows come with the model's weights)."""
        if not state:
            raise ValueError(
                "checkpoint: it holds no row-sparse item table state (saved by a run with "
                'train.item_updates = "dense"); resume with that setting'
            )
        averaged = self.name in state["weights"]
        if averaged != (self.average is not None) or state["exp_avg"].shape != self.exp_avg.shape:
            raise ValueError(
                f"checkpoint: its row-sparse item table is {tuple(state['exp_avg'].shape)} "
                f"{'with' if averaged else 'without'} a weight average; the run's is "
                f"{tuple(self.exp_avg.shape)} at train.ema_decay {self.ema_decay}"
            )
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.steps.fill_(state["steps"])
        self.current.copy_(state["current"])
        if self.average is not None:
            self.average.copy_(state["weights"][self.name])
        self.average_start.fill_(state["average_start"])
        self.lr = float(state["lr"])
