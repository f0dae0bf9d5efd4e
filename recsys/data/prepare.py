"""From a tidy click table to a :class:`Dataset`: filtering, id maps, time-ordered sequences.

Filtering follows ComiRec: drop items with fewer than ``min_item_count`` clicks, then users
with fewer than ``min_user_count`` clicks (``kcore=True`` repeats both until nothing changes).
Internal item ids start at 1 (0 is padding) and follow falling click count after filtering;
ties, and the order of users and categories, go by raw id (numerically when every id is a
non-negative integer, otherwise as text), so the result never depends on the row order.
Each user's clicks are sorted by time; equal times keep the source's row order.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from recsys.config import DataConfig
from recsys.data.features import FEATURES, ItemFeatures, read_item_features
from recsys.data.ids import canonical_id, factorize_ids, popularity_order, raw_order
from recsys.data.readers import DataError
from recsys.io.files import atomic_folder, link_or_copy, save_npy
from recsys.text import count

PAD = "<pad>"
UNKNOWN = "<unknown>"
_META = "dataset.json"  # written last: a folder without it is not a dataset
_FORMAT_VERSION = 2  # one NAME.npy per array
_NPZ = "dataset.npz"  # format 1 (every array in one archive), still read
_CLICK_ARRAYS = ("items", "times")  # one entry per click: memory-mapped
ARRAYS = ("item_raw", "user_raw", "indptr", "items", "times", "item_category", "category_raw", "item_counts")
HELD_OUT = "held_out"  # the array of the items held out of training (data.held_out_items), when there are any


class IdMap:
    """Raw ids <-> internal ids of one id space (items or users): the one place raw ids become
    internal ids after :func:`prepare` has numbered them.

    ``names[i]`` is the raw id (str) of internal id ``i``; ids below ``first`` are reserved
    (item id 0 is padding) and are never the answer for a raw id. The raw-id lookup is a dict,
    built on first use: a request of a few ids costs microseconds (pandas' indexer has ~80 us of
    fixed cost per call), and a million ids take about as long as pandas would.
    """

    def __init__(self, names: np.ndarray, *, first: int = 0, kind: str = "id") -> None:
        self.names = np.asarray(names)
        self.first = int(first)
        self.kind = kind  # "item" or "user": names the space in error messages
        self._index: dict[str, int] | None = None

    def __len__(self) -> int:
        """Size of the id space, reserved ids included."""
        return len(self.names)

    def lookup(self, raw: Iterable[object]) -> np.ndarray:
        """Raw ids (``str()`` of each) -> ``[n]`` int64 internal ids, ``-1`` where unknown."""
        index = self._table()
        return np.array([index.get(r, -1) for r in self._strings(raw)], dtype=np.int64)

    def encode(self, raw: Iterable[object]) -> tuple[np.ndarray, list[str]]:
        """Raw ids -> ``(ids [n_known] int64, unknown)``: the internal ids of the known raw ids
        in input order, and the unknown raw ids (as ``str``), also in input order."""
        index, ids, unknown = self._table(), [], []
        for r in self._strings(raw):
            i = index.get(r, -1)
            if i >= 0:
                ids.append(i)
            else:
                unknown.append(r)
        return np.array(ids, dtype=np.int64), unknown

    def require(self, raw: Iterable[object], what: str) -> np.ndarray:
        """:meth:`encode` for inputs that must all be known: ``[n]`` internal ids, or a
        ``ValueError`` naming ``what`` and the first unknown raw ids."""
        ids, unknown = self.encode(raw)
        if unknown:
            shown = ", ".join(repr(r) for r in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
            raise ValueError(f"{what}: {count(len(unknown), f'unknown {self.kind} id')}: {shown}")
        return ids

    def _table(self) -> dict[str, int]:
        """The raw id -> internal id dict, built on first use."""
        if self._index is None:
            self._index = {name: i for i, name in enumerate(self.names[self.first :].tolist(), self.first)}
        return self._index

    def _strings(self, raw: Iterable[object]) -> Iterable[str]:
        """Each raw id as :func:`~recsys.data.ids.canonical_id` reads it, lazily; a lone string is
        refused rather than split into characters."""
        if isinstance(raw, (str, bytes)):
            raise TypeError(f"expected a list of raw {self.kind} ids, got a single string")
        return (canonical_id(r) for r in raw)

    def decode(self, ids: np.ndarray) -> np.ndarray:
        """Internal ids ``[...]`` (each in ``first..len - 1``) -> raw ids (str), same shape."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < self.first or ids.max() >= len(self.names)):
            bad = ids[(ids < self.first) | (ids >= len(self.names))][0]
            raise ValueError(f"{self.kind} id {bad} is outside {self.first}..{len(self.names) - 1}")
        return self.names[ids]


