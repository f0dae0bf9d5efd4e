"""The built-in click generator: sequences with planted multi-interest structure.

The model of the data (all draws from one ``numpy`` generator seeded by ``cfg.seed``):

- items are split evenly into ``num_categories`` categories at random; inside a category, item
  popularity follows Zipf(``popularity_alpha``) over the category's items;
- each user has ``interests_per_user`` distinct categories with Dirichlet(1) weights;
- a user's sequence length is ``5 + Geometric`` with mean ``mean_length`` (at least 5, so
  every user survives the default filtering);
- the first click's interest is drawn from the weights; after each click, with probability
  ``switch_prob`` the active interest changes to another of the user's interests (drawn from
  the weights of the others); a click picks an item of the active category by popularity;
- a ``noise`` share of clicks is replaced by a uniformly random item;
- times: each user starts at a uniform moment within one year and clicks at exponential gaps
  of one day on average (unix seconds from 2020-09-13), so the time split works too.

Raw ids are the decimal indices (``user "0"``, ``item "17"``, ``category "3"``), held in
categorical columns of str so that millions of rows are built in milliseconds.
:func:`generate` is vectorised over users (its only loop runs over interest segments).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, overload

import numpy as np
import pandas as pd

from recsys.config import Config, SyntheticConfig

_EPOCH = 1_600_000_000.0  # first possible click time (unix seconds)
_YEAR = 365 * 86_400.0
_DAY = 86_400.0
MIN_LENGTH = 5


@dataclass(eq=False)
class SyntheticTruth:
    """The planted structure. ``user_interests [U, I]`` int64 category indices,
    ``user_weights [U, I]`` float64 (rows sum to 1), ``item_category [num_items]`` int64."""

    user_interests: np.ndarray
    user_weights: np.ndarray
    item_category: np.ndarray


@overload
def generate(cfg: SyntheticConfig, return_truth: Literal[False] = False) -> pd.DataFrame: ...


@overload
def generate(cfg: SyntheticConfig, return_truth: Literal[True]) -> tuple[pd.DataFrame, SyntheticTruth]: ...


def generate(cfg: SyntheticConfig, return_truth: bool = False) -> pd.DataFrame | tuple[pd.DataFrame, SyntheticTruth]:
    """Clicks ``[n]`` with columns ``user``, ``item``, ``time``, ``category`` (as
    :func:`recsys.data.readers.read_interactions` returns), users in order, clicks in time
    order; with ``return_truth`` also the :class:`SyntheticTruth`."""
    if cfg.interests_per_user > cfg.num_categories:
        raise ValueError("synthetic.interests_per_user must be <= synthetic.num_categories")
    if cfg.num_items < cfg.num_categories:
        raise ValueError("synthetic.num_items must be >= synthetic.num_categories")
    if not 0.0 <= cfg.switch_prob <= 1.0 or not 0.0 <= cfg.noise <= 1.0:
        raise ValueError("synthetic.switch_prob and synthetic.noise must be in [0, 1]")
    rng = np.random.default_rng(cfg.seed)
    n_users, n_items, n_cats, n_int = cfg.num_users, cfg.num_items, cfg.num_categories, cfg.interests_per_user
    catalogue = _catalogue(rng, n_items, n_cats, cfg.popularity_alpha)

    interests = _distinct_categories(rng, n_users, n_int, n_cats)  # [U, I]
    weights = rng.dirichlet(np.ones(n_int), size=n_users)  # [U, I]
    p = 1.0 / max(1.0, cfg.mean_length - MIN_LENGTH + 1.0)
    lengths = MIN_LENGTH - 1 + rng.geometric(p, size=n_users)  # [U], mean = mean_length
    owner = np.repeat(np.arange(n_users), lengths)  # [N]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    first = np.zeros(len(owner), dtype=bool)
    first[starts] = True

    category = _click_categories(rng, interests, weights, owner, first, cfg.switch_prob)  # [N]
    items = _click_items(rng, catalogue, category, cfg.noise)  # [N]
    time = _click_times(rng, owner, starts, first)  # [N]

    df = pd.DataFrame(
        {
            "user": _labels(owner, n_users),
            "item": _labels(items, n_items),
            "time": time,
            "category": _labels(catalogue.item_category[items], n_cats),
        }
    )
    df.attrs["time_is_position"] = False
    df.attrs["source"] = f"synthetic(seed={cfg.seed}, users={n_users}, items={n_items})"
    if return_truth:
        truth = SyntheticTruth(user_interests=interests, user_weights=weights, item_category=catalogue.item_category)
        return df, truth
    return df


@dataclass(frozen=True, eq=False)
class _Catalogue:
    """The items of :func:`generate`: ``item_category [M]``; ``by_category [M]`` the items grouped
    by category; ``block_start [C + 1]`` where each category's items begin in ``by_category``; and
    ``cdf [M]`` along ``by_category``, the cumulative popularity that spans ``(c, c + 1]`` over
    category ``c``'s items, so that ``c + u`` (``u`` uniform in [0, 1)) picks one of them."""

    item_category: np.ndarray
    by_category: np.ndarray
    block_start: np.ndarray
    cdf: np.ndarray


