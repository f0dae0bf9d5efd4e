"""The sharded item table (``train.item_updates = "sharded"``): under torchrun each rank keeps the
Adam moments and the weight average of its own share of the rows only, and updates only those.

The row-sparse form (:mod:`recsys.items.row_sparse`) keeps the whole table, both Adam moments and
the average on every rank (``4·N·d`` numbers a rank) and every rank applies every touched row's
update. :class:`ShardedTable` splits the rows' optimiser state: rank ``r`` of ``W`` owns the rows
``r, r + W, r + 2W, ...`` (strided, not contiguous: item ids are numbered by popularity, so
contiguous blocks would give rank 0 most of every batch's rows, their exchange and their updates;
strided shares them about evenly, and a block of slots on every rank is a contiguous block of ids,
which the whole-table gathers below write in place). A step, with the same per-row arithmetic as
the row-sparse form (:class:`recsys.items.row_adam.RowAdam`: Adam, the decay, the average and the
closed-form catch-up of untouched rows):

1. :meth:`ShardedTable.step_rows` de-duplicates the rank's ids into ``T`` slots as the row-sparse
   form does and all-gathers them (``W·T`` ids); each owner brings the rows it owns among them up
   to the current step and one all-to-all returns to every rank its rows (``[T, d]`` blocks, zero
   where another rank owns the id: ``W·T·d`` numbers sent and received a rank). The model reads
   them as in the row-sparse form (a leaf ``[T, d]``, the ids renumbered to its slots).
2. :meth:`ShardedTable.collect` all-gathers the gradients and sums each id's over ranks, divided by
   their number (as DDP averages, and as the row-sparse form does: every rank has the same summed
   gradients, so clipping sees the global norm), and :meth:`ShardedTable.update` lets each owner
   apply Adam to the rows it owns. Shapes never change (ids another rank owns write a scratch
   slot, and the padding row's zero), so the step has no host sync.

**What is sharded, and what is not.** Sharded: both Adam moments, the weight average and the
per-row step counts, ``3·N·d / W`` numbers a rank instead of ``3·N·d``. Not sharded: the rows
themselves. The table's parameter keeps its full ``[N, d]`` size on every rank, because the model's
``state_dict``, checkpoints, the best weights, export and evaluation read it whole, and loading the
best weights writes it whole; between steps only the rank's own rows in it are current (another
rank's rows are fetched from their owner when a step reads them). So a rank holds ``N·d·(1 + 3/W)``
numbers where the row-sparse form holds ``4·N·d``.

**The whole table** is made current on every rank by :meth:`ShardedTable.scored` (validation and
checkpoints run inside it): every rank brings its rows up to date and the rows are all-gathered
into the parameter in blocks of slots (a ``[W·chunk, d]`` temporary); with a weight average, the
average is all-gathered into it for the block (the rank keeps a ``[N/W, d]`` copy of its own rows)
and the rows again after it. The resume state (:meth:`ShardedTable.train_state`) is the row-sparse
form's, whole (``[N, d]`` moments and average in item order), so a checkpoint resumes on any number
of ranks and in either form; because the trainer asks only rank 0 for it, ``scored()`` also gathers
it onto rank 0's host memory (``3·N·d`` numbers, kept until the next step).

In one process the form owns every row and equals the row-sparse form bit for bit (its state has
one scratch row more).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from recsys.items.row_adam import RowAdam, state_of
from recsys.items.row_sparse import SYNC_CHUNK, renumbered, summed_gradients, unique_slots
from recsys.items.table import ItemTable, RowUpdates, register_form

__all__ = ["ShardedTable"]


@register_form("sharded")
class ShardedTable(ItemTable):
    """The item table with its rows' Adam moments and weight average split over the ranks
    (``train.item_updates = "sharded"``; module docstring).

    Takes the rows of a dense table over as :class:`~recsys.items.row_sparse.RowSparseTable` does
    (the same parameter, the same ``state_dict`` name; it stops requiring a gradient). Rank ``r``
    of ``W`` owns the rows ``r + W·s``; ``s`` is the row's slot in its :class:`RowAdam`, whose last
    slot is scratch (the updates of rows another rank owns write it).

    Args:
        table: the dense table whose rows it takes over.
        updates: Adam's settings, the decay, the average's decay and the processes training
            together (the process group must exist when it is above 1).
        name: the rows' name in the model's ``state_dict`` (the checkpoint's average is keyed by it).
    """

    def __init__(self, table: ItemTable, updates: RowUpdates, name: str):
        self._take_over(table)
        self.name = name
        weight = self.table.weight  # [N, d]: the own rows current between steps, all inside scored()
        weight.requires_grad_(False)
        self.world_size = updates.world_size
        if self.world_size > 1 and not (dist.is_initialized() and dist.get_world_size() == self.world_size):
            raise RuntimeError(f"the sharded item table needs a process group of {self.world_size} processes")
        self.rank = dist.get_rank() if self.world_size > 1 else 0
        self.slots = -(-weight.shape[0] // self.world_size)  # rows a rank owns at most
        start = weight.new_zeros(self.slots + 1, weight.shape[1])  # [S, d] the own rows, then 0s and scratch
        start[: self.own().shape[0]] = self.own()
        self.adam = RowAdam(start, updates)
        self.gathered: Tensor | None = None  # [T, d] this step's rows (a leaf; its .grad after backward)
        self.ids: Tensor | None = None  # [T] their ids
        self.every_ids: Tensor | None = None  # [W, T] every rank's
        self.update_ids: Tensor | None = None  # [W T] the ids the update covers ...
        self.update_grad: Tensor | None = None  # ... and their summed gradients, after collect()
        self._whole: tuple[Tensor, Tensor, Tensor, Tensor | None] | None = None  # rank 0's resume state

    @classmethod
    def taking_over(cls, table: ItemTable, updates: RowUpdates, name: str) -> ItemTable:
        return cls(table, updates, name)

    def own(self) -> Tensor:
        """``[R, d]`` this rank's rows, ``r, r + W, ...``: a view of the table's parameter."""
        return self.table.weight[self.rank :: self.world_size]

    @property
    def average(self) -> Tensor | None:
        """``[R, d]`` this rank's rows' weight average (None without ``train.ema_decay``)."""
        return None if self.adam.average is None else self.adam.average[: self.own().shape[0]]

    def _owned(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``ids [R]`` -> ``(mine [R] bool, slot [R], at [R])``: which this rank owns, their slots
        (the scratch slot elsewhere) and the ids to read and write (the padding's, 0, elsewhere)."""
        mine = ids % self.world_size == self.rank
        slot = torch.where(mine, ids // self.world_size, self.slots)
        return mine, slot, torch.where(mine, ids, 0)

    @contextlib.contextmanager
    def step_rows(self, *ids: Tensor) -> Iterator[tuple[Tensor, ...]]:
        """Fetch the rows of the step's ``ids`` (tensors of any shape, long) from their owners into
        a leaf ``[T, d]`` (``T`` = 1 + their sizes) that the model reads inside the block, and
        yield the ids renumbered to its row positions, in the same shapes."""
        self._whole = None
        flat = torch.cat([ids[0].new_zeros(1), *(x.reshape(-1) for x in ids)])  # [T], id 0 first
        self.ids, slot = unique_slots(flat)
        if self.world_size > 1:
            every = [torch.empty_like(self.ids) for _ in range(self.world_size)]
            dist.all_gather(every, self.ids)
            self.every_ids = torch.stack(every)  # [W, T]
        else:
            self.every_ids = self.ids[None]
        self.gathered = self._fetch(self.every_ids).detach().requires_grad_()
        self._rows, self._row_ids = self.gathered, self.ids
        try:
            yield renumbered(ids, slot)
        finally:
            self._rows, self._row_ids = None, None

    @torch.no_grad()
    def _fetch(self, every_ids: Tensor) -> Tensor:
        """``every_ids [W, T]`` -> ``[T, d]`` the current rows of this rank's ids: each rank brings
        the ones it owns up to date, and an all-to-all sends them to the ranks that read them."""
        mine, slot, at = self._owned(every_ids.reshape(-1))
        rows = self.adam.caught_up(self.table.weight[at], slot)[0]  # [W T, d]
        sent = torch.where(mine[:, None], rows, 0.0).view(*every_ids.shape, -1)  # [W, T, d]: block r for rank r
        if self.world_size == 1:
            return sent[0]
        got = torch.empty_like(sent)
        dist.all_to_all_single(got, sent)  # got[r]: the rows rank r owns of this rank's ids
        ids = every_ids[self.rank]
        return got[ids % self.world_size, torch.arange(ids.shape[0], device=ids.device)]

    @torch.no_grad()
    def collect(self) -> list[Tensor]:
        """After the backward pass: every rank's ids and gradients, each id's summed over ranks
        and divided by their number (the same on every rank); returns the gradient ``[W T, d]``
        for clipping, which scales it in place."""
        assert self.ids is not None and self.gathered is not None, "step_rows() first"
        self.update_ids, self.update_grad = summed_gradients(self.ids, self.gathered, self.world_size, self.every_ids)
        return [self.update_grad]

    @torch.no_grad()
    def update(self) -> None:
        """Adam on the collected rows this rank owns (:meth:`RowAdam.step`); the others leave its
        rows alone (they update the scratch slot from the padding's zero row with no gradient)."""
        assert self.update_ids is not None and self.update_grad is not None, "collect() first"
        mine, slot, at = self._owned(self.update_ids)
        weight = self.table.weight
        caught = self.adam.caught_up(weight[at], slot)
        rows = self.adam.step(slot, caught, torch.where(mine[:, None], self.update_grad, 0.0))
        weight.index_copy_(0, at, torch.where(mine[:, None], rows, 0.0))  # elsewhere: 0 into the padding row

    @torch.no_grad()
    def sync(self) -> None:
        """Bring this rank's rows (and their state) up to the current step (its other rows stay as they are)."""
        self.adam.sync(self.own(), SYNC_CHUNK)

    @torch.no_grad()
    def _spread(self, local: Tensor) -> None:
        """Every rank's ``local [R, d]`` (its own rows' values, slot order) into the whole table
        parameter of every rank, :data:`SYNC_CHUNK` slots at a time."""
        weight, world = self.table.weight, self.world_size
        for start in range(0, self.slots, SYNC_CHUNK):
            stop = min(start + SYNC_CHUNK, self.slots)
            piece = weight.new_zeros(stop - start, weight.shape[1])
            mine = local[start:stop]
            piece[: mine.shape[0]] = mine
            if world > 1:
                parts = [torch.empty_like(piece) for _ in range(world)]
                dist.all_gather(parts, piece)
                piece = torch.stack(parts, 1).flatten(0, 1)  # [chunk W, d]: ids start W .. stop W
            end = min(stop * world, weight.shape[0])
            weight[start * world : end] = piece[: end - start * world]

    @torch.no_grad()
    def _gathered(self, local: Tensor) -> Tensor | None:
        """Every rank's ``local [S, ...]`` (slot order) as the whole ``[N, ...]`` in item order:
        in one process on the device, else on rank 0's CPU (None on the others)."""
        num_items, world = self.num_items, self.world_size
        if world == 1:
            return local[:num_items].clone()
        main = self.rank == 0
        out = torch.empty((world * self.slots, *local.shape[1:]), dtype=local.dtype) if main else None
        for start in range(0, self.slots, SYNC_CHUNK):
            stop = min(start + SYNC_CHUNK, self.slots)
            piece = local[start:stop].contiguous()
            parts = [torch.empty_like(piece) for _ in range(world)] if main else None
            dist.gather(piece, parts, dst=0)
            if out is not None and parts is not None:
                out[start * world : stop * world] = torch.stack(parts, 1).flatten(0, 1).cpu()
        return None if out is None else out[:num_items]

    def _whole_state(self) -> tuple[Tensor, Tensor, Tensor, Tensor | None] | None:
        """The moments, step counts and average of every row in item order (:meth:`_gathered`;
        None off rank 0)."""
        a = self.adam
        exp_avg, exp_avg_sq, current = (
            self._gathered(a.exp_avg),
            self._gathered(a.exp_avg_sq),
            self._gathered(a.current),
        )
        average = None if a.average is None else self._gathered(a.average)
        if exp_avg is None or exp_avg_sq is None or current is None:
            return None
        return exp_avg, exp_avg_sq, current, average

    def _materialise(self) -> None:
        """Every row current in every rank's table parameter, and the whole resume state on rank 0."""
        self.sync()
        if self.world_size > 1:
            self._spread(self.own())
        self._whole = self._whole_state()

    @contextlib.contextmanager
    def scored(self) -> Iterator[None]:
        """The whole table on every rank: its rows, current, after the block (also when it raises)
        and the weight average inside it; the rows alone without an average. Every rank enters it
        together (it all-gathers), and it leaves the resume state on rank 0."""
        self._materialise()
        if self.adam.average is None:
            yield
            return
        own = self.own().clone()
        self._spread(self.adam.average)
        try:
            yield
        finally:
            self.own().copy_(own)
            self._spread(own)

    def scale_lr(self, factor: float) -> None:
        """Multiply the rate by ``factor`` from the next step (the rows are caught up at the old one first)."""
        self.sync()
        self.adam.lr *= factor

    @torch.no_grad()
    def reset_average(self) -> None:
        """Average afresh from the current rows (every rank together: the resume state is gathered again)."""
        self.sync()
        self.adam.reset_average(self.own())
        self._materialise()

    def train_state(self) -> dict[str, Any]:
        """The whole table's resume state, as the row-sparse form's (item order, so it resumes on
        any number of processes and in either form). Under torchrun only rank 0 has it, gathered
        by the latest :meth:`scored` (or :meth:`reset_average`) since the last step."""
        whole = self._whole_state() if self.world_size == 1 else self._whole
        if whole is None:
            raise RuntimeError(
                f"sharded item table: rank {self.rank} of {self.world_size} holds no whole resume state "
                "(rank 0 gathers it in scored(), every rank together, after the last step)"
            )
        return state_of(*whole, self.adam, self.name)

    @torch.no_grad()
    def load_train_state(self, state: dict[str, Any]) -> None:
        """Put back a whole :meth:`train_state` (of any number of processes, or of the row-sparse
        form): this rank keeps its own rows' part; the rows come with the model's weights."""
        self.adam.check_state(state, self.name, self.num_items, "sharded")
        self.adam.load(state, self.name, lambda whole: whole[self.rank :: self.world_size])
        self._whole = None
