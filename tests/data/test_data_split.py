"""Splits: user-level 8:1:1 (reproducible, disjoint, 80/20 input/truth) and the time split."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest

from recsys.config import DataConfig
from recsys.data import split as split_module
from recsys.data.prepare import Dataset
from recsys.data.readers import DataError
from recsys.data.split import make_eval_set, quantile, split_dataset

AMAZON_BEAUTY = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "amazon-beauty" / "interactions.csv"


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
    for name in ("train_users", "train_ends"):
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
    assert split.clicks is ds.items and split.clicks_indptr is ds.indptr  # read in place, never copied
    train_indptr, train_items = split.train_csr()
    for r in (0, 17, len(split.train_users) - 1):
        row = train_items[train_indptr[r] : train_indptr[r + 1]]
        np.testing.assert_array_equal(row, user_clicks(ds, split.train_users[r]))
    counts = np.bincount(train_items, minlength=ds.num_items)
    np.testing.assert_array_equal(split.train_item_counts(ds.num_items, block=7), counts)


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
    train_indptr, train_items = split.train_csr()
    for r, u in enumerate(split.train_users):
        n = train_indptr[r + 1] - train_indptr[r]
        seq = user_clicks(ds, u)
        np.testing.assert_array_equal(train_items[train_indptr[r] : train_indptr[r + 1]], seq[:n])
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
    with pytest.raises(DataError, match=r"^1 user after filtering: too few for a user split"):
        split_dataset(random_dataset(num_users=1), DataConfig())


def _sequences(rows: list[list[int]], num_items: int = 12) -> Dataset:
    """A dataset of the hand-written click sequences ``rows`` (item ids 1..num_items-1, times = order)."""
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    items = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows])
    return Dataset(
        item_raw=np.array(["<pad>"] + [str(i) for i in range(1, num_items)]),
        user_raw=np.array([f"u{u}" for u in range(len(rows))]),
        indptr=indptr,
        items=items,
        times=np.arange(len(items), dtype=np.float64),
        item_category=np.zeros(num_items, dtype=np.int64),
        category_raw=np.array(["<unknown>"]),
        item_counts=np.bincount(items, minlength=num_items),
    )


def _eval_rows(ev) -> dict[int, tuple[list[int], list[int]]]:
    """user -> (its whole input, its truth), read through the eval set's own accessors."""
    indptr, items = ev.history(0, len(ev))
    return {
        int(u): (items[indptr[i] : indptr[i + 1]].tolist(), truth_of(ev, i).tolist()) for i, u in enumerate(ev.users)
    }


def test_leave_one_out_on_hand_made_sequences():
    rows = [
        [1, 2, 3, 4, 5],  # 0: plain
        [2, 3, 1],  # 1: exactly 3 clicks: one training click
        [4, 5],  # 2: too short to hold out two clicks: trains whole, never evaluated
        [6],  # 3: one click: the same
        [1, 2, 3, 2],  # 4: test target already clicked: leaves the test set only
        [2, 5, 2, 3],  # 5: validation target already clicked: leaves the validation set only
        [1, 2, 3, 7],  # 6: 7 is nobody's click but this last one: a cold test target
        [1, 8, 2],  # 7: 8 is nobody's training click: a cold validation target...
        [3, 4, 5, 8],  # 8: ...which the test knows (user 7's validation click): 8 stays a test target
        [9, 1, 9, 10],  # 9: validation target 9 repeats; the test's input may repeat an item
        [10, 11, 3, 4],  # 10: plain
    ]
    split = split_dataset(_sequences(rows), DataConfig(split="leave_one_out", max_len=2))
    train_indptr, train_items = split.train_csr()
    train = {
        int(u): train_items[train_indptr[r] : train_indptr[r + 1]].tolist() for r, u in enumerate(split.train_users)
    }
    assert train == {u: (row[:-2] if len(row) >= 3 else row) for u, row in enumerate(rows)}
    assert _eval_rows(split.valid) == {
        0: ([1, 2, 3], [4]),
        1: ([2], [3]),
        4: ([1, 2], [3]),
        6: ([1, 2], [3]),
        8: ([3, 4], [5]),
        10: ([10, 11], [3]),
    }
    assert _eval_rows(split.test) == {
        0: ([1, 2, 3, 4], [5]),
        1: ([2, 3], [1]),
        5: ([2, 5, 2], [3]),
        7: ([1, 8], [2]),
        8: ([3, 4, 5], [8]),
        9: ([9, 1, 9], [10]),
        10: ([10, 11, 3], [4]),
    }
    # the model reads the last max_len = 2 clicks of the whole input
    i = int(np.flatnonzero(split.test.users == 0)[0])
    assert split.test.inputs[i].tolist() == [3, 4] and split.test.lengths[i] == 2


