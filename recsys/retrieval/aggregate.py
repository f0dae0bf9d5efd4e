"""From B×K per-interest search results to N items per user.

Both functions take the raw candidates of one batch, every interest's hits side by side:
``ids [B, M]`` int64 (``M = K * n'``), ``scores [B, M]`` float32 and ``interest_of [B, M]``
int64 (which interest found each hit). An id ``<= 0`` marks an invalid slot (padding, a
missing FAISS hit, an excluded item) and is never returned. Results are ``[B, n]``; rows
with fewer than ``n`` distinct valid candidates are filled with id ``-1``, score ``-inf``
and interest ``-1``.

* :func:`max_merge` is ComiRec's aggregation (and MIND's): every item scores its best inner
  product over the user's interests, ``f(u, i) = max_k e_iᵀ v_u^(k)``, and the top ``n``
  distinct items are kept.
* :func:`diverse_merge` is ComiRec's controllable aggregation (paper §3.3, code
  ``evaluate_full(coef=...)``): it picks ``n`` items greedily, each time the candidate with
  the largest ``score - lam * (items already picked in its category)``.

Everything is vectorised over users: sorting and de-duplication are row-wise numpy ops, and
the greedy loop runs over the ``n`` picks, never over users.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from recsys.config import MAX_DIVERSITY_LAMBDA

__all__ = ["check_lambda", "dedup_sorted", "diverse_merge", "max_merge"]


def check_lambda(lam: float, name: str = "diversity_lambda") -> float:
    """``lam`` if it is a finite number in ``[0, MAX_DIVERSITY_LAMBDA]``, else ``ValueError``
    naming ``name``."""
    # numbers.Real: numpy scalars too (np.float32 is no float subclass); a bool is not a lambda
    real = isinstance(lam, numbers.Real) and not isinstance(lam, (bool, np.bool_))
    if not (real and math.isfinite(lam) and 0 <= lam <= MAX_DIVERSITY_LAMBDA):
        raise ValueError(f"{name}: must be a number in [0, {MAX_DIVERSITY_LAMBDA:g}], got {lam!r}")
    return float(lam)


def _check(ids: np.ndarray, scores: np.ndarray, interest_of: np.ndarray) -> None:
    if ids.ndim != 2 or scores.shape != ids.shape or interest_of.shape != ids.shape:
        raise ValueError(
            "ids, scores, interest_of: expected three [B, M] arrays of one shape, got "
            f"{ids.shape}, {scores.shape}, {interest_of.shape}"
        )


def dedup_sorted(
    ids: np.ndarray, scores: np.ndarray, interest_of: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort each row by falling score and keep each item's best hit only.

    ``ids, scores, interest_of [B, M]`` -> the same shapes, each row ordered by falling
    score (ties keep input order); duplicates of an item (its weaker hits from other
    interests) and invalid slots (``id <= 0``) move to the end as ``-1 / -inf / -1``.
    For one item found by several interests with equal scores, the first slot wins.
    """
    _check(ids, scores, interest_of)
    ids = np.asarray(ids, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float32)
    interest_of = np.asarray(interest_of, dtype=np.int64)
    if ids.shape[1] == 0:
        return ids.copy(), scores.copy(), interest_of.copy()
    # Strongest hit first; a stable sort by id then groups each item's hits, best first,
    # so every later member of a group is a weaker duplicate.
    order = np.argsort(-scores, axis=1, kind="stable")  # [B, M]
    s_ids = np.take_along_axis(ids, order, axis=1)
    s_scores = np.take_along_axis(scores, order, axis=1)
    s_int = np.take_along_axis(interest_of, order, axis=1)
    by_id = np.argsort(s_ids, axis=1, kind="stable")  # [B, M]
    grouped = np.take_along_axis(s_ids, by_id, axis=1)
    dup_grouped = np.zeros(grouped.shape, dtype=bool)
    dup_grouped[:, 1:] = grouped[:, 1:] == grouped[:, :-1]
    dup = np.empty_like(dup_grouped)
    np.put_along_axis(dup, by_id, dup_grouped, axis=1)
    invalid = dup | (s_ids <= 0) | np.isnan(s_scores)
    keep = np.argsort(invalid, axis=1, kind="stable")  # valid slots first, order kept
    bad = np.take_along_axis(invalid, keep, axis=1)
    out_ids = np.where(bad, -1, np.take_along_axis(s_ids, keep, axis=1))
    out_scores = np.where(bad, np.float32(-np.inf), np.take_along_axis(s_scores, keep, axis=1))
    out_int = np.where(bad, -1, np.take_along_axis(s_int, keep, axis=1))
    return out_ids, out_scores, out_int


