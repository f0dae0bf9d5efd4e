"""The item table: one row of ``d`` numbers per item id, read by the model, the losses, retrieval
and export, and updated by training in one of several forms (``train.item_updates``).

Everything outside :mod:`recsys.items` reads items through an :class:`ItemTable` (lookups,
:attr:`ItemTable.weight`, :meth:`ItemTable.all`) and trains them through its step protocol
(:meth:`ItemTable.step_rows`, :meth:`ItemTable.collect`, :meth:`ItemTable.update`, ...), never
through its parameters (``tests/test_architecture.py`` guards this). A form is one registered
class (:func:`register_form`): ``"dense"`` is :class:`ItemTable` itself, whose rows are ordinary
parameters the model's optimiser and weight average update; ``"sparse"``
(:class:`~recsys.items.row_sparse.RowSparseTable`) updates only the rows a step touches, with its
own row-wise Adam state and average. A form takes over the dense table's rows (the same tensor,
the same ``state_dict`` name), so a run's saved weights load into any form, and serving always
reads the dense one.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recsys.nn.masking import length_mask

__all__ = ["FORMS", "ItemTable", "RowUpdates", "register_form"]


@dataclass(frozen=True)
class RowUpdates:
    """How a training run updates the table's rows, for the forms that update them themselves
    (the dense form leaves them to the model's optimiser).

    Attributes:
        lr, betas, eps: Adam's, as the model's optimiser's.
        weight_decay: AdamW's decoupled decay (``decoupled``) or Adam's L2 term on the touched rows.
        ema_decay: the weight average's decay (``train.ema_decay``); 0 keeps none.
        world_size: processes training together (their rows' gradients are summed and averaged).
    """

    lr: float
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = True
    ema_decay: float = 0.0
    world_size: int = 1


class ItemTable(nn.Module):
    """The item table ``[num_items, d]``, shared as input and output embeddings (tied); the dense form.

    Row 0 is padding: it starts at zero and never receives a gradient. Lookups are masked by
    length, so whatever id sits at a padded position contributes an exact zero vector. Rows start
    as ``N(0, 1/d)``, so embeddings have norm about 1 and inner products start at the scale of a
    unit-variance logit.

    The step protocol below is what the trainer calls on every form: for the dense form the
    rows are the model's parameters, so each call does nothing (:meth:`step_rows` hands the ids
    back unchanged).
    """

    form = "dense"

    def __init__(self, num_items: int, dim: int):
        super().__init__()
        if num_items < 2:
            raise ValueError(f"num_items must be >= 2 (id 0 is padding), got {num_items}")
        self.table = nn.Embedding(num_items, dim, padding_idx=0)
        self.init_normal(1.0 / math.sqrt(dim))
        self._rows: Tensor | None = None  # the rows a step reads instead of the table (other forms)

    @property
    def num_items(self) -> int:
        return self.table.num_embeddings

    @property
    def dim(self) -> int:
        return self.table.embedding_dim

    @property
    def weight(self) -> Tensor:
        """``[num_items, d]``; inside another form's :meth:`step_rows`, the ``[T, d]`` rows the step reads."""
        return self.table.weight if self._rows is None else self._rows

    def all(self) -> Tensor:
        """``[num_items, d]``: every item's row, for retrieval, export and scoring the whole catalogue."""
        return self.table.weight

    @torch.no_grad()
    def init_normal(self, std: float) -> None:
        """Draw every row from ``N(0, std²)``; the padding row stays 0."""
        nn.init.normal_(self.table.weight, std=std)
        self.table.weight[0].zero_()

    def forward(self, seq: Tensor, lengths: Tensor) -> Tensor:
        """``seq [B, L]`` ids, ``lengths [B]`` -> ``[B, L, d]``, zero at padded positions."""
        h = self.table(seq) if self._rows is None else F.embedding(seq, self._rows)  # [B, L, d]
        return h * length_mask(lengths, seq.shape[1]).to(h.dtype)[..., None]

    def trained_as(self, form: str, updates: RowUpdates, name: str) -> ItemTable:
        """This table in the form ``form`` (``train.item_updates``) trains it with: itself for
        ``"dense"``; another form takes its rows over (the same tensor). ``name``: the rows' name
        in the model's ``state_dict`` (a checkpoint keys the rows' average by it)."""
        if form not in FORMS:
            raise ValueError(f"train.item_updates: unknown form {form!r}; known: {', '.join(FORMS)}")
        return self if form == self.form else FORMS[form].taking_over(self, updates, name)

    @classmethod
    def taking_over(cls, table: ItemTable, updates: RowUpdates, name: str) -> ItemTable:
        """A table of this form over ``table``'s rows (other forms override it)."""
        return table

    # The step protocol: what a training step calls on the table, in this order.

    @contextlib.contextmanager
    def step_rows(self, *ids: Tensor) -> Iterator[tuple[Tensor, ...]]:
        """Inside the block the model reads the rows of the step's ``ids`` (tensors of any shape,
        long); yields the ids as the model must be given them (this form: unchanged)."""
        yield ids

    def collect(self) -> list[Tensor]:
        """After the backward pass: the gradients this form applies itself, for clipping (which
        scales them in place); this form: none, its gradients are the parameters' own."""
        return []

    def update(self) -> None:
        """After the model's optimiser step: this form's own update (this form: none)."""

    @contextlib.contextmanager
    def scored(self) -> Iterator[None]:
        """Inside the block the table holds what validation scores and checkpoints save (its rows
        up to date, or their average where the form keeps one); this form: its rows, as they are."""
        yield

    def scale_lr(self, factor: float) -> None:
        """Multiply this form's own learning rate by ``factor`` (this form: the optimiser's is the rows')."""

    def reset_average(self) -> None:
        """Average afresh from the current rows (this form: the model's average covers them)."""

    def train_state(self) -> dict[str, Any]:
        """This form's resume state beside the model's weights (empty: nothing of its own)."""
        return {}

    def load_train_state(self, state: dict[str, Any]) -> None:
        """Put back :meth:`train_state`."""


FORMS: dict[str, type[ItemTable]] = {ItemTable.form: ItemTable}


def register_form(form: str) -> Callable[[type[ItemTable]], type[ItemTable]]:
    """Register an :class:`ItemTable` subclass as ``train.item_updates = form``."""

    def register(cls: type[ItemTable]) -> type[ItemTable]:
        if form in FORMS:
            raise ValueError(f"item table form {form!r} is registered already")
        cls.form = form
        FORMS[form] = cls
        return cls

    return register