def test_leave_one_out_keeps_the_files_order_of_tied_clicks(tmp_path):
    from recsys.config import load_config
    from recsys.data import load_dataset

    # user a's last three clicks share one timestamp: the file's order decides which is last
    path = tmp_path / "clicks.csv"
    path.write_text(
        "user,item,timestamp\na,1,10\na,2,20\na,5,30\na,3,30\na,4,30\n"
        "b,3,5\nb,1,5\nb,2,5\nb,4,5\nc,4,1\nc,5,2\nc,1,3\nc,2,4\n"
    )
    cfg = load_config(None, [f"data.source={path}", "data.min_item_count=1", "data.min_user_count=1"])
    ds = load_dataset(cfg)
    split = split_dataset(ds, DataConfig(split="leave_one_out"))
    raw = ds.item_raw
    users = ds.user_raw[split.test.users].tolist()
    test = {users[i]: raw[truth_of(split.test, i)].tolist() for i in range(len(users))}
    valid = {ds.user_raw[u]: raw[truth_of(split.valid, i)].tolist() for i, u in enumerate(split.valid.users)}
    assert test == {"a": ["4"], "b": ["4"], "c": ["2"]} and valid == {"a": ["3"], "b": ["2"], "c": ["1"]}


def test_leave_one_out_trains_the_samplers_on_every_click_but_the_last_two():
    from recsys.data.batches import TrainSampler, WindowSampler

    ds = random_dataset(min_len=1)
    split = split_dataset(ds, DataConfig(split="leave_one_out", max_len=8))
    held = ds.lengths >= 3
    np.testing.assert_array_equal(split.train_lengths, np.where(held, ds.lengths - 2, ds.lengths))
    assert len(split.test) > 0.8 * held.sum() and len(split.valid) > 0.8 * held.sum()  # 300 items: few repeats
    # the samplers read each user's training prefix in place in the dataset's clicks
    in_place = {"users": split.train_users, "ends": split.train_ends}
    window = WindowSampler(split.clicks_indptr, split.clicks, 8, seed=0, **in_place)
    assert window.num_users == int((split.train_lengths >= 2).sum())
    seq, lengths, targets = window.sample(256)
    last = TrainSampler(split.clicks_indptr, split.clicks, 8, seed=0, min_target=4, **in_place)
    assert last.num_users == int((split.train_lengths > 4).sum())
    # every sampled window is a stretch of some user's training clicks (none reaches a held-out click)
    train_indptr, train_items = split.train_csr()
    rows = [train_items[a:b].tolist() for a, b in itertools.pairwise(train_indptr)]
    # the same CSR as attributes, as code written against the in-memory split (the reference SASRec) reads it
    np.testing.assert_array_equal(split.train_indptr, train_indptr)
    np.testing.assert_array_equal(split.train_items, train_items)
    for b in range(0, 256, 17):
        n = int(lengths[b])
        window_clicks = [*seq[b, :n].tolist(), int(targets[b, n - 1])]
        assert any(row[i : i + n + 1] == window_clicks for row in rows for i in range(len(row) - n)), window_clicks


def test_leave_one_out_every_user_rules_drop_nothing():
    """The BSARec lineage's rules score every user with 3 clicks, repeated and cold targets included."""
    rows = [[1, 2, 3, 4, 5], [4, 5], [1, 2, 3, 2], [2, 5, 2, 3], [1, 2, 3, 7], [1, 8, 2]]
    split = split_dataset(_sequences(rows), DataConfig(split="leave_one_out", loo_rules="every_user", max_len=2))
    held = {u: row for u, row in enumerate(rows) if len(row) >= 3}
    assert _eval_rows(split.valid) == {u: (row[:-2], [row[-2]]) for u, row in held.items()}
    assert _eval_rows(split.test) == {u: (row[:-1], [row[-1]]) for u, row in held.items()}
    rectools = split_dataset(_sequences(rows), DataConfig(split="leave_one_out", max_len=2))
    assert len(rectools.test) < len(split.test) and len(rectools.valid) < len(split.valid)


def test_leave_one_out_rules_refused_under_other_splits():
    from recsys.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="data.loo_rules: applies to data.split"):
        load_config(None, ["data.loo_rules=every_user"])


@pytest.mark.skipif(not AMAZON_BEAUTY.is_file(), reason="needs ../shared/data/amazon-beauty")
def test_leave_one_out_on_amazon_beauty_matches_rectools_counts():
    """22,363 users, 198,502 clicks: every user trains on all but two; RecTools' rules keep 22,312
    validation and 22,311 test users (no repeated targets; 51 and 52 cold ones)."""
    from recsys.config import load_config
    from recsys.data import load_dataset

    cfg = load_config(None, [f"data.source={AMAZON_BEAUTY}", "data.split=leave_one_out"])
    split = split_dataset(load_dataset(cfg), cfg.data)
    assert (len(split.train_users), split.train_lengths.sum()) == (22_363, 198_502 - 2 * 22_363)
    assert (len(split.valid), len(split.test)) == (22_312, 22_311)
    every = split_dataset(load_dataset(cfg), dataclasses.replace(cfg.data, loo_rules="every_user"))
    assert (len(every.valid), len(every.test)) == (22_363, 22_363)  # BSARec's logs: 22,363 users