def _pad_to(a: np.ndarray, n: int, fill: float) -> np.ndarray:
    """``a [B, m]`` -> ``[B, n]``: cut, or fill on the right with ``fill``."""
    if a.shape[1] >= n:
        return a[:, :n]
    pad = np.full((a.shape[0], n - a.shape[1]), fill, dtype=a.dtype)
    return np.concatenate([a, pad], axis=1)


def max_merge(
    ids: np.ndarray, scores: np.ndarray, interest_of: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ComiRec's max-score merge: top ``n`` distinct items by their best interest's score.

    ``ids, scores, interest_of [B, M]`` -> ``(ids [B, n] int64, scores [B, n] float32,
    interest_of [B, n] int64)``, best first; ``-1 / -inf / -1`` where fewer than ``n``
    distinct valid items exist.
    """
    if n <= 0:
        raise ValueError(f"n: must be > 0, got {n}")
    out_ids, out_scores, out_int = dedup_sorted(ids, scores, interest_of)
    return _pad_to(out_ids, n, -1), _pad_to(out_scores, n, -np.inf), _pad_to(out_int, n, -1)


def diverse_merge(
    ids: np.ndarray,
    scores: np.ndarray,
    interest_of: np.ndarray,
    item_category: np.ndarray,
    n: int,
    lam: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ComiRec's diversity-controlled greedy aggregation.

    From each user's de-duplicated candidates, pick ``n`` items one at a time; each pick is
    the candidate maximising ``score - lam * c``, where ``c`` is how many already picked
    items share its category (``item_category [num_items]`` int, indexed by item id; the
    value 0, "unknown", counts as one category like any other). Ties go to the candidate
    with the higher raw score, as in ComiRec's loop. This greedily maximises ComiRec's
    ``Q(u, S) = Σ f(u, i) + λ Σ_{i,j∈S} [CATE(i) ≠ CATE(j)]`` (the marginal gain of adding
    ``i`` is ``f(u, i) - λ·c`` up to a constant). ``lam = 0`` gives :func:`max_merge`.

    Returns ``(ids [B, n], scores [B, n], interest_of [B, n])`` in pick order, with the raw
    (unpenalised) scores; ``-1 / -inf / -1`` once a row runs out of candidates.
    """
    if n <= 0:
        raise ValueError(f"n: must be > 0, got {n}")
    lam = check_lambda(lam, "lam (diversity lambda)")
    item_category = np.asarray(item_category)
    if item_category.ndim != 1:
        raise ValueError(f"item_category: expected [num_items], got shape {item_category.shape}")
    cand_ids, cand_scores, cand_int = dedup_sorted(ids, scores, interest_of)
    if cand_ids.size and cand_ids.max() >= len(item_category):
        raise ValueError(f"item_category: has {len(item_category)} entries but item id {cand_ids.max()} was retrieved")
    bsz, m = cand_ids.shape
    n_pick = min(n, m)
    cats = item_category[np.maximum(cand_ids, 0)]  # [B, M]; invalid slots are -inf anyway
    same = np.zeros((bsz, m), dtype=np.float64)  # same-category picks so far
    score = cand_scores.astype(np.float64)
    left = cand_ids > 0  # [B, M] valid candidates not picked yet
    lowest = np.finfo(np.float64).min  # any candidate left outranks "none left" (-inf)
    rows = np.arange(bsz)
    picks = np.empty((bsz, n_pick), dtype=np.int64)
    empty = np.zeros((bsz, n_pick), dtype=bool)  # the row had no candidate left
    for t in range(n_pick):
        # clipped, so a huge λ or score can never turn a candidate into "none left"
        gain = np.where(left, np.clip(score - lam * same, lowest, None), -np.inf)
        j = np.argmax(gain, axis=1)  # [B]; first (highest raw score) on ties
        picks[:, t] = j
        empty[:, t] = ~left[rows, j]
        left[rows, j] = False
        same += cats == cats[rows, j][:, None]
    out_ids = np.where(empty, -1, np.take_along_axis(cand_ids, picks, axis=1))
    out_scores = np.where(empty, np.float32(-np.inf), np.take_along_axis(cand_scores, picks, axis=1))
    out_int = np.where(empty, -1, np.take_along_axis(cand_int, picks, axis=1))
    return _pad_to(out_ids, n, -1), _pad_to(out_scores, n, -np.inf), _pad_to(out_int, n, -1)