@dataclass(eq=False)
class Dataset:
    """Prepared click sequences in CSR layout (user ``u``'s clicks are
    ``items[indptr[u]:indptr[u + 1]]``, oldest first).

    A loaded dataset's clicks (``items``, ``times``) are read-only memory maps of its files
    (:meth:`load`): a log larger than memory is paged in as it is read, never loaded whole.

    Arrays:
        item_raw ``[num_items]`` str: raw item id of each internal id (``[0] = "<pad>"``).
        user_raw ``[num_users]`` str: raw user id of each user index.
        indptr ``[num_users + 1]`` int64, items ``[nnz]`` int64 (internal ids >= 1).
        times ``[nnz]`` float64 click times, or ``None`` when the source only had positions.
        item_category ``[num_items]`` int64: category id per item (0 = unknown; ``[0] = 0``).
        category_raw ``[num_categories]`` str: raw category names (``[0] = "<unknown>"``).
        item_counts ``[num_items]`` int64: clicks per item after filtering (``[0] = 0``).

    ``features``: the items' attributes and vectors (``data.item_features``,
    :class:`~recsys.data.features.ItemFeatures`), rows in internal id order and new items (listed
    by the feature file, absent from the clicks) after ``num_items - 1``; saved in ``features/``.

    ``held_out`` ``[h]`` int64: the sorted item ids whose clicks the split keeps out of training
    (``data.held_out_items``, :func:`~recsys.data.split.read_held_out`), or ``None``; saved as
    ``held_out.npy``, so a run's split is the same wherever it is loaded. Set on the dataset a run
    trains on, never on the prepared-data cache (which any held-out set shares).
    """

    item_raw: np.ndarray
    user_raw: np.ndarray
    indptr: np.ndarray
    items: np.ndarray
    times: np.ndarray | None
    item_category: np.ndarray
    category_raw: np.ndarray
    item_counts: np.ndarray
    source: str = ""
    features: ItemFeatures | None = None
    held_out: np.ndarray | None = None

    @property
    def num_items(self) -> int:
        """Size of the item id space, padding included (real items are ``1..num_items-1``)."""
        return len(self.item_raw)

    @property
    def catalogue_size(self) -> int:
        """Item ids a model of this dataset retrieves: the clicked items' (``num_items``) and, with
        item features, the feature file's new items' after them (``num_items..catalogue_size-1``)."""
        return self.num_items + (self.features.num_new if self.features is not None else 0)

    @cached_property
    def catalogue_raw(self) -> np.ndarray:
        """``[catalogue_size]`` str: the raw id of every item id, new items included."""
        if self.features is None or not self.features.num_new:
            return self.item_raw
        return np.concatenate([np.asarray(self.item_raw, dtype=str), np.asarray(self.features.new_raw, dtype=str)])

    @cached_property
    def catalogue_category(self) -> np.ndarray:
        """``[catalogue_size]`` int64 category ids, 0 (unknown) for new items."""
        extra = self.catalogue_size - self.num_items
        return np.concatenate([self.item_category, np.zeros(extra, dtype=np.int64)]) if extra else self.item_category

    def with_new_items(self, rows: ItemFeatures) -> Dataset:
        """This dataset with the new items of ``rows`` (a block of rows,
        :func:`~recsys.data.features.new_items`) after its catalogue: ids ``catalogue_size..``, in
        :attr:`catalogue_raw` and :attr:`item_map` from then on; the clicks do not change."""
        if self.features is None:
            raise ValueError("a dataset without item features cannot take new items")
        return dataclasses.replace(self, features=self.features.appended(rows))

    @property
    def num_users(self) -> int:
        return len(self.user_raw)

    @property
    def num_categories(self) -> int:
        """Size of the category id space, ``0 = unknown`` included."""
        return len(self.category_raw)

    @property
    def lengths(self) -> np.ndarray:
        """``[num_users]`` int64 clicks per user."""
        return np.diff(self.indptr)

    def tied_share(self, block: int = 1 << 24) -> float:
        """Share of a user's consecutive clicks (pairs) with equal timestamps, 0 without times.

        The data does not order such a pair: the file's row order does, so "the next click" is
        partly arbitrary there (51% of MovieLens 100K's pairs, rated in bursts; 44% of Amazon
        Beauty's, stamped by the day). The automatic ``train.predict_next`` reads it
        (:func:`recsys.run.settings.resolve`). Counted over blocks of ``block`` clicks,
        so memory stays bounded at a billion clicks.
        """
        times, n = self.times, len(self.items)
        if times is None or n < 2:
            return 0.0
        starts = np.unique(self.indptr[1:-1])
        starts = starts[(starts > 0) & (starts < n)]  # [S] a user's first click after another user's last
        tied = 0  # equal neighbours, then less those across users
        for lo in range(0, n - 1, block):
            hi = min(lo + block, n - 1)
            tied += int(np.count_nonzero(times[lo + 1 : hi + 1] == times[lo:hi]))
        tied -= int(np.count_nonzero(times[starts] == times[starts - 1]))
        pairs = n - 1 - len(starts)
        return tied / pairs if pairs else 0.0

    def distinct_pairs(self, block: int = 1 << 24) -> int:
        """Distinct (user, item) pairs: the filled cells of the user × item matrix, so a repeated
        click counts once (clicks / cells would exceed 1 for a user who clicks an item twice).
        Counted over blocks of about ``block`` clicks, whole users each, so memory stays bounded.
        A block's pairs come in runs (a user's clicks are together), which a stable sort (timsort)
        merges several times faster than ``np.unique`` sorts them (NumPy 2.4: 0.5 s against 24 s
        for 16M pairs)."""
        total, start = 0, 0
        while start < self.num_users:
            stop = max(start + 1, int(np.searchsorted(self.indptr, self.indptr[start] + block, side="right")) - 1)
            stop = min(stop, self.num_users)
            lo, hi = int(self.indptr[start]), int(self.indptr[stop])
            rows = np.repeat(np.arange(stop - start, dtype=np.int64), np.diff(self.indptr[start : stop + 1]))
            pairs = np.sort(rows * self.num_items + np.asarray(self.items[lo:hi], dtype=np.int64), kind="stable")
            total += int(len(pairs) > 0) + int(np.count_nonzero(pairs[1:] != pairs[:-1]))
            start = stop
        return total

    def stats(self) -> dict[str, float | int | bool | str]:
        """Counts for printing: users, items, interactions, lengths, categories, density."""
        lengths = self.lengths
        real_items = self.num_items - 1
        return {
            "source": self.source,
            "users": self.num_users,
            "items": real_items,
            "interactions": len(self.items),
            "mean_length": float(lengths.mean()) if len(lengths) else 0.0,
            "median_length": float(np.median(lengths)) if len(lengths) else 0.0,
            "max_length": int(lengths.max()) if len(lengths) else 0,
            "categories": self.num_categories - 1,
            "items_with_category": int(np.count_nonzero(self.item_category)),
            "density": self.distinct_pairs() / max(1, self.num_users * real_items),  # at most 1
            "timestamps": self.times is not None,
        }

    @cached_property
    def item_map(self) -> IdMap:
        """Raw item ids <-> internal item ids ``1..catalogue_size-1`` (0 is padding; new items included)."""
        return IdMap(self.catalogue_raw, first=1, kind="item")

    @cached_property
    def user_map(self) -> IdMap:
        """Raw user ids <-> user indices ``0..num_users-1``."""
        return IdMap(self.user_raw, kind="user")

    def save(self, directory: str | Path) -> None:
        """Write the dataset as the folder ``directory``: one ``NAME.npy`` per array (no pickles;
        an array memory-mapped from another saved dataset is hard-linked, or copied across file
        systems) and ``dataset.json`` (format, stats), published atomically (written beside it,
        then renamed into place)."""
        with atomic_folder(directory) as tmp:
            for name in ARRAYS:
                value = getattr(self, name)
                if value is None:
                    continue
                path = tmp / f"{name}.npy"
                if isinstance(value, np.memmap) and value.filename and Path(value.filename).name == path.name:
                    link_or_copy(Path(value.filename), path)
                else:
                    save_npy(path, value.astype(str) if value.dtype.kind in "OU" else value)
            if self.features is not None:
                self.features.save(tmp / FEATURES)
            if self.held_out is not None:
                save_npy(tmp / f"{HELD_OUT}.npy", self.held_out)
            self.write_meta(tmp)

    def write_meta(self, directory: Path) -> None:
        """Write ``dataset.json`` (format, stats) into ``directory``: the last file of a saved dataset."""
        meta = {"format_version": _FORMAT_VERSION, "stats": self.stats()}
        (directory / _META).write_text(json.dumps(meta, indent=2))

    @classmethod
    def load(cls, directory: str | Path) -> Dataset:
        """Read a dataset written by :meth:`save` (as :meth:`mapped`) or by the
        format-1 writer (``dataset.npz``, read into memory); inconsistent files raise
        :class:`DataError`."""
        directory = Path(directory)
        try:
            meta = json.loads((directory / _META).read_text())
            version = meta.get("format_version")
            if version == 1:
                with np.load(directory / _NPZ, allow_pickle=False) as npz:
                    arrays = {key: npz[key] for key in npz.files}
            elif version == _FORMAT_VERSION:
                return cls.mapped(directory, source=str(meta["stats"].get("source", "")))
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:  # missing, truncated, damaged
            raise DataError(f"{directory}: not a saved dataset, or a damaged one ({err})") from err
        if version != 1:
            raise DataError(f"{directory / _META}: unsupported format_version {version!r}")
        return cls._checked(directory, arrays, str(meta["stats"].get("source", "")))

    @classmethod
    def mapped(cls, directory: str | Path, *, source: str = "") -> Dataset:
        """The ``NAME.npy`` arrays of a saved dataset folder (whether or not its ``dataset.json`` is
        written yet): the clicks (``items``, ``times``) memory-mapped read-only, the arrays of one
        entry per item, user or category read into memory, and the item features when it has them."""
        directory = Path(directory)
        arrays = {
            name: _mapped(path) if name in _CLICK_ARRAYS else np.load(path, allow_pickle=False)
            for name in ARRAYS
            if (path := directory / f"{name}.npy").is_file()
        }
        features = ItemFeatures.load(directory / FEATURES) if (directory / FEATURES).is_dir() else None
        held = directory / f"{HELD_OUT}.npy"
        held_out = np.load(held, allow_pickle=False) if held.is_file() else None
        return cls._checked(directory, arrays, source, features, held_out)

    @classmethod
    def _checked(
        cls,
        directory: Path,
        arrays: dict[str, np.ndarray],
        source: str,
        features: ItemFeatures | None = None,
        held_out: np.ndarray | None = None,
    ) -> Dataset:
        try:
            ds = cls(
                **{name: arrays[name] for name in ARRAYS if name != "times"},
                times=arrays.get("times"),
                source=source,
                features=features,
                held_out=held_out,
            )
        except KeyError as err:
            raise DataError(f"{directory}: missing array {err}") from None
        ds.check(directory)
        return ds

    def check(self, where: str | Path = "dataset") -> None:
        """Raise :class:`DataError` (naming ``where``) unless the arrays fit together."""
        problems = []
        if self.indptr.ndim != 1 or len(self.indptr) != self.num_users + 1 or self.indptr[0] != 0:
            problems.append("indptr must be [num_users + 1] starting at 0")
        elif np.any(np.diff(self.indptr) < 0) or self.indptr[-1] != len(self.items):
            problems.append("indptr must be non-decreasing and end at len(items)")
        if len(self.items) and not 1 <= _min(self.items) <= _max(self.items) < self.num_items:
            problems.append("items must be in 1..num_items-1")
        if self.times is not None and len(self.times) != len(self.items):
            problems.append("times must have one entry per click")
        if len(self.item_category) != self.num_items or len(self.item_counts) != self.num_items:
            problems.append("item_category and item_counts must have num_items entries")
        elif self.item_category.min(initial=0) < 0 or self.item_category.max(initial=0) >= self.num_categories:
            problems.append("item_category must be in 0..num_categories-1")
        if self.features is not None and self.features.num_known != self.num_items:
            problems.append("item features must be aligned with num_items (features.num_known)")
        held = self.held_out
        if held is not None and (
            held.ndim != 1
            or np.any(held[1:] <= held[:-1])
            or (len(held) and not (held[0] >= 1 and held[-1] < self.catalogue_size))
        ):
            problems.append("held_out must be increasing item ids in 1..catalogue_size-1")
        if problems:
            raise DataError(f"{where}: " + "; ".join(problems))


