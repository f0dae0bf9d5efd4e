"""``data.held_out_items``: every click on the listed items leaves the training part of each split,
and nothing else does; the ids are read by the id rule, checked, and saved with the dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_data_split import random_dataset

from recsys.config import DataConfig, load_config
from recsys.data import DataError, describe, load_dataset, split_dataset
from recsys.data.prepare import Dataset
from recsys.data.split import read_held_out

HELD = np.array([1, 7, 150, 300])  # the most clicked item, two in the middle, the last id
SPLITS = [
    DataConfig(split="user", seed=3),
    DataConfig(split="time"),
    DataConfig(split="leave_one_out"),
    DataConfig(split="leave_one_out", loo_rules="every_user"),
]


def held(ds: Dataset, items: np.ndarray = HELD) -> Dataset:
    ds.held_out = np.asarray(items, dtype=np.int64)
    return ds


@pytest.mark.parametrize("cfg", SPLITS, ids=lambda c: f"{c.split}-{c.loo_rules}")
def test_held_out_items_leave_training_and_nothing_else(cfg):
    ds = random_dataset(num_users=400, min_len=3)
    every, without = split_dataset(ds, cfg), split_dataset(held(random_dataset(num_users=400, min_len=3)), cfg)
    counts, before = without.train_item_counts(ds.num_items), every.train_item_counts(ds.num_items)
    assert before[HELD].min() > 0 and counts[HELD].tolist() == [0] * len(HELD)  # their training count is 0
    others = np.setdiff1d(np.arange(ds.num_items), HELD)
    np.testing.assert_array_equal(counts[others], before[others])  # every other training click stays
    rows = {int(u): r for r, u in enumerate(every.train_users)}
    indptr, items = every.train_csr()
    kept_indptr, kept = without.train_csr()
    assert set(without.train_users) <= set(rows)
    for r, u in enumerate(without.train_users):  # each row, in order, less the held-out clicks
        row = items[indptr[rows[int(u)]] : indptr[rows[int(u)] + 1]]
        np.testing.assert_array_equal(kept[kept_indptr[r] : kept_indptr[r + 1]], row[~np.isin(row, HELD)])
    assert len(without.train_users) == sum(
        np.isin(items[indptr[r] : indptr[r + 1]], HELD, invert=True).any() for r in rows.values()
    )
    for name in ("valid", "test"):  # evaluation keeps them in inputs and truth
        a, b = getattr(every, name), getattr(without, name)
        for field in ("users", "inputs", "lengths", "truth_indptr", "truth_items", "input_end"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=f"{name}.{field}")
        assert np.isin(b.truth_items, HELD).any() and np.isin(b.inputs[:, :2], HELD).any()


def test_a_user_whose_training_clicks_are_all_held_out_leaves_training():
    ds = random_dataset(num_users=50, min_len=3)
    cfg = DataConfig(split="leave_one_out", loo_rules="every_user")
    u = 0
    first = held(random_dataset(num_users=50, min_len=3), np.unique(ds.items[ds.indptr[u] : ds.indptr[u + 1] - 2]))
    split = split_dataset(first, cfg)
    assert u not in split.train_users and u in split.test.users


def write_ids(path: Path, *lines: str) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_the_file_is_read_by_the_id_rule_and_unknown_ids_are_named(tmp_path):
    ds = random_dataset(num_users=50)
    ids = read_held_out(DataConfig(held_out_items=str(write_ids(tmp_path / "h.txt", "7", " 3.0 ", "", "7"))), ds)
    assert ids.tolist() == [3, 7]  # raw "3.0" is "3"; blank lines and repeats are skipped
    assert read_held_out(DataConfig(), ds) is None
    with pytest.raises(DataError, match=r"h2.txt: 2 item ids not among the prepared items .*'x', '301'"):
        read_held_out(DataConfig(held_out_items=str(write_ids(tmp_path / "h2.txt", "5", "x", "301"))), ds)
    with pytest.raises(DataError, match="data.held_out_items: cannot read"):
        read_held_out(DataConfig(held_out_items=str(tmp_path / "missing.txt")), ds)


def test_load_dataset_carries_them_into_the_saved_dataset(tmp_path):
    path = tmp_path / "clicks.csv"
    path.write_text("user,item\n" + "".join(f"u{u},i{(u * 7 + k) % 13}\n" for u in range(30) for k in range(6)))
    sets = [f"data.source={path}", "data.time_col=", "data.min_item_count=1", "data.min_user_count=1"]
    sets.append(f"data.cache_dir={tmp_path / 'cache'}")
    plain = load_dataset(load_config(None, sets))
    cfg = load_config(None, [*sets, f"data.held_out_items={write_ids(tmp_path / 'h.txt', 'i3', 'i5')}"])
    ds = load_dataset(cfg)  # the cached dataset, with the held-out ids set on it
    assert plain.held_out is None and ds.held_out is not None
    assert ds.item_raw[ds.held_out].tolist() == sorted(["i3", "i5"], key=lambda raw: ds.item_map.lookup([raw])[0])
    assert "held out      2 items, " in describe(ds)
    ds.save(tmp_path / "saved")
    np.testing.assert_array_equal(Dataset.load(tmp_path / "saved").held_out, ds.held_out)
    assert load_dataset(load_config(None, sets)).held_out is None  # the cache shared by every held-out set
    counts = split_dataset(ds, cfg.data).train_item_counts(ds.num_items)
    assert counts[ds.held_out].sum() == 0


def test_the_run_represents_them_by_their_features_alone(tmp_path):
    """With item features the held-out items are not warm: the item table reads their features only."""
    from recsys.run import build_experiment

    path = tmp_path / "clicks.csv"
    path.write_text("user,item\n" + "".join(f"u{u},i{(u * 7 + k) % 13}\n" for u in range(30) for k in range(6)))
    features = tmp_path / "items.json"
    features.write_text("{" + ", ".join(f'"i{i}": [{i % 3}, {10 + i % 4}]' for i in range(13)) + "}")
    sets = [f"data.source={path}", "data.time_col=", "data.min_item_count=1", "data.min_user_count=1"]
    sets += [f"data.item_features={features}", f"data.held_out_items={write_ids(tmp_path / 'h.txt', 'i3')}"]
    sets += ["model.name=comirec_sa", "model.backend=torch"]
    exp = build_experiment(load_config(None, sets))
    (item,) = exp.dataset.held_out
    assert int(exp.item_counts[item]) == 0 and exp.dataset.item_counts[item] > 0
    warm = exp.model.embedding.warm
    assert warm is not None and not bool(warm[item]) and bool(warm[1:].sum() == exp.dataset.num_items - 2)