@pytest.mark.parametrize("split", ["user", "time", "leave_one_out"])
def test_a_saved_dataset_s_training_rows_are_read_in_place_from_its_mapped_clicks(tmp_path, split):
    """A dataset on disk keeps its clicks memory-mapped through the split and into the samplers
    (a rank reads the rows it samples, never a copy of the log); the rows they read are the
    training clicks of the split, and the counts are those of the copied training rows."""
    from recsys.data.batches import TrainSampler

    random_dataset(300).save(tmp_path / "ds")
    ds = Dataset.load(tmp_path / "ds")
    assert isinstance(ds.items, np.memmap)
    parts = split_dataset(ds, DataConfig(split=split, max_len=5))
    assert parts.clicks is ds.items
    sampler = TrainSampler(parts.clicks_indptr, parts.clicks, 5, seed=0, users=parts.train_users, ends=parts.train_ends)
    assert np.shares_memory(sampler.items, ds.items)
    train_indptr, train_items = parts.train_csr()
    np.testing.assert_array_equal(parts.train_item_counts(ds.num_items), np.bincount(train_items, minlength=301))
    copied = TrainSampler(train_indptr, train_items, 5, seed=0)  # the same rows, copied out
    for got, want in zip(sampler.sample(64), copied.sample(64)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("q", [0.0, 0.3, 0.5, 0.7, 0.95, 1.0])
def test_the_quantile_read_in_blocks_is_numpy_s_to_the_bit(monkeypatch, q):
    """Ties, signs, timestamps, one value; blocks of 7 values."""
    monkeypatch.setattr(split_module, "CLICK_BLOCK", 7)
    rng = np.random.default_rng(1)
    for values in (
        rng.normal(size=101) * 1e3,
        rng.integers(-5, 5, size=64).astype(float),
        1.6e9 + rng.uniform(0, 1e7, size=50),
        np.array([-0.0, 0.0, 1.0, -2.5, 1.0, 0.0]),
        np.array([3.0]),
    ):
        assert quantile(values, q) == np.quantile(values, q)


def _arrays(split) -> dict[str, np.ndarray]:
    sets = {"valid": split.valid, "test": split.test}
    ev = {f"{name}.{key}": value for name, part in sets.items() for key, value in vars(part).items()}
    return {"train_ends": split.train_ends, "train_users": split.train_users, **ev}


@pytest.mark.parametrize("split", ["time", "leave_one_out"])
def test_the_splits_read_in_blocks_split_as_in_one(monkeypatch, split):
    ds, cfg = random_dataset(), DataConfig(split=split, max_len=6, time_cutoff_quantile=0.6)
    whole = split_dataset(ds, cfg)
    monkeypatch.setattr(split_module, "CLICK_BLOCK", 5)
    monkeypatch.setattr(split_module, "USER_BLOCK", 3)
    blocks = split_dataset(ds, cfg)
    assert blocks.cutoff == whole.cutoff
    got, want = _arrays(blocks), _arrays(whole)
    for name, array in want.items():
        if name.endswith(("clicks", "clicks_indptr")):
            assert got[name] is array, name  # the dataset's own
        else:
            np.testing.assert_array_equal(got[name], array, err_msg=name)


@pytest.mark.parametrize("split", ["user", "time", "leave_one_out"])
def test_a_split_holds_no_array_as_long_as_the_log(tmp_path, monkeypatch, split):
    """Split in small blocks, a mapped log of 4M clicks (2,000 users of 2,000) takes less new
    memory than one byte a click: the clicks and times are read in place, and what the split
    computes over them is computed a block at a time (the truth held out is 2% of the clicks; the
    time split's quantile counts 65,536 digits, 1.5 MB)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    users, length = 2000, 2000
    indptr = np.arange(users + 1, dtype=np.int64) * length
    items = rng.integers(1, 301, size=users * length)
    times = (rng.uniform(0, 1e4, size=(users, 1)) + np.cumsum(rng.uniform(0, 1, size=(users, length)), 1)).ravel()
    Dataset(
        item_raw=np.array(["<pad>"] + [str(i) for i in range(1, 301)]),
        user_raw=np.array([f"u{u}" for u in range(users)]),
        indptr=indptr,
        items=items,
        times=times,
        item_category=np.zeros(301, dtype=np.int64),
        category_raw=np.array(["<unknown>"]),
        item_counts=np.bincount(items, minlength=301),
    ).save(tmp_path / "ds")
    ds = Dataset.load(tmp_path / "ds")
    monkeypatch.setattr(split_module, "CLICK_BLOCK", 1 << 12)
    monkeypatch.setattr(split_module, "USER_BLOCK", 4)
    cfg = DataConfig(split=split, max_len=10, time_cutoff_quantile=0.98, eval_input_frac=0.98)
    tracemalloc.start()
    try:
        split_dataset(ds, cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(ds.items), f"{peak:,} bytes for {len(ds.items):,} clicks"
