"""ComiRec's preprocessing (``THUDM/ComiRec`` ``preprocess/data.py`` and ``category.py``),
reproduced rule by rule and vectorised, for Amazon Books and Taobao UserBehavior.

The rules, in ComiRec's order (``data/README.md`` lists them with the differences):

1. Clicks: Books: every review in ``reviews_Books_5.json`` (``reviewerID``, ``asin``,
   ``unixReviewTime``); Taobao: the ``pv`` rows of ``UserBehavior.csv`` (``user, item,
   category, behavior, timestamp``). Repeated clicks on an item are kept.
2. Items with ``filter_size`` (5) or more clicks are kept, counted over all clicks. Item ids
   1..N go by falling count; equal counts keep the order of first appearance in the file.
3. Users with ``filter_size`` or more clicks on kept items are kept (one pass, not a k-core:
   an item may end below 5 clicks once users are dropped).
4. The kept users, in order of first appearance, are shuffled by Python's ``random`` seeded
   with 1230; a user's id is its shuffled position, the first 80% are the train users, the
   next 10% valid, the rest test.
5. Each user's clicks on kept items are sorted by timestamp (stable: equal times keep file
   order) and written as ``user_id,item_id,position`` (position 0, 1, ... in time order) to
   ``<name>_train.txt`` / ``_valid.txt`` / ``_test.txt``, users in id order.
6. Categories: Books: the last level of the first category path of each item's
   ``meta_Books.json`` record; Taobao: the ``category`` field of its ``pv`` rows. Category
   ids 1.. go by first appearance among kept items; an item seen with several categories
   keeps the last one. ``<name>_item_cate.txt`` lists ``item_id,cate_id`` in order of the
   item's first appearance; the id maps go to ``<name>_user_map.txt``, ``_item_map.txt``,
   ``_cate_map.txt`` (``raw,id``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from recsys.data.prepare import filter_counts

FILTER_SIZE = 5
SEED = 1230
SPLITS = (("train", 0.0, 0.8), ("valid", 0.8, 0.9), ("test", 0.9, 1.0))


@dataclass
class ComirecData:
    """ComiRec's prepared dataset.

    user_raw ``[U]``: raw user id of ComiRec user id ``u`` (0-based, shuffled order).
    item_raw ``[I]``: raw item id of ComiRec item id ``i + 1``.
    clicks: DataFrame ``[n]`` with int64 ``user``, ``item``, ``position``, sorted by user then
    position (the concatenation of the train, valid and test files).
    """

    user_raw: np.ndarray
    item_raw: np.ndarray
    clicks: pd.DataFrame

    def split_users(self) -> dict[str, tuple[int, int]]:
        """``{"train": (first user id, end user id), ...}`` (ComiRec's ``int(n * 0.8)`` cuts)."""
        n = len(self.user_raw)
        return {part: (int(n * lo), int(n * hi) if hi < 1 else n) for part, lo, hi in SPLITS}


def comirec_filter(
    users: np.ndarray, items: np.ndarray, times: np.ndarray, filter_size: int = FILTER_SIZE, seed: int = SEED
) -> ComirecData:
    """Rules 2-5 on the clicks ``users [n]``, ``items [n]`` (raw ids), ``times [n]`` (numbers),
    given in file order."""
    item_codes, item_uniques = pd.factorize(items)  # codes follow first appearance
    user_codes, user_uniques = pd.factorize(users)
    counts = np.bincount(item_codes, minlength=len(item_uniques))
    by_count = np.argsort(-counts, kind="stable")  # Python's stable sort by falling count
    kept_items = by_count[counts[by_count] >= filter_size]
    item_id = np.zeros(len(item_uniques), dtype=np.int64)
    item_id[kept_items] = np.arange(1, len(kept_items) + 1)

    keep = filter_counts(user_codes, item_codes, filter_size, filter_size, kcore=False)
    kept_users = np.flatnonzero(np.bincount(user_codes[keep], minlength=len(user_uniques)))  # first-appearance order
    permutation = list(range(len(kept_users)))
    random.Random(seed).shuffle(permutation)  # the same swaps as ComiRec's shuffle of its user list
    shuffled = kept_users[permutation]
    user_id = np.full(len(user_uniques), -1, dtype=np.int64)
    user_id[shuffled] = np.arange(len(shuffled))

    rows = np.flatnonzero(keep)
    u, i, t = user_id[user_codes[rows]], item_id[item_codes[rows]], np.asarray(times, dtype=np.float64)[rows]
    order = np.lexsort((t, u))  # by user, then time; lexsort is stable, so ties keep file order
    u, i = u[order], i[order]
    starts = np.searchsorted(u, u, side="left")
    clicks = pd.DataFrame({"user": u, "item": i, "position": np.arange(len(u)) - starts})
    return ComirecData(
        user_raw=np.asarray(user_uniques[shuffled]).astype(str),
        item_raw=np.asarray(item_uniques[kept_items]).astype(str),
        clicks=clicks,
    )


def comirec_categories(items: np.ndarray, categories: np.ndarray, item_raw: np.ndarray) -> tuple[np.ndarray, pd.Series]:
    """Rule 6 on ``(item, category)`` pairs ``items [n]``, ``categories [n]`` in file order.

    Returns ``(category_raw [C], item_cate)``: ``category_raw[c - 1]`` is the raw name of
    category id ``c``; ``item_cate`` maps ComiRec item id -> category id, in ComiRec's order.
    """
    item_id = pd.Series(np.arange(1, len(item_raw) + 1), index=pd.Index(item_raw))
    ids = pd.Series(np.asarray(items).astype(str)).map(item_id)
    kept = ids.notna().to_numpy()
    cate_codes, cate_uniques = pd.factorize(np.asarray(categories)[kept])
    last = pd.Series(cate_codes + 1).groupby(ids[kept].astype(np.int64).to_numpy(), sort=False).last()
    return np.asarray(cate_uniques).astype(str), last.astype(np.int64)


def write_comirec(
    data: ComirecData, category_raw: np.ndarray, item_cate: pd.Series, folder: Path, maps: Path, name: str
) -> dict[str, int]:
    """Write ComiRec's files: ``folder/<name>_{train,valid,test,item_cate}.txt`` (what
    ``data.format = "comirec"`` reads) and the three id maps to ``maps/``. Returns the counts."""
    folder.mkdir(parents=True, exist_ok=True)
    maps.mkdir(parents=True, exist_ok=True)
    bounds = data.split_users()
    for part, (lo, hi) in bounds.items():
        rows = data.clicks[(data.clicks["user"] >= lo) & (data.clicks["user"] < hi)]
        rows.to_csv(folder / f"{name}_{part}.txt", header=False, index=False)
    item_cate.rename_axis("item").reset_index().to_csv(folder / f"{name}_item_cate.txt", header=False, index=False)
    for kind, raw, start in (("user", data.user_raw, 0), ("item", data.item_raw, 1), ("cate", category_raw, 1)):
        pd.DataFrame({"raw": raw, "id": np.arange(start, start + len(raw))}).to_csv(
            maps / f"{name}_{kind}_map.txt", header=False, index=False
        )
    return {
        "users": len(data.user_raw),
        "items": len(data.item_raw),
        "clicks": len(data.clicks),
        "categories": len(category_raw),
        **{f"{part}_users": hi - lo for part, (lo, hi) in bounds.items()},
    }
