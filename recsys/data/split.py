"""Train / validation / test splits of a :class:`~recsys.data.prepare.Dataset`.

``split = "user"`` (ComiRec): users are shuffled with ``seed`` and cut into train, valid and
test (``1 - valid_frac - test_frac : valid_frac : test_frac``, 8:1:1 by default; at least one
test user). Train users keep their whole sequence. For each valid/test user with ``n`` clicks
the first ``int(eval_input_frac * n)`` clicks are the input (its last ``max_len`` clicks are
fed to the model) and the remaining clicks are the truth.

``split = "time"``: a global cutoff at the ``time_cutoff_quantile`` of all click times.
Training sequences are every user's clicks strictly before the cutoff (users with none are
left out). Users with clicks on both sides are evaluated: input = their clicks before the
cutoff, truth = their clicks at or after it; they are shuffled with ``seed`` and shared
between valid and test in the ratio ``valid_frac : test_frac``. No click at or after the
cutoff ever reaches training. Needs real timestamps.

Evaluation users whose input or truth would be empty (in the user split: users with fewer
than 2 clicks at the default fraction) are dropped from the evaluation sets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recsys.config import DataConfig
from recsys.data.batches import gather_rows, pad_sequences
from recsys.data.prepare import Dataset
from recsys.data.readers import DataError


@dataclass(eq=False)
class EvalSet:
    """Evaluation users with model input and held-out truth.

    users ``[U]`` int64 user indices; inputs ``[U, max_len]`` int64 right-padded with 0 (the
    last ``max_len`` input clicks); lengths ``[U]`` int64; truth ``items`` of user ``i`` are
    ``truth_items[truth_indptr[i]:truth_indptr[i + 1]]`` (in click order, duplicates kept).
    """

    users: np.ndarray
    inputs: np.ndarray
    lengths: np.ndarray
    truth_indptr: np.ndarray
    truth_items: np.ndarray

    def __len__(self) -> int:
        return len(self.users)

    def sample(self, n: int, seed: int) -> EvalSet:
        """A fixed random sample of ``n`` of the users (in their order; all of them when ``n``
        is 0 or at least their number): validation's users on a large log."""
        if n <= 0 or n >= len(self):
            return self
        rows = np.sort(np.random.default_rng(seed).choice(len(self), size=n, replace=False))
        truth_indptr, truth_items = gather_rows(
            self.truth_indptr, self.truth_items, self.truth_indptr[rows], self.truth_indptr[rows + 1]
        )
        return EvalSet(self.users[rows], self.inputs[rows], self.lengths[rows], truth_indptr, truth_items)


@dataclass(eq=False)
class Split:
    """Training sequences (CSR over ``train_users [R]``: row ``r`` is user ``train_users[r]``)
    and the two evaluation sets. ``cutoff`` is the time split's cutoff (``None`` otherwise)."""

    train_indptr: np.ndarray
    train_items: np.ndarray
    train_users: np.ndarray
    valid: EvalSet
    test: EvalSet
    cutoff: float | None = None


def split_dataset(ds: Dataset, cfg: DataConfig) -> Split:
    """Split ``ds`` as ``cfg.split`` says (see the module docstring); reproducible by ``cfg.seed``."""
    if cfg.split == "user":
        return _user_split(ds, cfg)
    if cfg.split == "time":
        return _time_split(ds, cfg)
    raise DataError(f"data.split: unknown split {cfg.split!r} (user | time)")


def make_eval_set(
    indptr: np.ndarray, items: np.ndarray, users: np.ndarray, split_at: np.ndarray, max_len: int
) -> EvalSet:
    """Input = ``items[indptr[u]:split_at]``, truth = ``items[split_at:indptr[u + 1]]`` for each
    user ``u`` in ``users [U]`` (``split_at [U]`` absolute positions). Users whose input or
    truth is empty are dropped."""
    users = np.asarray(users, dtype=np.int64)
    split_at = np.asarray(split_at, dtype=np.int64)
    ok = (split_at > indptr[users]) & (split_at < indptr[users + 1])
    users, split_at = users[ok], split_at[ok]
    inputs, lengths = pad_sequences(indptr, items, users, max_len, ends=split_at)
    truth_indptr, truth_items = gather_rows(indptr, items, split_at, indptr[users + 1])
    return EvalSet(users=users, inputs=inputs, lengths=lengths, truth_indptr=truth_indptr, truth_items=truth_items)


def _user_split(ds: Dataset, cfg: DataConfig) -> Split:
    n = ds.num_users
    n_test = max(1, round(cfg.test_frac * n))
    n_valid = round(cfg.valid_frac * n)
    if n_valid + n_test >= n:
        raise DataError(f"{n} users are too few for a user split with a training part")
    perm = np.random.default_rng(cfg.seed).permutation(n)
    valid, test, train = (np.sort(part) for part in np.split(perm, [n_valid, n_valid + n_test]))
    starts = ds.indptr[:-1]
    split_at = starts + (cfg.eval_input_frac * ds.lengths).astype(np.int64)  # int(frac * n)
    train_indptr, train_items = gather_rows(ds.indptr, ds.items, starts[train], ds.indptr[train + 1])
    return Split(
        train_indptr=train_indptr,
        train_items=train_items,
        train_users=train,
        valid=make_eval_set(ds.indptr, ds.items, valid, split_at[valid], cfg.max_len),
        test=make_eval_set(ds.indptr, ds.items, test, split_at[test], cfg.max_len),
    )


def _time_split(ds: Dataset, cfg: DataConfig) -> Split:
    if ds.times is None:
        raise DataError(
            f"data.split='time' needs click timestamps, but {ds.source or 'this dataset'} only has "
            "click positions; use data.split='user'"
        )
    cutoff = float(np.quantile(ds.times, cfg.time_cutoff_quantile))
    owner = np.repeat(np.arange(ds.num_users), ds.lengths)  # [nnz] user of each click
    before = np.bincount(owner[ds.times < cutoff], minlength=ds.num_users)  # a prefix: sorted by time
    split_at = ds.indptr[:-1] + before
    train = np.flatnonzero(before > 0)
    if len(train) == 0:
        raise DataError(f"no click is before the time cutoff {cutoff} (data.time_cutoff_quantile)")
    train_indptr, train_items = gather_rows(ds.indptr, ds.items, ds.indptr[train], split_at[train])
    straddle = np.flatnonzero((before > 0) & (split_at < ds.indptr[1:]))
    perm = np.random.default_rng(cfg.seed).permutation(straddle)
    n_valid = round(len(perm) * cfg.valid_frac / (cfg.valid_frac + cfg.test_frac))
    valid, test = np.sort(perm[:n_valid]), np.sort(perm[n_valid:])
    return Split(
        train_indptr=train_indptr,
        train_items=train_items,
        train_users=train,
        valid=make_eval_set(ds.indptr, ds.items, valid, split_at[valid], cfg.max_len),
        test=make_eval_set(ds.indptr, ds.items, test, split_at[test], cfg.max_len),
        cutoff=cutoff,
    )
