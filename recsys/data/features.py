"""Item features (``data.item_features``) aligned with the dataset's internal item ids.

The file (formats and errors: :mod:`recsys.data.feature_readers`) lists items by raw id. Its rows
become :class:`ItemFeatures` rows of internal ids:

- an item of the prepared clicks keeps its id (``1..num_known - 1``; 0 is padding);
- an item the prepared clicks lack (never clicked, or filtered out) is a **new item**: the new
  items take the ids ``num_known..num_items - 1``, after every clicked item, in raw-id order
  (:func:`~recsys.data.ids.raw_order`: numerically when every id is a non-negative integer, else
  as text), so their ids depend on the file's items, not on its row order, and the clicked ids
  never move. Their raw ids are :attr:`ItemFeatures.new_raw`, saved with the dataset, so the item
  table can grow by them and serving can name them (``dataset.item_raw`` then ``new_raw``);
- an item without a row in the file has no values and no vector.

A saved run takes **more new items** later without retraining (:func:`new_items`, used by
``recsys index RUN --item-features FILE``): the items of a newer file that its catalogue lacks,
with their values looked up in the run's trained vocabularies, become rows appended after its
catalogue (:meth:`ItemFeatures.appended`), numbered in raw-id order as above.

Each attribute field numbers its values ``1..vocab_size - 1`` by falling count of the items that
have them, ties by value (the rule of categories: :func:`~recsys.data.ids.popularity_order`);
0 is no value. An item's values are a CSR row (``indptr``, ``indices``), not a padded
``[num_items, max_values]`` array: value counts vary (1 to 6 attributes an item on amazon-beauty,
1 to 6 genres on MovieLens, thousands for a tag field's head items) and ``torch.nn.EmbeddingBag``
takes exactly this layout (``input = indices``, ``offsets = indptr[:-1]``); a value repeated
within one item counts once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from recsys.config import DataConfig
from recsys.data.errors import DataError
from recsys.data.feature_readers import RawFeatures, read_feature_file
from recsys.data.ids import canonical_ids, factorize_ids, popularity_order, raw_order
from recsys.io.files import save_npy
from recsys.text import count

__all__ = [
    "FEATURES",
    "FeatureField",
    "ItemFeatures",
    "NewItems",
    "align_features",
    "new_items",
    "read_item_features",
]

FEATURES = "features"  # the folder of a saved dataset that holds its item features
NONE = "<none>"  # the raw value of value id 0
_META = "features.json"
_FORMAT_VERSION = 1


@dataclass(frozen=True, eq=False)
class FeatureField:
    """One categorical attribute (a brand, a category level, genres), single- or multi-valued.

    vocab ``[vocab_size]`` str: the raw value of each value id (``vocab[0] = "<none>"``).
    indptr ``[num_items + 1]`` int64, indices ``[nnz]`` int64: item ``i``'s value ids are
    ``indices[indptr[i]:indptr[i + 1]]`` (each in ``1..vocab_size - 1``, in file order).
    """

    name: str
    vocab: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray

    @property
    def vocab_size(self) -> int:
        """Size of the value id space, ``0 = none`` included (an embedding table's rows)."""
        return len(self.vocab)

    def values_of(self, item: int) -> np.ndarray:
        """``[k]`` str: the raw values of internal item id ``item``."""
        return self.vocab[self.indices[self.indptr[item] : self.indptr[item + 1]]]


@dataclass(eq=False)
class ItemFeatures:
    """Item features in internal item id order, new items included (see the module docstring).

    fields: the categorical attributes, in the file's column (JSON: first-seen field) order.
    dense ``[num_items, D]`` float32 (zeros where ``dense_mask`` is false) and dense_mask
    ``[num_items]`` bool, or both ``None`` without ``data.feature_vector_col``.
    num_known: the dataset's ``num_items`` (padding and the clicked items: ids ``0..num_known - 1``);
    0 for a block of new items' rows to append (:func:`new_items`, :meth:`appended`), whose row 0 is
    its first item.
    new_raw ``[num_new]`` str: the raw id of each new item, ids ``num_known..num_items - 1``.
    source: the file read.
    """

    fields: list[FeatureField]
    dense: np.ndarray | None
    dense_mask: np.ndarray | None
    num_known: int
    new_raw: np.ndarray
    source: str = ""

    @property
    def num_items(self) -> int:
        """Rows of every field and of ``dense``: the clicked items, padding and the new items."""
        return self.num_known + len(self.new_raw)

    @property
    def num_new(self) -> int:
        return len(self.new_raw)

    @property
    def dim(self) -> int:
        """``D``, the width of the dense vectors (0 without them)."""
        return 0 if self.dense is None else int(self.dense.shape[1])

    def covered(self) -> np.ndarray:
        """``[num_items]`` bool: items with at least one value or a vector."""
        has = np.zeros(self.num_items, dtype=bool)
        for f in self.fields:
            has |= np.diff(f.indptr) > 0
        return has if self.dense_mask is None else has | self.dense_mask

    def summary(self) -> str:
        """One line for ``recsys data``: fields and their values, vectors, items covered, new items."""
        fields = ", ".join(f"{f.name} {count(f.vocab_size - 1, 'value')}" for f in self.fields)
        parts = [f"{count(len(self.fields), 'field')} ({fields})" if self.fields else "no fields"]
        if self.dense_mask is not None:
            parts.append(f"{self.dim}-d vectors on {int(self.dense_mask.sum()):,} items")
        known = int(self.covered()[1 : self.num_known].sum())
        parts.append(f"{known:,} of {self.num_known - 1:,} clicked items covered, {count(self.num_new, 'new item')}")
        return "; ".join(parts)

    def appended(self, rows: ItemFeatures) -> ItemFeatures:
        """These features with the items of ``rows`` appended as new items after the current ones
        (ids ``num_items..num_items + rows.num_new - 1``; nothing before them moves).

        ``rows`` is a block of new items' rows (:func:`new_items`): ``num_known = 0``, one row per
        item of ``rows.new_raw``, in these fields' value ids (the same fields and vocabularies) and
        with vectors of this width. Anything else raises :class:`DataError`."""
        same = (
            rows.num_known == 0
            and [f.name for f in rows.fields] == [f.name for f in self.fields]
            and all(np.array_equal(r.vocab, f.vocab) for r, f in zip(rows.fields, self.fields))
            and (rows.dense is None) == (self.dense is None)
            and rows.dim == self.dim
        )
        if not same:
            raise DataError(
                f"{rows.source or 'added items'}: not rows of these item features (other fields, vocabularies "
                f"or vector width than {self.source or 'the dataset'}'s)"
            )
        fields = [
            FeatureField(
                f.name,
                f.vocab,
                np.concatenate([f.indptr, r.indptr[1:] + f.indptr[-1]]),
                np.concatenate([f.indices, r.indices]),
            )
            for f, r in zip(self.fields, rows.fields)
        ]
        dense = dense_mask = None
        if self.dense is not None and self.dense_mask is not None and rows.dense is not None:
            dense = np.concatenate([self.dense, rows.dense])
            dense_mask = np.concatenate([self.dense_mask, np.asarray(rows.dense_mask, dtype=bool)])
        new_raw = np.concatenate([np.asarray(self.new_raw, dtype=str), np.asarray(rows.new_raw, dtype=str)])
        return ItemFeatures(fields, dense, dense_mask, self.num_known, new_raw, self.source)

    def save(self, directory: str | Path) -> None:
        """Write the features as the folder ``directory`` (``features.json`` and ``.npy`` arrays, no
        pickles); a saved dataset keeps them in its ``features/`` folder."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for i, f in enumerate(self.fields):
            save_npy(directory / f"field{i}_vocab.npy", f.vocab.astype(str))
            save_npy(directory / f"field{i}_indptr.npy", f.indptr)
            save_npy(directory / f"field{i}_indices.npy", f.indices)
        save_npy(directory / "new_raw.npy", self.new_raw.astype(str))
        if self.dense is not None and self.dense_mask is not None:
            save_npy(directory / "dense.npy", self.dense)
            save_npy(directory / "dense_mask.npy", self.dense_mask)
        meta = {
            "format_version": _FORMAT_VERSION,
            "source": self.source,
            "num_known": self.num_known,
            "fields": [f.name for f in self.fields],
            "dense": self.dense is not None,
        }
        (directory / _META).write_text(json.dumps(meta, indent=2))

    @classmethod
    def load(cls, directory: str | Path) -> ItemFeatures:
        """Read features written by :meth:`save`; missing or inconsistent files raise :class:`DataError`."""
        directory = Path(directory)
        try:
            meta = json.loads((directory / _META).read_text())
            if meta.get("format_version") != _FORMAT_VERSION:
                raise DataError(f"{directory / _META}: unsupported format_version {meta.get('format_version')!r}")

            def array(name: str) -> np.ndarray:
                return np.load(directory / f"{name}.npy", allow_pickle=False)

            fields = [
                FeatureField(name, array(f"field{i}_vocab"), array(f"field{i}_indptr"), array(f"field{i}_indices"))
                for i, name in enumerate(meta["fields"])
            ]
            features = cls(
                fields,
                array("dense") if meta["dense"] else None,
                array("dense_mask") if meta["dense"] else None,
                int(meta["num_known"]),
                array("new_raw"),
                str(meta["source"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as err:  # missing, truncated, damaged
            raise DataError(f"{directory}: not saved item features, or damaged ones ({err})") from err
        features.check(directory)
        return features

    def check(self, where: str | Path = "item features") -> None:
        """Raise :class:`DataError` (naming ``where``) unless the arrays fit together."""
        n, problems = self.num_items, []
        for f in self.fields:
            if len(f.indptr) != n + 1 or f.indptr[0] != 0 or np.any(np.diff(f.indptr) < 0):
                problems.append(f"field {f.name!r}: indptr must be [num_items + 1], non-decreasing from 0")
            elif f.indptr[-1] != len(f.indices) or (
                len(f.indices) and not 1 <= f.indices.min() <= f.indices.max() < f.vocab_size
            ):
                problems.append(f"field {f.name!r}: indices must be indptr[-1] value ids in 1..vocab_size - 1")
        if self.dense is not None and (
            self.dense.shape[0] != n or self.dense_mask is None or self.dense_mask.shape != (n,)
        ):
            problems.append("dense and dense_mask must have num_items rows")
        if problems:
            raise DataError(f"{where}: " + "; ".join(problems))


def read_item_features(cfg: DataConfig, item_raw: np.ndarray) -> ItemFeatures | None:
    """The features of ``cfg.item_features`` aligned with a dataset's ``item_raw [num_items]``
    (``[0]`` padding), or ``None`` without the setting."""
    return align_features(read_feature_file(cfg), item_raw) if cfg.item_features else None


def align_features(raw: RawFeatures, item_raw: np.ndarray) -> ItemFeatures:
    """``raw``'s rows as internal item ids of the dataset whose raw ids are ``item_raw
    [num_known]`` (``[0]`` padding, never matched), new items numbered after them."""
    num_known = len(item_raw)
    known = pd.Index(np.asarray(item_raw[1:], dtype=str)).get_indexer(raw.items)  # [n], -1: a new item
    new = np.flatnonzero(known < 0)
    new = new[raw_order(raw.items[new])]
    ids = known + 1  # [n] the internal id of each row
    ids[new] = np.arange(num_known, num_known + len(new))
    num_items = num_known + len(new)
    fields = [_field(name, ids[rows], values, num_items) for name, (rows, values) in raw.fields.items()]
    dense = dense_mask = None
    if raw.vectors is not None and raw.has_vector is not None:
        dense = np.zeros((num_items, raw.vectors.shape[1]), dtype=np.float32)
        dense[ids] = raw.vectors
        dense_mask = np.zeros(num_items, dtype=bool)
        dense_mask[ids] = raw.has_vector
    return ItemFeatures(fields, dense, dense_mask, num_known, raw.items[new], str(raw.path))


def _field(name: str, items: np.ndarray, values: np.ndarray, num_items: int) -> FeatureField:
    """One field from its ``(items [nnz] internal ids, values [nnz] raw text)`` pairs."""
    codes, uniques = factorize_ids(pd.Series(values, dtype="str"))  # values are read under the id rule too
    pairs = pd.DataFrame({"item": items, "code": codes}).drop_duplicates()  # a value repeated in one item: once
    items, codes = pairs["item"].to_numpy(np.int64), pairs["code"].to_numpy(np.int64)
    order = popularity_order(uniques, np.bincount(codes, minlength=len(uniques)))
    value_id = np.empty(len(uniques), dtype=np.int64)
    value_id[order] = np.arange(1, len(uniques) + 1)
    by_item = np.argsort(items, kind="stable")  # file order within an item
    indptr = np.zeros(num_items + 1, dtype=np.int64)
    np.cumsum(np.bincount(items, minlength=num_items), out=indptr[1:])
    return FeatureField(name, np.concatenate([[NONE], uniques[order]]), indptr, value_id[codes[by_item]])


@dataclass(eq=False)
class NewItems:
    """What a feature file adds to a catalogue (:func:`new_items`).

    rows: the new items as a block of rows to append (:meth:`ItemFeatures.appended`):
    ``num_known = 0``, ``new_raw`` their raw ids in id order, fields in the catalogue's value ids.
    first: the id the first new item takes (the catalogue's size before them).
    known: items of the file the catalogue has already (their representation is kept: the file's
    values for them are not read).
    unknown_values: field -> distinct values of the new items that the vocabulary lacks (dropped:
    a value the run never saw has no trained row).
    ignored_fields: the file's fields that the catalogue's features lack (not read).
    missing_fields: the catalogue's fields that the file lacks (the new items have no values there).
    blank: new items with no known value and no vector: their feature part is a zero vector.
    """

    rows: ItemFeatures
    first: int
    known: int
    unknown_values: dict[str, int]
    ignored_fields: list[str]
    missing_fields: list[str]
    blank: int

    @property
    def num_new(self) -> int:
        return self.rows.num_new

    def describe(self) -> str:
        """One line: ``items.csv: 1,204 new items (ids 1,350..2,553); 37 of their values unknown to
        the run (brand 30, genre 7) contribute nothing; ...``."""
        source = self.rows.source
        if not self.num_new:
            return f"{source}: no new items (its {count(self.known, 'item')} are in the run already); nothing changed"
        last = self.first + self.num_new - 1
        parts = [f"{source}: {count(self.num_new, 'new item')} (ids {self.first:,}..{last:,})"]
        unknown = sum(self.unknown_values.values())
        if unknown:
            by_field = ", ".join(f"{name} {n:,}" for name, n in self.unknown_values.items() if n)
            parts.append(f"{unknown:,} of their values unknown to the run ({by_field}) contribute nothing")
        if self.blank:
            parts.append(f"{count(self.blank, 'new item')} with no value or vector the run knows (zero vectors)")
        if self.missing_fields:
            parts.append(f"no values for {', '.join(map(repr, self.missing_fields))}")
        if self.ignored_fields:
            parts.append(f"{', '.join(map(repr, self.ignored_fields))} not fields of the run: ignored")
        if self.known:
            parts.append(f"{count(self.known, 'item')} already in the run keep their representation")
        return "; ".join(parts)


def new_items(raw: RawFeatures, features: ItemFeatures, catalogue_raw: np.ndarray) -> NewItems:
    """The items of ``raw`` that the catalogue ``catalogue_raw [N]`` (raw ids, ``[0]`` padding;
    ``Dataset.catalogue_raw``) lacks, as rows to append to ``features`` (the catalogue's trained
    features): numbered from ``N`` in raw-id order, each value looked up in its field's vocabulary
    (a value it lacks is dropped and counted), vectors as read.

    Items the catalogue has keep their rows: the file's values for them are not read. A vector
    width other than ``features``' raises :class:`DataError` naming the file."""
    catalogue_raw = np.asarray(catalogue_raw, dtype=str)
    known = pd.Index(catalogue_raw[1:]).get_indexer(raw.items)  # [n] -1: a new item
    new = np.flatnonzero(known < 0)
    new = new[raw_order(raw.items[new])]
    row = np.full(len(raw.items), -1, dtype=np.int64)  # [n] each file row's row among the new items
    row[new] = np.arange(len(new))
    fields, unknown = [], {}
    for f in features.fields:
        rows, values = raw.fields.get(f.name, (np.empty(0, np.int64), np.empty(0, dtype=str)))
        mine = row[rows] >= 0
        field, unknown[f.name] = _in_vocabulary(f, row[rows][mine], values[mine], len(new))
        fields.append(field)
    dense = dense_mask = None
    if features.dense is not None:
        if raw.vectors is None or raw.has_vector is None:
            raise DataError(f"{raw.path}: no vectors, and the run's items have {features.dim}-d vectors")
        if raw.vectors.shape[1] != features.dim:
            raise DataError(
                f"{raw.path}: vectors of {raw.vectors.shape[1]} values; the run's projection was trained on "
                f"{features.dim}-d vectors"
            )
        dense, dense_mask = raw.vectors[new].astype(np.float32), raw.has_vector[new].astype(bool)
    block = ItemFeatures(fields, dense, dense_mask, 0, raw.items[new].astype(str), str(raw.path))
    names = [f.name for f in features.fields]
    return NewItems(
        rows=block,
        first=len(catalogue_raw),
        known=int((known >= 0).sum()),
        unknown_values=unknown,
        ignored_fields=[name for name in raw.fields if name not in names],
        missing_fields=[name for name in names if name not in raw.fields],
        blank=int(len(new) - block.covered().sum()),
    )


def _in_vocabulary(
    field: FeatureField, items: np.ndarray, values: np.ndarray, num_items: int
) -> tuple[FeatureField, int]:
    """``(items [nnz] rows of num_items new items, values [nnz] raw text)`` as a field in
    ``field``'s value ids (file order within an item, a repeated value once): the field, and how
    many distinct values its vocabulary lacks (dropped)."""
    values = canonical_ids(values)  # the id rule, as the vocabulary was read
    ids = pd.Index(field.vocab[1:]).get_indexer(values) + 1  # [nnz] 0: a value the run never saw
    unknown = len(np.unique(values[ids == 0]))
    pairs = pd.DataFrame({"item": items[ids > 0], "value": ids[ids > 0]}).drop_duplicates()
    items, ids = pairs["item"].to_numpy(np.int64), pairs["value"].to_numpy(np.int64)
    indptr = np.zeros(num_items + 1, dtype=np.int64)
    np.cumsum(np.bincount(items, minlength=num_items), out=indptr[1:])
    return FeatureField(field.name, field.vocab, indptr, ids[np.argsort(items, kind="stable")]), unknown