def prepare(df: pd.DataFrame, cfg: DataConfig) -> Dataset:
    """Filter ``df`` (columns ``user``, ``item``, ``time``, optional ``category``; see
    :func:`recsys.data.readers.read_interactions`) and build the :class:`Dataset`.

    ``times`` is kept unless ``df.attrs["time_is_position"]`` is true. An item's category is
    the first non-missing one in row order. ``cfg.item_features`` is read and aligned with the
    kept items (:func:`~recsys.data.features.read_item_features`).
    """
    source = df.attrs.get("source") or "click table"  # errors name the file the clicks came from
    user_codes, user_raw, item_codes, item_raw, time = _coded_clicks(df, source)
    keep = _kept_rows(user_codes, item_codes, cfg, source)
    row_items = item_codes  # [n_rows], for the categories of items
    user_codes, item_codes, time = user_codes[keep], item_codes[keep], time[keep]

    clicks = np.bincount(item_codes, minlength=len(item_raw))
    item_order = _item_order(item_raw, clicks)
    user_order = _user_order(user_raw, user_codes)
    users = _renumbering(user_order, len(user_raw), first=0)[user_codes]
    items = _renumbering(item_order, len(item_raw), first=1)[item_codes]
    order = _time_order(users, time)
    indptr = np.zeros(len(user_order) + 1, dtype=np.int64)
    np.cumsum(np.bincount(users, minlength=len(user_order)), out=indptr[1:])
    item_counts = np.concatenate([[0], clicks[item_order]]).astype(np.int64)

    if "category" in df:
        item_category, category_raw = _categories(df["category"], row_items, item_order, item_counts)
    else:
        item_category, category_raw = np.zeros(len(item_counts), dtype=np.int64), np.array([UNKNOWN])
    kept_raw = np.concatenate([[PAD], item_raw[item_order]])
    return Dataset(
        item_raw=kept_raw,
        user_raw=user_raw[user_order],
        indptr=indptr,
        items=items[order],
        times=None if df.attrs.get("time_is_position", False) else time[order],
        item_category=item_category,
        category_raw=category_raw,
        item_counts=item_counts,
        source=str(df.attrs.get("source", "")),
        features=read_item_features(cfg, kept_raw),
    )


