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

**Rows the batch does not touch** are brought up to date in closed form whenever they are next
read or the whole table is (:meth:`RowSparseTable.sync`, before every validation and checkpoint):
the decay, the moments, the average and the move their Adam momentum still makes
(:class:`recsys.items.row_adam.RowAdam`, which keeps the per-row state and does the arithmetic).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from recsys.items.row_adam import Caught, RowAdam, average_catch_up, state_of
from recsys.items.table import ItemTable, RowUpdates, register_form

__all__ = ["RowSparseTable", "average_catch_up", "renumbered", "summed_gradients", "unique_slots"]

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
        self._take_over(table)
        self.name = name
        weight = self.table.weight  # [N, d], updated in place
        weight.requires_grad_(False)
        self.adam = RowAdam(weight, updates)  # the rows' state, slot = item id
        self.world_size = updates.world_size
        self.gathered: Tensor | None = None  # [T, d] this step's rows (a leaf; its .grad after backward)
        self.ids: Tensor | None = None  # [T] their ids
        self._caught: Caught  # their rows, moments, averages before the step
        self.update_ids: Tensor | None = None  # [T] (or [world T]) the ids the update writes ...
        self.update_grad: Tensor | None = None  # ... and their gradients, after collect()

    @classmethod
    def taking_over(cls, table: ItemTable, updates: RowUpdates, name: str) -> ItemTable:
        return cls(table, updates, name)

    @property
    def exp_avg(self) -> Tensor:
        """``[N, d]`` Adam's first moment of every row (as of each row's last write)."""
        return self.adam.exp_avg

    @property
    def exp_avg_sq(self) -> Tensor:
        """``[N, d]`` its second moment."""
        return self.adam.exp_avg_sq

    @property
    def average(self) -> Tensor | None:
        """``[N, d]`` the rows' weight average (None without ``train.ema_decay``)."""
        return self.adam.average

    @property
    def steps(self) -> Tensor:
        """The optimiser steps taken (0-d long, on the device)."""
        return self.adam.steps

    def _caught_up(self, ids: Tensor) -> Caught:
        """``ids [R]`` -> their rows, moments and averages as of the current step (:meth:`RowAdam.caught_up`)."""
        return self.adam.caught_up(self.table.weight[ids], ids)

    @contextlib.contextmanager
    def step_rows(self, *ids: Tensor) -> Iterator[tuple[Tensor, ...]]:
        """Gather the rows of the step's ``ids`` (tensors of any shape, long) into a leaf ``[T, d]``
        (``T`` = 1 + their sizes) that the model reads inside the block, and yield the ids
        renumbered to its row positions, in the same shapes."""
        flat = torch.cat([ids[0].new_zeros(1), *(x.reshape(-1) for x in ids)])  # [T], id 0 first
        self.ids, slot = unique_slots(flat)
        self._caught = self._caught_up(self.ids)  # the update starts from them too (one process)
        self.gathered = self._caught[0].detach().requires_grad_()
        self._rows, self._row_ids = self.gathered, self.ids
        try:
            yield renumbered(ids, slot)
        finally:
            self._rows, self._row_ids = None, None

    @torch.no_grad()
    def collect(self) -> list[Tensor]:
        """After the backward pass: the ids and gradients the update applies (under DDP every
        rank's, summed over ranks and divided by their number, as DDP averages dense
        gradients); returns the gradient ``[T', d]`` for clipping, which scales it in place."""
        assert self.ids is not None and self.gathered is not None, "step_rows() first"
        self.update_ids, self.update_grad = summed_gradients(self.ids, self.gathered, self.world_size)
        return [self.update_grad]

    @torch.no_grad()
    def update(self) -> None:
        """Adam (with the decoupled decay, or L2) on the collected rows, then the weight average
        (:meth:`RowAdam.step`). Capturable: the step count lives on the device."""
        assert self.update_ids is not None and self.update_grad is not None, "collect() first"
        ids = self.update_ids
        caught = self._caught if ids is self.ids else self._caught_up(ids)
        self.table.weight.index_copy_(0, ids, self.adam.step(ids, caught, self.update_grad))

    @torch.no_grad()
    def sync(self) -> None:
        """Bring every row (and its average) up to the current step, in chunks of
        :data:`SYNC_CHUNK` rows: before the table is read whole (validation, checkpoints, a new rate)."""
        self.adam.sync(self.table.weight, SYNC_CHUNK)

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
        self.adam.lr *= factor

    @torch.no_grad()
    def reset_average(self) -> None:
        """Average afresh from the current rows (as :meth:`recsys.train.averaging.WeightAverage.reset` does)."""
        self.sync()
        self.adam.reset_average(self.table.weight)

    def train_state(self) -> dict[str, Any]:
        """Plain data for the resume checkpoint (after :meth:`sync`, so every row is current):
        ``weights`` holds the average by the table's parameter name, as
        :meth:`recsys.train.averaging.WeightAverage.state_dict` does."""
        average = None if self.average is None else self.average.clone()
        return state_of(
            self.exp_avg.clone(), self.exp_avg_sq.clone(), self.adam.current.clone(), average, self.adam, self.name
        )

    @torch.no_grad()
    def load_train_state(self, state: dict[str, Any]) -> None:
        """Put back :meth:`train_state` (the table's own rows come with the model's weights)."""
        self.adam.check_state(state, self.name, self.num_items, "row-sparse")
        self.adam.load(state, self.name, lambda whole: whole)


def renumbered(ids: tuple[Tensor, ...], slot: Tensor) -> tuple[Tensor, ...]:
    """The step's ``ids`` as the slots ``slot [T]`` (:func:`unique_slots` of 0 and their
    concatenation) give them, in their shapes."""
    out, start = [], 1
    for x in ids:
        out.append(slot[start : start + x.numel()].view(x.shape))
        start += x.numel()
    return tuple(out)


@torch.no_grad()
def summed_gradients(
    ids: Tensor, rows: Tensor, world_size: int, every_ids: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``ids [T]`` and the leaf ``rows [T, d]`` they were read into -> the ids the update writes
    and their gradients: this process's, or under DDP every rank's (``every_ids [world, T]``
    when already gathered), each distinct id's summed over ranks and divided by their number,
    as DDP averages dense gradients. The padding's gradient is 0."""
    grad = rows.grad if rows.grad is not None else torch.zeros_like(rows)
    if world_size > 1:
        if every_ids is None:
            gathered = [torch.empty_like(ids) for _ in range(world_size)]
            dist.all_gather(gathered, ids)
            every_ids = torch.stack(gathered)
        every_grad = [torch.empty_like(grad) for _ in range(world_size)]
        dist.all_gather(every_grad, grad)
        ids, slot = unique_slots(every_ids.reshape(-1))
        grad = torch.zeros((ids.shape[0], grad.shape[1]), dtype=grad.dtype, device=grad.device).index_add_(
            0, slot, torch.cat(every_grad)
        ) / float(world_size)
    return ids, grad * (ids > 0)[:, None].to(grad.dtype)  # padding never moves
