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

from recsys.config import CHOOSE_COLD_SCALE
from recsys.data.features import ItemFeatures
from recsys.items.features import FeatureEmbedding
from recsys.nn.masking import length_mask

__all__ = ["COLD_ROWS", "FORMS", "FeatureUse", "ItemTable", "RowUpdates", "find_item_table", "register_form"]

COLD_ROWS = ("zero", "attribute_mean")  # model.cold_rows: what stands for a clickless item's id row


@dataclass(frozen=True)
class FeatureUse:
    """How a table reads its item features (the ``model`` settings of the same names).

    Attributes:
        id_dropout: in training, each read of a clicked item leaves its id row out with this
            probability, so the feature part learns to stand for an item alone (DropoutNet's idea,
            Volkovs et al. 2017).
        cold_rows: outside training, an item without clicks is its feature part alone (``"zero"``)
            or that plus the id row its attributes predict (``"attribute_mean"``,
            :meth:`~recsys.items.features.FeatureEmbedding.attribute_means`).
        cold_scale: outside training, retrieval scales an item without clicks by it (above 1, new
            items rank higher against the clicked ones: a boost, which can cost the clicked items'
            recall); :data:`CHOOSE_COLD_SCALE`: 1 until the trainer chooses it on validation
            (:mod:`recsys.train.new_items`).
    """

    id_dropout: float = 0.0
    cold_rows: str = "attribute_mean"
    cold_scale: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.id_dropout < 1.0:
            raise ValueError(f"model.id_dropout: must be in [0, 1), got {self.id_dropout!r}")
        if self.cold_rows not in COLD_ROWS:
            raise ValueError(f"model.cold_rows: {self.cold_rows!r} is not one of {list(COLD_ROWS)}")
        if not (self.cold_scale > 0 or self.cold_scale == CHOOSE_COLD_SCALE):
            raise ValueError(f"model.cold_scale: must be > 0 (or -1: chosen on validation), got {self.cold_scale!r}")


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
        self.features: FeatureEmbedding | None = None  # add_features
        self.id_dropout = 0.0  # with features: how often a training read leaves a clicked item's id row out
        self.cold_rows = "zero"  # with features: what stands for the id row of an item without clicks
        self.cold_scale = 1.0  # with features: outside training, an item without clicks is scaled by it
        self._cold: tuple[tuple[int, int, int], list[Tensor]] | None = None  # value means, by the rows' version
        self.warm: Tensor | None  # [num_items] bool, with features: the items whose id row is read
        self.register_buffer("warm", None, persistent=False)
        self.init_normal(1.0 / math.sqrt(dim))
        self._rows: Tensor | None = None  # the rows a step reads instead of the table (other forms) ...
        self._row_ids: Tensor | None = None  # ... and their item ids

    @property
    def num_items(self) -> int:
        """Rows, the padding row and new items included."""
        return self.table.num_embeddings

    @property
    def dim(self) -> int:
        return self.table.embedding_dim

    @property
    def weight(self) -> Tensor:
        """``[num_items, d]`` every item's representation; inside another form's :meth:`step_rows`,
        the ``[T, d]`` rows the step reads."""
        if self._rows is None:
            return self.all()
        return self._represent(self._rows, self._row_ids)

    def all(self) -> Tensor:
        """``[num_items, d]``: every item's representation, for retrieval, export and scoring the
        whole catalogue (outside training, items without clicks scaled by ``cold_scale``; a history
        reads them unscaled)."""
        out = self._represent(self.table.weight, None)
        if self.training or self.cold_scale == 1.0 or self.warm is None:
            return out
        return out * torch.where(self.warm, 1.0, self.cold_scale)[:, None].to(out.dtype)

    def _represent(self, rows: Tensor, ids: Tensor | None) -> Tensor:
        """``rows [R, d]`` id rows of items ``ids [R]`` (None: every item) as representations: the
        rows themselves, or with features the warm rows plus the feature part
        (:mod:`recsys.items.features`)."""
        if self.features is None:
            return rows
        assert self.warm is not None
        ids = torch.arange(rows.shape[0], device=rows.device) if ids is None else ids
        read = self.warm[ids]  # [R] whose id rows are read
        if self.training and self.id_dropout:
            read = read & (torch.rand(read.shape, device=read.device) >= self.id_dropout)
        out = rows * read[:, None].to(rows.dtype) + self.features(ids).to(rows.dtype)
        if self.cold_rows == "attribute_mean" and not self.training:  # the row their attributes predict
            means = self._value_means()
            if means:
                out = out + self.features.attribute_means(means, ids) * (~self.warm[ids])[:, None].to(rows.dtype)
        return out

    def _value_means(self) -> list[Tensor]:
        """:meth:`~recsys.items.features.FeatureEmbedding.value_means` of the current rows (``[vocab, d]``
        a field), kept until the rows change: evaluation and serving read them every batch."""
        assert self.features is not None and self.warm is not None
        weight = self.table.weight
        key = (weight.data_ptr(), weight._version, weight.shape[0])
        if self._cold is None or self._cold[0] != key:
            with torch.no_grad():
                self._cold = key, self.features.value_means(weight.detach(), self.warm)
        return self._cold[1]

    @torch.no_grad()
    def add_features(self, features: ItemFeatures, trained: Tensor, use: FeatureUse = FeatureUse()) -> None:
        """Represent items by their id rows and their features (:mod:`recsys.items.features`) from now
        on: the table grows to ``features.num_items`` rows (new items' id rows are zero and never
        read) and ``trained [num_known]`` (training clicks per item) marks whose id rows are read;
        ``use`` says how the features stand in for missing id rows (:class:`FeatureUse`)."""
        self.id_dropout, self.cold_rows = use.id_dropout, use.cold_rows
        self.cold_scale = 1.0 if use.cold_scale == CHOOSE_COLD_SCALE else use.cold_scale
        if features.num_known != self.table.num_embeddings or len(trained) != features.num_known:
            raise ValueError(
                f"item features: {features.num_known} known items, the table has {self.table.num_embeddings} "
                f"rows and {len(trained)} training counts"
            )
        self._grow(features.num_items, trained > 0)
        self.features = FeatureEmbedding(features, self.dim).to(self.table.weight.device)
        self.features.init_normal(self._std)

    @torch.no_grad()
    def add_items(self, features: ItemFeatures) -> None:
        """Take the new items that ``features`` lists after this table's rows (a trained table's
        catalogue grown by a feature file: :func:`recsys.run.add_items`): the table grows to
        ``features.num_items`` rows, each added item's id row zero and never read (it is not warm),
        so an added item is its feature part alone, through the trained value rows and projection.
        ``features``' rows before them must be the table's own (the trained features, appended to),
        so every existing item keeps its representation."""
        if self.features is None:
            raise ValueError("the item table has no features: only a table of item features takes new items")
        if type(self) is not ItemTable:
            raise ValueError(f"new items join the dense item table (serving), not the {self.form!r} form")
        if features.num_items < self.num_items:
            raise ValueError(f"item features: {features.num_items} items, fewer than the table's {self.num_items} rows")
        assert self.warm is not None
        self.features.set_items(features)
        self._grow(features.num_items, self.warm)

    def _grow(self, num_items: int, warm: Tensor) -> None:
        """The table at ``num_items`` rows: its present rows kept, the added ones zero; ``warm``
        ``[n <= num_items]`` bool marks the items whose id rows are read (the added ones are not)."""
        old = self.table
        self.table = nn.Embedding(num_items, self.dim, padding_idx=0, device=old.weight.device)
        self.table.weight.zero_()
        self.table.weight[: old.num_embeddings] = old.weight
        grown = torch.zeros(num_items, dtype=torch.bool, device=old.weight.device)
        grown[: len(warm)] = warm.to(grown.device)
        self.warm = grown

    @torch.no_grad()
    def load_rows(self, source: ItemTable, ids_here: Tensor, ids_there: Tensor) -> list[tuple[str, int, int]]:
        """Start from another run's table (a warm start): this table's rows ``ids_here [n]`` take
        ``source``'s rows ``ids_there [n]`` (the same items under the two runs' ids), as ``source``
        reads them (with features, an item whose id row it left out gives a zero row, so the item
        starts as the same features alone); every other row keeps its fresh initialisation. With
        features on both sides, the feature value rows are copied by field name and raw value
        (:meth:`~recsys.items.features.FeatureEmbedding.load_values`), whose summary it returns
        (``[]`` otherwise).

        A table with features over one without: the feature rows stay fresh. The reverse is
        refused: ``source``'s items are partly their features, which this table cannot hold."""
        if source.dim != self.dim:
            raise ValueError(f"item rows: {source.dim} numbers each there, {self.dim} here")
        if source.features is not None and self.features is None:
            raise ValueError("item rows: the earlier table represents items with their features; this one has none")
        if ids_here.shape != ids_there.shape or ids_here.ndim != 1:
            raise ValueError(f"item rows: ids_here {tuple(ids_here.shape)} and ids_there {tuple(ids_there.shape)}")
        if len(ids_here) and (int(ids_here.min()) < 1 or int(ids_there.min()) < 1):
            raise ValueError("item rows: id 0 is padding on both sides and is never carried")
        rows = source.table.weight[ids_there]
        if source.features is not None:
            assert source.warm is not None
            rows = rows * source.warm[ids_there, None].to(rows.dtype)
        weight = self.table.weight
        weight[ids_here.to(weight.device)] = rows.to(weight)
        if self.features is None or source.features is None:
            return []
        return self.features.load_values(source.features)

    @torch.no_grad()
    def start_as_means(self, targets: Tensor, sources: Tensor, chunk: int = 1 << 20) -> int:
        """Each item of ``targets [p]`` starts as the mean of the id rows of its ``sources [p]`` (pair
        ``j``: ``targets[j]`` reads ``sources[j]``'s row), read before any of them changes; returns how
        many rows started so. A warm start gives its new items the rows of the known items clicked
        beside them (:func:`recsys.train.warm_start.neighbour_pairs`). ``chunk`` pairs are read at a time."""
        if targets.shape != sources.shape or targets.ndim != 1:
            raise ValueError(f"item rows: targets {tuple(targets.shape)} and sources {tuple(sources.shape)}")
        if not len(targets):
            return 0
        weight = self.table.weight
        started, slot = torch.unique(targets.to(weight.device), return_inverse=True)
        sums = torch.zeros(len(started), self.dim, dtype=torch.float32, device=weight.device)
        for at in range(0, len(targets), chunk):
            rows = weight[sources[at : at + chunk].to(weight.device)].float()
            sums.index_add_(0, slot[at : at + chunk], rows)
        counts = torch.bincount(slot, minlength=len(started)).to(sums)
        weight[started] = (sums / counts[:, None]).to(weight.dtype)
        return len(started)

    @torch.no_grad()
    def init_normal(self, std: float) -> None:
        """Draw every id row (and feature row) from ``N(0, std²)``; the padding row stays 0."""
        self._std = std
        nn.init.normal_(self.table.weight, std=std)
        self.table.weight[0].zero_()
        if self.features is not None:
            self.features.init_normal(std)

    def forward(self, seq: Tensor, lengths: Tensor) -> Tensor:
        """``seq [B, L]`` ids, ``lengths [B]`` -> ``[B, L, d]``, zero at padded positions."""
        if self._rows is None:
            h = self._represent(self.table(seq).flatten(0, -2), seq.flatten()).view(*seq.shape, -1)
        else:  # a step's gathered rows, ``seq`` their positions
            ids = None if self._row_ids is None else self._row_ids[seq].flatten()
            h = self._represent(F.embedding(seq, self._rows).flatten(0, -2), ids).view(*seq.shape, -1)
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

    def _take_over(self, table: ItemTable) -> None:
        """Start as a table holding ``table``'s rows and features (the same tensors): the first
        thing another form's constructor does, instead of drawing rows of its own."""
        nn.Module.__init__(self)
        self.table, self.features, self.id_dropout = table.table, table.features, table.id_dropout
        self.cold_rows, self.cold_scale, self._cold = table.cold_rows, table.cold_scale, None
        self.register_buffer("warm", table.warm, persistent=False)
        self._std, self._rows, self._row_ids = table._std, None, None

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


def find_item_table(model: nn.Module) -> tuple[ItemTable, str] | None:
    """The item table inside ``model`` and the prefix of its entries in ``model.state_dict()``, or
    None for a model without one (MostPopular)."""
    for name, module in model.named_modules():
        if isinstance(module, ItemTable):
            return module, f"{name}."
    return None


def new_items(model: nn.Module) -> Tensor | None:
    """``[num_items]`` bool: the items ``model`` retrieves by their features alone (no training
    click: the new items of a feature file), or None for a model without item features or where
    every item has clicks. Row 0 (padding) is never one."""
    found = find_item_table(model)
    table = found[0] if found is not None else None
    if table is None or table.features is None or table.warm is None:
        return None
    mask = ~table.warm.detach()
    mask[0] = False
    return mask if bool(mask.any()) else None