def _catalogue(rng: np.random.Generator, n_items: int, n_cats: int, popularity_alpha: float) -> _Catalogue:
    """Items split evenly into ``n_cats`` categories at random, with Zipf(``popularity_alpha``)
    popularity inside each category."""
    item_category = np.empty(n_items, dtype=np.int64)
    item_category[rng.permutation(n_items)] = np.arange(n_items) % n_cats
    by_category = np.argsort(item_category, kind="stable")  # [M] items grouped by category
    block_start = np.searchsorted(item_category[by_category], np.arange(n_cats + 1))  # [C + 1]
    rank = np.arange(n_items) - block_start[item_category[by_category]]
    weight = (rank + 1.0) ** -popularity_alpha
    weight /= np.bincount(item_category[by_category], weights=weight)[item_category[by_category]]
    cdf = np.cumsum(weight)  # category c's items span (c, c + 1]
    return _Catalogue(item_category, by_category, block_start, cdf)


def _click_categories(
    rng: np.random.Generator,
    interests: np.ndarray,
    weights: np.ndarray,
    owner: np.ndarray,
    first: np.ndarray,
    switch_prob: float,
) -> np.ndarray:
    """``[N]`` the category of each click: its user's (``owner [N]``) active interest, which
    changes to another of the user's ``interests [U, I]`` with probability ``switch_prob`` after
    each click (a new segment; ``first [N]``: a user's first click starts one)."""
    new_segment = first | (rng.random(len(owner)) < switch_prob)
    segment = np.cumsum(new_segment) - 1  # [N] global segment of each click
    active = _segment_interests(rng, weights, owner[new_segment], first[new_segment])  # [S]
    return interests[owner, active[segment]]


def _click_items(rng: np.random.Generator, catalogue: _Catalogue, category: np.ndarray, noise: float) -> np.ndarray:
    """``[N]`` the item of each click: one of its ``category [N]`` by popularity, or, for a
    ``noise`` share of the clicks, any item uniformly."""
    u = rng.random(len(category))
    pos = np.searchsorted(catalogue.cdf, category + u)
    pos = np.clip(pos, catalogue.block_start[category], catalogue.block_start[category + 1] - 1)
    items = catalogue.by_category[pos]
    noisy = rng.random(len(category)) < noise
    items[noisy] = rng.integers(0, len(catalogue.item_category), size=int(noisy.sum()))
    return items


