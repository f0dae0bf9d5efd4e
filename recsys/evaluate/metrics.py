"""Top-N metrics of every protocol (ComiRec's, leave-one-out), vectorised over users.

Inputs: ``topn_ids [U, N]`` int, each user's recommendations best first (ids ``<= 0`` are
empty slots, e.g. the ``-1`` fill of a small catalogue; a repeated id counts once, at its
first rank), and the held-out truth as CSR: ``truth_indptr [U+1]``, ``truth_items [T]``
(each user's later clicks in order, duplicates kept; every user needs at least one).

Definitions (``R`` = the user's first ``n`` recommendations as a set, ``t_0..t_{m-1}`` the
truth list, ``hits = #{j : t_j ∈ R}`` counting repeated truth clicks each time), as in
ComiRec's ``evaluate_full`` (THUDM/ComiRec ``src/train.py``):

* ``recall@n  = hits / m`` (``m`` includes duplicates),
* ``hitrate@n = [hits > 0]`` (with one truth click, as under leave-one-out, HR@n = recall@n),
* ``mrr@n = 1 / (r + 1)`` where ``r`` is the 0-based rank of the first recommendation in the truth,
  0 when none of the first ``n`` is (with one truth click, the reciprocal rank of that click),
* ``ndcg@n`` (standard, binary relevance by rank): ``DCG = Σ_{r<n, rec_r ∈ truth} 1/log2(r+2)``,
  ``IDCG = Σ_{r < min(|distinct truth|, n)} 1/log2(r+2)``; equals ``sklearn.metrics.ndcg_score``
  with 0/1 relevance.
* ``ndcg@n`` with ``comirec=True``, ComiRec's variant: the rank order of ``R`` is ignored;
  ``DCG = Σ_{j : t_j ∈ R} 1/log2(j+2)`` over positions ``j`` in the *truth list*, and
  ``IDCG = Σ_{j < hits} 1/log2(j+2)``, i.e. normalised by the number of hits, not by the
  truth size (so one hit at the first truth position scores 1.0 however long the truth
  is); users without hits score 0. Use it to compare with numbers published with that code.
* ``diversity@n``: share of pairs of recommended items in different categories (ComiRec's
  ``compute_diversity``), averaged over users with at least two recommended items.
* ``coverage@n``: distinct recommended items over all users / ``(num_items - 1)``.

Every metric is averaged over users (ComiRec divides by the number of evaluated users).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "RankedHits",
    "category_diversity",
    "compute_metrics",
    "coverage",
    "hit_rate",
    "mrr",
    "ndcg",
    "rank_hits",
    "recall",
]


def _discounts(length: int) -> np.ndarray:
    """``[length]`` float64: ``1 / log2(r + 2)`` for ``r = 0..length-1``."""
    return 1.0 / np.log2(np.arange(length, dtype=np.float64) + 2.0)


def _first_occurrence(topn_ids: np.ndarray) -> np.ndarray:
    """``[U, N]`` bool: the slot holds a valid id (``> 0``) not seen earlier in its row."""
    u, n = topn_ids.shape
    order = np.argsort(topn_ids, axis=1, kind="stable")
    grouped = np.take_along_axis(topn_ids, order, axis=1)
    repeat = np.zeros((u, n), dtype=bool)
    repeat[:, 1:] = grouped[:, 1:] == grouped[:, :-1]
    first = np.empty_like(repeat)
    np.put_along_axis(first, order, ~repeat, axis=1)
    return first & (topn_ids > 0)


@dataclass
class RankedHits:
    """Where each truth click lands in its user's recommendation list.

    ``truth_rank [T]`` int64: rank (0-based) of truth item ``j`` in its user's list, or
    ``N`` when absent; ``truth_user [T]``: its user; ``truth_pos [T]``: its position in the
    user's truth list; ``truth_len [U]``; ``distinct_truth [U]``: distinct truth items;
    ``num_recs`` = ``N``. Any ``n <= N`` is a cutoff: truth ``j`` is a hit @n iff
    ``truth_rank[j] < n``.
    """

    truth_rank: np.ndarray
    truth_user: np.ndarray
    truth_pos: np.ndarray
    truth_len: np.ndarray
    distinct_truth: np.ndarray
    num_recs: int


def _check_truth(num_users: int, truth_indptr: np.ndarray, truth_items: np.ndarray) -> None:
    if truth_indptr.shape != (num_users + 1,):
        raise ValueError(f"truth_indptr: expected [{num_users + 1}] for {num_users} users, got {truth_indptr.shape}")
    if truth_indptr[0] != 0 or truth_indptr[-1] != len(truth_items):
        raise ValueError(
            f"truth_indptr: must run from 0 to len(truth_items)={len(truth_items)}, "
            f"got {truth_indptr[0]}..{truth_indptr[-1]}"
        )
    lengths = np.diff(truth_indptr)
    if (lengths <= 0).any():
        raise ValueError(f"truth_indptr: user {int(np.argmax(lengths <= 0))} has no truth items")


def rank_hits(topn_ids: np.ndarray, truth_indptr: np.ndarray, truth_items: np.ndarray) -> RankedHits:
    """Match every truth click against its user's recommendations (sort + searchsorted)."""
    topn_ids = np.asarray(topn_ids, dtype=np.int64)
    truth_indptr = np.asarray(truth_indptr, dtype=np.int64)
    truth_items = np.asarray(truth_items, dtype=np.int64)
    if topn_ids.ndim != 2:
        raise ValueError(f"topn_ids: expected [U, N], got shape {topn_ids.shape}")
    num_users, n = topn_ids.shape
    _check_truth(num_users, truth_indptr, truth_items)
    truth_len = np.diff(truth_indptr)
    truth_user = np.repeat(np.arange(num_users, dtype=np.int64), truth_len)
    truth_pos = np.arange(len(truth_items), dtype=np.int64) - truth_indptr[truth_user]
    stride = int(max(topn_ids.max(initial=0), truth_items.max(initial=0))) + 1

    # Keys user * stride + item; sorted recommendation keys with their ranks.
    first = _first_occurrence(topn_ids)
    rec_user, rec_rank = np.nonzero(first)
    rec_keys = rec_user * stride + topn_ids[rec_user, rec_rank]
    order = np.argsort(rec_keys, kind="stable")
    rec_keys, rec_rank = rec_keys[order], rec_rank[order]
    truth_keys = truth_user * stride + truth_items
    truth_rank = np.full(len(truth_keys), n, dtype=np.int64)
    if len(rec_keys):
        at = np.minimum(np.searchsorted(rec_keys, truth_keys), len(rec_keys) - 1)
        found = rec_keys[at] == truth_keys
        truth_rank[found] = rec_rank[at[found]]

    unique_keys = np.unique(truth_keys)
    distinct_truth = np.bincount(unique_keys // stride, minlength=num_users)
    return RankedHits(truth_rank, truth_user, truth_pos, truth_len, distinct_truth, n)


def _cutoff(hits: RankedHits, n: int) -> np.ndarray:
    if not 0 < n <= hits.num_recs:
        raise ValueError(f"n: must be in 1..{hits.num_recs} (the number of recommendations), got {n}")
    return hits.truth_rank < n


def _hit_counts(hits: RankedHits, n: int) -> np.ndarray:
    """``[U]`` number of truth clicks (duplicates counted) found in the first ``n`` recommendations."""
    return np.bincount(hits.truth_user, weights=_cutoff(hits, n), minlength=len(hits.truth_len))


def recall(hits: RankedHits, n: int) -> np.ndarray:
    """``[U]`` ComiRec recall@n: truth clicks found / truth clicks (duplicates included)."""
    return _hit_counts(hits, n) / hits.truth_len


def hit_rate(hits: RankedHits, n: int) -> np.ndarray:
    """``[U]`` 1.0 where at least one truth item is among the first ``n`` recommendations."""
    return (_hit_counts(hits, n) > 0).astype(np.float64)


def mrr(hits: RankedHits, n: int) -> np.ndarray:
    """``[U]`` reciprocal rank of the best-ranked truth item among the first ``n``, 0 without one."""
    hit = _cutoff(hits, n)
    # best rank per user: hits.truth_rank is grouped by user (CSR order), each user with >= 1 truth click
    first = np.minimum.reduceat(np.where(hit, hits.truth_rank, n), np.cumsum(hits.truth_len) - hits.truth_len)
    return np.where(first < n, 1.0 / (first + 1.0), 0.0)


def ndcg(hits: RankedHits, n: int, *, comirec: bool = False) -> np.ndarray:
    """``[U]`` NDCG@n: standard (by recommendation rank) or ComiRec's variant (module docstring)."""
    hit = _cutoff(hits, n)
    num_users = len(hits.truth_len)
    if comirec:
        disc = _discounts(int(hits.truth_len.max()) + 1)
        ideal = np.concatenate([[0.0], np.cumsum(disc)])
        count = np.bincount(hits.truth_user, weights=hit, minlength=num_users).astype(np.int64)
        dcg = np.bincount(hits.truth_user, weights=hit * disc[hits.truth_pos], minlength=num_users)
        return np.where(count > 0, dcg / np.where(count > 0, ideal[count], 1.0), 0.0)
    disc = _discounts(n)
    ideal = np.concatenate([[0.0], np.cumsum(disc)])
    # Each hit recommendation counts once: keep the first truth click per (user, rank).
    rank = hits.truth_rank[hit]
    user = hits.truth_user[hit]
    pairs = np.unique(user * n + rank)
    dcg = np.bincount(pairs // n, weights=disc[pairs % n], minlength=num_users)
    return dcg / ideal[np.minimum(hits.distinct_truth, n)]


def category_diversity(topn_ids: np.ndarray, item_category: np.ndarray) -> np.ndarray:
    """``[U]`` share of recommended pairs whose categories differ (NaN for < 2 items).

    ``item_category [num_items]`` int, indexed by item id; category values are compared as
    they are (0 "unknown" is one category).
    """
    topn_ids = np.asarray(topn_ids, dtype=np.int64)
    item_category = np.asarray(item_category, dtype=np.int64)
    if topn_ids.size and topn_ids.max() >= len(item_category):
        raise ValueError(f"item_category: has {len(item_category)} entries but item id {topn_ids.max()} is recommended")
    if item_category.size and item_category.min() < 0:
        raise ValueError("item_category: category ids must be >= 0")
    first = _first_occurrence(topn_ids)
    user, rank = np.nonzero(first)
    cats = item_category[topn_ids[user, rank]]
    num_users = topn_ids.shape[0]
    count = np.bincount(user, minlength=num_users).astype(np.float64)
    stride = int(cats.max(initial=0)) + 1
    groups, sizes = np.unique(user * stride + cats, return_counts=True)
    same = np.bincount(groups // stride, weights=sizes * (sizes - 1) / 2.0, minlength=num_users)
    pairs = count * (count - 1) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count >= 2, 1.0 - same / pairs, np.nan)


def coverage(topn_ids: np.ndarray, num_items: int) -> float:
    """Distinct recommended items (ids ``> 0``) / ``(num_items - 1)`` real items."""
    if num_items < 2:
        raise ValueError(f"num_items: must be >= 2 (id 0 is padding), got {num_items}")
    ids = np.asarray(topn_ids).reshape(-1)
    return len(np.unique(ids[ids > 0])) / (num_items - 1)


def compute_metrics(
    topn_ids: np.ndarray,
    truth_indptr: np.ndarray,
    truth_items: np.ndarray,
    *,
    topn: tuple[int, ...] = (20, 50),
    comirec_ndcg: bool = False,
    item_category: np.ndarray | None = None,
    num_items: int | None = None,
) -> dict[str, float]:
    """All metrics at every cutoff in ``topn`` (each ``<= N``), averaged over users, all users
    at once.

    Keys ``recall@n``, ``ndcg@n``, ``hitrate@n``, ``mrr@n``; ``diversity@n`` when ``item_category`` is
    given and labels some item (all 0 = unknown: no diversity to measure); ``coverage@n``
    when ``num_items`` is given; and ``users``.
    """
    hits = rank_hits(topn_ids, truth_indptr, truth_items)
    # categories only where some item is labelled (all 0 = unknown: no diversity to measure)
    category = item_category if item_category is not None and np.any(np.asarray(item_category) != 0) else None
    out: dict[str, float] = {}
    for n in topn:
        out[f"recall@{n}"] = float(recall(hits, n).mean())
        out[f"ndcg@{n}"] = float(ndcg(hits, n, comirec=comirec_ndcg).mean())
        out[f"hitrate@{n}"] = float(hit_rate(hits, n).mean())
        out[f"mrr@{n}"] = float(mrr(hits, n).mean())
        if category is not None:
            div = category_diversity(np.asarray(topn_ids)[:, :n], category)
            out[f"diversity@{n}"] = float(np.nanmean(div)) if np.isfinite(div).any() else float("nan")
        if num_items is not None:
            out[f"coverage@{n}"] = coverage(np.asarray(topn_ids)[:, :n], num_items)
    out["users"] = float(len(truth_indptr) - 1)
    return out