def _coded_clicks(df: pd.DataFrame, source: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows of ``df`` as ``(user_codes [n], user_raw [n_users], item_codes [n], item_raw [n_items],
    time [n])``: users and items numbered by the id rule of :mod:`recsys.data.ids` (a code indexes
    its raw id, as str), times as float64. A missing column, user, item or time raises
    :class:`DataError` naming ``source``."""
    missing = [col for col in ("user", "item", "time") if col not in df]
    if missing:
        raise DataError(f"{source}: lacks columns {missing} (has {list(df.columns)})")
    user_codes, user_uniques = factorize_ids(df["user"])  # the id rule: recsys.data.ids
    item_codes, item_uniques = factorize_ids(df["item"])
    time = df["time"].to_numpy(np.float64)
    for name, codes in (("user", user_codes), ("item", item_codes)):
        if (codes < 0).any():
            raise DataError(f"{source}: {count(int((codes < 0).sum()), 'row')} with a missing {name}")
    if not np.isfinite(time).all():
        raise DataError(f"{source}: {count(int((~np.isfinite(time)).sum()), 'row')} with a missing or infinite time")
    return user_codes, np.asarray(user_uniques, dtype=str), item_codes, np.asarray(item_uniques, dtype=str), time


def _kept_rows(user_codes: np.ndarray, item_codes: np.ndarray, cfg: DataConfig, source: str) -> np.ndarray:
    """Rows ``[n]`` (bool) that survive the filter of ``cfg`` (:func:`filter_counts`); a
    :class:`DataError` naming ``source`` and the filter where none does."""
    keep = filter_counts(user_codes, item_codes, cfg.min_item_count, cfg.min_user_count, cfg.kcore)
    if not keep.any():
        raise DataError(
            f"{source}: no clicks left after filtering (data.min_item_count={cfg.min_item_count}, "
            f"data.min_user_count={cfg.min_user_count}, data.kcore={cfg.kcore})"
        )
    return keep


def _item_order(item_raw: np.ndarray, clicks: np.ndarray) -> np.ndarray:
    """The codes of the items with clicks (``clicks [n_items]``, after filtering) in internal id
    order: falling clicks, ties by raw id."""
    kept_items = np.flatnonzero(clicks)
    return kept_items[popularity_order(item_raw[kept_items], clicks[kept_items])]


def _user_order(user_raw: np.ndarray, user_codes: np.ndarray) -> np.ndarray:
    """The codes of the users with clicks (``user_codes [n]``, after filtering) in internal id
    order: by raw id."""
    kept_users = np.flatnonzero(np.bincount(user_codes, minlength=len(user_raw)))
    return kept_users[raw_order(user_raw[kept_users])]


def _renumbering(order: np.ndarray, size: int, first: int) -> np.ndarray:
    """``[size]`` int64: the new id of each of ``size`` codes, ``first, first + 1, ...`` along
    ``order`` (the kept codes); 0 for a code that is not kept."""
    new = np.zeros(size, dtype=np.int64)
    new[order] = np.arange(first, len(order) + first)
    return new


def _time_order(users: np.ndarray, time: np.ndarray) -> np.ndarray:
    """Permutation ``[n]`` sorting clicks by user, then time; equal times keep row order."""
    same_user = users[1:] == users[:-1]
    if np.all(users[1:] >= users[:-1]) and np.all(time[1:][same_user] >= time[:-1][same_user]):
        return np.arange(len(users))  # already in order (the common case for click logs)
    by_time = np.argsort(time, kind="stable")
    return by_time[np.argsort(users[by_time], kind="stable")]


def filter_counts(
    user_codes: np.ndarray, item_codes: np.ndarray, min_item_count: int, min_user_count: int, kcore: bool
) -> np.ndarray:
    """Rows ``[n]`` (bool) that survive ComiRec's filter: items with >= ``min_item_count``
    clicks, then users with >= ``min_user_count`` of the remaining clicks; with ``kcore``
    both repeat until a full pass removes nothing."""
    keep = np.ones(len(user_codes), dtype=bool)
    while True:
        before = int(keep.sum())
        keep &= np.bincount(item_codes[keep], minlength=item_codes.max(initial=-1) + 1)[item_codes] >= min_item_count
        keep &= np.bincount(user_codes[keep], minlength=user_codes.max(initial=-1) + 1)[user_codes] >= min_user_count
        if not kcore or int(keep.sum()) == before:
            return keep


def _categories(
    category: pd.Series, item_codes: np.ndarray, item_order: np.ndarray, item_counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``item_category [num_items]`` and ``category_raw [num_categories]`` for the kept items.

    ``category [n_rows]`` and ``item_codes [n_rows]`` (factorized raw items) cover every row
    before filtering; ``item_order`` holds the codes of the kept items in internal id order.
    Category ids follow falling clicks, ties by raw name.
    """
    cat_codes, cat_uniques = pd.factorize(category)
    labelled = np.flatnonzero(cat_codes >= 0)
    first = pd.Series(item_codes[labelled]).drop_duplicates(keep="first")  # index: position in labelled
    cat_of_code = np.full(item_codes.max(initial=-1) + 1, -1, dtype=np.int64)
    cat_of_code[first.to_numpy()] = cat_codes[labelled[first.index.to_numpy()]]
    return category_ids(cat_of_code[item_order], np.asarray(cat_uniques, dtype=str), item_counts)


def category_ids(
    cat_of_item: np.ndarray, cat_raw: np.ndarray, item_counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``item_category [num_items]`` and ``category_raw [num_categories]`` from each kept item's
    category: ``cat_of_item [num_items - 1]`` (internal id order; an index into ``cat_raw``, -1 =
    unknown) and ``item_counts [num_items]``. Category ids follow falling clicks, ties by raw name;
    a category no kept item has gets none."""
    known = cat_of_item >= 0
    cat_clicks = np.bincount(cat_of_item[known], weights=item_counts[1:][known], minlength=len(cat_raw))
    used = np.flatnonzero(np.bincount(cat_of_item[known], minlength=len(cat_raw)))
    cat_order = used[popularity_order(cat_raw[used], cat_clicks[used])]
    new_cat = np.zeros(len(cat_raw) + 1, dtype=np.int64)  # last slot: unknown (-1)
    new_cat[cat_order] = np.arange(1, len(cat_order) + 1)
    item_category = np.concatenate([[0], new_cat[cat_of_item]]).astype(np.int64)
    return item_category, np.concatenate([[UNKNOWN], cat_raw[cat_order]])


def _min(values: np.ndarray) -> int:
    return min(int(block.min()) for block in _blocks(values))


def _max(values: np.ndarray) -> int:
    return max(int(block.max()) for block in _blocks(values))


def _blocks(values: np.ndarray, size: int = 1 << 22) -> Iterator[np.ndarray]:
    """A 1-D array in blocks of ``size``; a memory-mapped one read through its file, so a check
    of every value does not map the whole file into this process (mapped pages count as its
    resident memory)."""
    if not (isinstance(values, np.memmap) and values.filename and isinstance(values.base, mmap.mmap)):  # not a view
        yield values
        return
    with open(values.filename, "rb") as f:
        f.seek(values.offset)
        for start in range(0, len(values), size):
            yield np.fromfile(f, dtype=values.dtype, count=min(size, len(values) - start))


def _mapped(path: Path) -> np.ndarray:
    """A saved array memory-mapped read-only (an empty one, which cannot be mapped, read)."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError:
        return np.load(path, allow_pickle=False)