def _click_times(rng: np.random.Generator, owner: np.ndarray, starts: np.ndarray, first: np.ndarray) -> np.ndarray:
    """``[N]`` unix seconds of each click: its user (``owner [N]``, whose clicks begin at ``starts
    [U]``) starts at a uniform moment of one year and clicks at exponential gaps of a day on average."""
    gaps = rng.exponential(_DAY, size=len(owner))
    gaps[first] = 0.0
    clock = np.cumsum(gaps)
    return _EPOCH + rng.uniform(0.0, _YEAR, size=len(starts))[owner] + clock - clock[starts][owner]


def _labels(codes: np.ndarray, n: int) -> pd.Categorical:
    """Raw ids ``str(code)`` for ``codes [N]``, as a categorical (millions of rows in
    milliseconds; it behaves as a column of str)."""
    return pd.Categorical.from_codes(codes, categories=pd.Index(np.arange(n).astype(str), dtype="str"))


def _distinct_categories(rng: np.random.Generator, n_users: int, k: int, n_cats: int) -> np.ndarray:
    """``[n_users, k]`` int64: ``k`` distinct categories per user, uniformly at random."""
    if 2 * k > n_cats:
        return np.argsort(rng.random((n_users, n_cats)), axis=1)[:, :k]
    picks = rng.integers(0, n_cats, size=(n_users, k))
    while True:  # redraw repeats; each round removes most of them
        ordered = np.sort(picks, axis=1)
        rows = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
        if len(rows) == 0:
            return picks
        picks[rows] = rng.integers(0, n_cats, size=(len(rows), k))


def _segment_interests(
    rng: np.random.Generator, weights: np.ndarray, seg_user: np.ndarray, seg_first: np.ndarray
) -> np.ndarray:
    """Interest index ``[S]`` of each segment: the first segment of a user draws from the
    user's ``weights [U, I]``, every later one from the weights of the other interests.

    ``seg_user [S]`` and ``seg_first [S]`` (segments in user order) give each segment's user
    and whether it is the user's first. Loops over the segment rank, vectorised over users.
    """
    n_int = weights.shape[1]
    active = np.zeros(len(seg_user), dtype=np.int64)
    if n_int == 1:
        return active
    first_index = np.flatnonzero(seg_first)
    rank = np.arange(len(seg_user)) - np.repeat(first_index, np.diff(np.append(first_index, len(seg_user))))
    order = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[order], np.arange(rank.max() + 2))
    for r in range(rank.max() + 1):
        seg = order[bounds[r] : bounds[r + 1]]
        probs = weights[seg_user[seg]]  # [n, I] (a copy)
        if r > 0:
            probs[np.arange(len(seg)), active[seg - 1]] = 0.0
        cum = np.cumsum(probs, axis=1)
        draw = rng.random(len(seg)) * cum[:, -1]
        active[seg] = np.minimum((cum <= draw[:, None]).sum(axis=1), n_int - 1)
    return active


def planted_categories(cfg: SyntheticConfig, user_raw: np.ndarray, category_raw: np.ndarray) -> list[set[int]]:
    """Each listed user's planted categories, in a prepared dataset's category numbering.

    ``user_raw [U]`` raw user ids (the decimal indices :func:`generate` writes), ``category_raw
    [C]`` the dataset's raw category names (``[0]`` unknown) -> one set of category ids per user.
    Regenerates the planted truth from ``cfg`` (deterministic in ``cfg.seed``).
    """
    _, truth = generate(cfg, return_truth=True)
    ids = {str(name): i for i, name in enumerate(category_raw)}
    planted = truth.user_interests[np.asarray(user_raw).astype(np.int64)]  # [U, I] raw category indices
    return [{ids[str(c)] for c in row if str(c) in ids} for row in planted]


def planted_for(cfg: Config, user_raw: np.ndarray, category_raw: np.ndarray) -> list[set[int]] | None:
    """:func:`planted_categories` of the listed users when ``cfg`` trains on the synthetic data, else None."""
    if cfg.data.source != "synthetic":
        return None
    return planted_categories(cfg.synthetic, user_raw, category_raw)
