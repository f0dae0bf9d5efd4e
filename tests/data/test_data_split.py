"""Splits: user-level 8:1:1 (reproducible, disjoint, 80/20 input/truth) and the time split."""

from __future__ import annotations

import numpy as np
import pytest

from recsys.config import DataConfig
from recsys.data.prepare import Dataset
from recsys.data.readers import DataError
from recsys.data.split import make_eval_set, split_dataset


def random_dataset(num_users: int = 1000, min_len: int = 1, with_times: bool = True) -> Dataset:
    """Random sequences of ``min_len``..40 clicks over 300 items; times increase within a user."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(min_len, 41, size=num_users)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    items = rng.integers(1, 301, size=indptr[-1])
    start = rng.uniform(0, 1000, size=num_users)
    times = np.concatenate([s + np.sort(rng.uniform(0, 300, size=n)) for s, n in zip(start, lengths)])
    return Dataset(
        item_raw=np.array(["<pad>"] + [str(i) for i in range(1, 301)]),
        user_raw=np.array([f"u{u}" for u in range(num_users)]),
        indptr=indptr,
        items=items,
        times=times if with_times else None,
        item_category=np.zeros(301, dtype=np.int64),
        category_raw=np.array(["<unknown>"]),
        item_counts=np.bincount(items, minlength=301),
    )


def user_clicks(ds: Dataset, u: int) -> np.ndarray:
    return ds.items[ds.indptr[u] : ds.indptr[u + 1]]


def truth_of(eval_set, i: int) -> np.ndarray:
    return eval_set.truth_items[eval_set.truth_indptr[i] : eval_set.truth_indptr[i + 1]]


def test_user_split_sizes_disjoint_and_reproducible():
    ds = random_dataset(min_len=2)
    cfg = DataConfig(seed=5)
    a, b = split_dataset(ds, cfg), split_dataset(ds, cfg)
    assert (len(a.train_users), len(a.valid), len(a.test)) == (800, 100, 100)
    all_valid = set(a.valid.users)
    assert not all_valid & set(a.test.users) and not all_valid & set(a.train_users)
    assert not set(a.test.users) & set(a.train_users)
    for name in ("train_users", "train_indptr", "train_items"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    np.testing.assert_array_equal(a.test.inputs, b.test.inputs)
    other = split_dataset(ds, DataConfig(seed=6))
    assert not np.array_equal(other.train_users, a.train_users)


def test_user_split_covers_everyone_and_keeps_train_sequences_whole():
    ds = random_dataset()
    split = split_dataset(ds, DataConfig())
    n_short = int(np.sum(ds.lengths < 2))
    # every user is in exactly one part; eval users with 1 click are the only ones dropped
    dropped = ds.num_users - len(split.train_users) - len(split.valid) - len(split.test)
    assert 0 <= dropped <= n_short
    kept = np.concatenate([split.train_users, split.valid.users, split.test.users])
    assert np.all(ds.lengths[np.setdiff1d(np.arange(ds.num_users), kept)] < 2)
    for r in (0, 17, len(split.train_users) - 1):
        row = split.train_items[split.train_indptr[r] : split.train_indptr[r + 1]]
        np.testing.assert_array_equal(row, user_clicks(ds, split.train_users[r]))


@pytest.mark.parametrize("max_len", [5, 50])
def test_eval_inputs_are_first_80_percent_and_truth_the_rest(max_len):
    ds = random_dataset()
    split = split_dataset(ds, DataConfig(max_len=max_len))
    for ev in (split.valid, split.test):
        assert ev.inputs.shape == (len(ev), max_len) and ev.inputs.dtype == np.int64
        for i, u in enumerate(ev.users):
            seq = user_clicks(ds, u)
            k = int(0.8 * len(seq))
            expect = seq[:k][-max_len:]
            assert ev.lengths[i] == len(expect)
            np.testing.assert_array_equal(ev.inputs[i, : len(expect)], expect)
            assert not ev.inputs[i, len(expect) :].any()  # right padding
            np.testing.assert_array_equal(truth_of(ev, i), seq[k:])


def test_make_eval_set_drops_users_with_empty_input_or_truth():
    indptr = np.array([0, 3, 6, 9])
    items = np.arange(1, 10)
    ev = make_eval_set(indptr, items, np.array([0, 1, 2]), np.array([0, 5, 9]), max_len=4)
    assert ev.users.tolist() == [1]  # user 0: no input; user 2: no truth
    assert ev.inputs.tolist() == [[4, 5, 0, 0]] and truth_of(ev, 0).tolist() == [6]


def test_time_split_never_leaks_the_future():
    ds = random_dataset()
    cfg = DataConfig(split="time", time_cutoff_quantile=0.7, seed=3)
    split = split_dataset(ds, cfg)
    cutoff = split.cutoff
    assert cutoff == pytest.approx(np.quantile(ds.times, 0.7))
    train_times = []
    for r, u in enumerate(split.train_users):
        n = split.train_indptr[r + 1] - split.train_indptr[r]
        seq = user_clicks(ds, u)
        np.testing.assert_array_equal(split.train_items[split.train_indptr[r] : split.train_indptr[r + 1]], seq[:n])
        train_times.append(ds.times[ds.indptr[u] : ds.indptr[u] + n])
    assert np.concatenate(train_times).max() < cutoff
    # every click before the cutoff is in training
    assert sum(len(t) for t in train_times) == int(np.sum(ds.times < cutoff))
    assert not set(split.valid.users) & set(split.test.users)
    assert abs(len(split.valid) - len(split.test)) <= 1
    for ev in (split.valid, split.test):
        for i, u in enumerate(ev.users):
            times = ds.times[ds.indptr[u] : ds.indptr[u + 1]]
            n_before = int(np.sum(times < cutoff))
            assert 0 < n_before < len(times)
            assert ev.lengths[i] == min(n_before, cfg.max_len)
            np.testing.assert_array_equal(truth_of(ev, i), user_clicks(ds, u)[n_before:])
    again = split_dataset(ds, cfg)
    np.testing.assert_array_equal(again.valid.users, split.valid.users)


def test_time_split_needs_timestamps():
    with pytest.raises(DataError, match="needs click timestamps"):
        split_dataset(random_dataset(with_times=False), DataConfig(split="time"))


def test_too_few_users_for_a_user_split():
    tiny = split_dataset(random_dataset(num_users=2, min_len=2), DataConfig())
    assert (len(tiny.train_users), len(tiny.valid), len(tiny.test)) == (1, 0, 1)
    with pytest.raises(DataError, match="too few"):
        split_dataset(random_dataset(num_users=1), DataConfig())
