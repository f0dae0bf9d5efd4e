"""The feature part of item representations (``data.item_features``): what an item is beside its id.

An item's representation is its id row plus the embeddings of its features:

    item(i) = warm(i) · row(i) + Σ_f mean_{v ∈ values_f(i)} E_f[v] + W · vector(i)

- ``E_f [vocab_f, d]``: one table per categorical field (brand, category levels, genres); an
  item's field vector is the mean of its values' rows (zero without values), so an item with
  many values is not louder than one with few.
- ``W [D, d]``: a linear map of the item's dense vector (text embeddings; zero where missing).
- ``warm(i)``: 1 for an item with training clicks, 0 for one without (a new item, in the
  feature file only, or one whose clicks all fall outside training): its id row never learned
  anything, so it is left out and the item is retrieved by its features alone
  (``model.cold_rows = "zero"``), or by its features plus the id row its attributes predict
  (``"attribute_mean"``: :meth:`FeatureEmbedding.attribute_means`); ``model.cold_scale`` scales
  such items for retrieval (:meth:`recsys.items.ItemTable.all`).

This sum is the simplest form that lets features carry what ids learn (every item sharing a
brand moves its brand row) and keeps an id model's capacity where clicks exist. Its rows are
ordinary parameters: the model's optimiser trains them in every form of the table.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from recsys.data.features import FeatureField, ItemFeatures

__all__ = ["FeatureEmbedding"]


def _padded(field: FeatureField) -> tuple[Tensor, Tensor]:
    """``(values [N, m] long, 0 past an item's values, 1 / count [N] float, 0 without values)``
    from the field's CSR rows (``m`` = the most values an item has, at least 1)."""
    counts = np.diff(field.indptr)  # [N]
    width = max(int(counts.max(initial=0)), 1)
    values = np.zeros((len(counts), width), dtype=np.int64)
    item = np.repeat(np.arange(len(counts)), counts)
    slot = np.arange(len(field.indices)) - np.repeat(field.indptr[:-1], counts)
    values[item, slot] = field.indices
    inverse = np.where(counts > 0, 1.0 / np.maximum(counts, 1), 0.0).astype(np.float32)
    return torch.from_numpy(values), torch.from_numpy(inverse)


class FeatureEmbedding(nn.Module):
    """``ids [...] -> [..., d]``: the sum of an item's field vectors and its projected dense vector
    (module docstring); zero for the padding id 0, which has no values and no vector.

    The value lists and vectors are buffers that are not saved with the weights: a saved run
    rebuilds them from its dataset's features, as it rebuilds the model from its config.
    """

    def __init__(self, features: ItemFeatures, dim: int):
        super().__init__()
        if not features.fields and features.dense is None:
            raise ValueError(f"item features of {features.source}: no attribute and no vector to embed")
        self.names = [f.name for f in features.fields]  # each field's name and its values' raw names,
        self.vocabs = [np.asarray(f.vocab, dtype=str) for f in features.fields]  # what a warm start matches
        self.fields = nn.ModuleList(nn.Embedding(f.vocab_size, dim, padding_idx=0) for f in features.fields)
        self.project: nn.Linear | None = None
        if features.dense is not None:
            self.project = nn.Linear(features.dense.shape[1], dim, bias=False)
        self.set_items(features)
        self.init_normal(1.0 / math.sqrt(dim))

    def set_items(self, features: ItemFeatures) -> None:
        """Read the items' value lists and vectors from ``features`` (buffers, on the module's
        device); the value rows and projection stay as they are, so ``features`` must have the same
        fields, vocabulary sizes and vector width (a catalogue grown by new items:
        :meth:`recsys.items.ItemTable.add_items`)."""
        tables = self._tables()
        if [f.vocab_size for f in features.fields] != [t.num_embeddings for t in tables] or (
            (features.dense is None) != (self.project is None)
            or (self.project is not None and features.dim != self.project.in_features)
        ):
            raise ValueError(f"item features of {features.source}: other fields or vector width than the model's")
        device = tables[0].weight.device if tables else cast(nn.Linear, self.project).weight.device
        for k, field in enumerate(features.fields):
            values, inverse = _padded(field)
            self.register_buffer(f"values_{k}", values.to(device), persistent=False)  # [N, m_k]
            self.register_buffer(f"inverse_{k}", inverse.to(device), persistent=False)  # [N]
        if features.dense is not None:
            vectors = torch.from_numpy(features.dense).to(device)
            self.register_buffer("vectors", vectors, persistent=False)  # [N, D]

    def _tables(self) -> list[nn.Embedding]:
        return [cast(nn.Embedding, table) for table in self.fields]

    @torch.no_grad()
    def init_normal(self, std: float) -> None:
        """Value rows ``N(0, std²)`` (the none row 0 stays 0); ``W`` so that a unit-variance vector
        maps to rows of that scale."""
        for table in self._tables():
            nn.init.normal_(table.weight, std=std)
            table.weight[0].zero_()
        if self.project is not None:
            nn.init.normal_(self.project.weight, std=std / math.sqrt(self.project.in_features))

    @torch.no_grad()
    def load_values(self, source: FeatureEmbedding) -> list[tuple[str, int, int]]:
        """Copy ``source``'s value rows into this embedding's by field name and raw value (a warm
        start: the same brand keeps its row under this run's value ids), and ``W`` where the
        vectors have the same width. Values ``source`` lacks keep their fresh rows.

        Returns ``(field, values copied, values here)`` for each field of this embedding, and
        ``("vectors", 1 or 0, 1)`` for ``W`` where this embedding maps vectors."""
        theirs = dict(zip(source.names, zip(source.vocabs, source._tables())))
        copied = []
        for name, vocab, table in zip(self.names, self.vocabs, self._tables()):
            found = 0
            if name in theirs:
                their_vocab, their_table = theirs[name]
                at = pd.Index(their_vocab[1:]).get_indexer(vocab[1:])  # value 0 (none) stays 0
                here = torch.from_numpy(np.flatnonzero(at >= 0) + 1)
                table.weight[here] = their_table.weight[torch.from_numpy(at[at >= 0] + 1)].to(table.weight)
                found = len(here)
            copied.append((name, found, len(vocab) - 1))
        if self.project is not None:  # the vectors' map, where the vectors are as wide (the same encoder, presumably)
            same = source.project is not None and source.project.weight.shape == self.project.weight.shape
            if same:
                self.project.weight.copy_(cast(nn.Linear, source.project).weight)
            copied.append(("vectors", int(same), 1))
        return copied

    def value_means(self, rows: Tensor, warm: Tensor) -> list[Tensor]:
        """``rows [N, d]`` id rows, ``warm [N]`` bool -> for each field, ``[vocab, d]``: the mean id row
        of the warm items having each value (zero for a value no warm item has). What
        :meth:`attribute_means` reads; a table keeps it (a few rows a value, not one a catalogue item)."""
        means = []
        for k, table in enumerate(self._tables()):
            values: Tensor = getattr(self, f"values_{k}")  # [N, m]
            pairs = (values > 0) & warm[:, None]  # [N, m] a warm item's value
            item = torch.arange(rows.shape[0], device=rows.device)[:, None].expand_as(values)[pairs]
            sums = rows.new_zeros(table.num_embeddings, rows.shape[1]).index_add_(0, values[pairs], rows[item])
            counts = torch.bincount(values[pairs], minlength=table.num_embeddings).to(rows.dtype)
            means.append(sums / counts.clamp_min(1)[:, None])
        return means

    def attribute_means(self, means: list[Tensor], ids: Tensor) -> Tensor:
        """``means`` (:meth:`value_means`), ``ids [R]`` -> ``[R, d]``: the id row each item's attributes
        predict, the mean over its fields (those where it has values) of the mean over its values of
        ``means``; zero for an item without categorical values (``means`` must hold a field).

        An item without clicks has no id row of its own; what the clicked items sharing its brand
        and categories learned in theirs is the best guess of it (the rows' mean given the
        attributes), and it puts the item on the clicked items' scale: its score is the expected
        score of a clicked item of its kind plus what its own feature part adds."""
        out: Tensor | None = None
        fields: Tensor | None = None  # [R] fields with values
        for k, field_means in enumerate(means):
            values: Tensor = getattr(self, f"values_{k}")[ids]  # [R, m]
            inverse: Tensor = getattr(self, f"inverse_{k}")[ids].to(field_means.dtype)  # [R]
            part = (field_means[values] * (values > 0)[..., None].to(field_means.dtype)).sum(1) * inverse[:, None]
            out = part if out is None else out + part
            has = (inverse > 0).to(field_means.dtype)
            fields = has if fields is None else fields + has
        assert out is not None and fields is not None, "attribute means need at least one categorical field"
        return out / fields.clamp_min(1)[:, None]

    def forward(self, ids: Tensor) -> Tensor:
        """``ids [...]`` long item ids (new items included) -> ``[..., d]``."""
        out: Tensor | None = None
        for k, table in enumerate(self._tables()):
            values: Tensor = getattr(self, f"values_{k}")[ids]  # [..., m]
            inverse: Tensor = getattr(self, f"inverse_{k}")[ids]  # [...]
            part = table(values).sum(-2) * inverse[..., None].to(table.weight.dtype)
            out = part if out is None else out + part
        if self.project is not None:
            vectors = cast(Tensor, self.vectors)
            part = self.project(vectors[ids].to(self.project.weight.dtype))
            out = part if out is None else out + part
        assert out is not None, "features without fields or vectors"
        return out
