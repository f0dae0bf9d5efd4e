"""`recsys data`'s statistics (was: a density of 10.27 for a single user)."""

import numpy as np
import pandas as pd

from recsys.config import DataConfig
from recsys.data import describe, prepare, read_frame


def _dataset(users, items):
    cfg = DataConfig(source="", min_item_count=1, min_user_count=1, time_col="")
    return prepare(read_frame(pd.DataFrame({"user": users, "item": items}), cfg, "clicks"), cfg)


def test_density_counts_each_user_item_cell_once():
    one_user = _dataset(["u"] * 30, ["a", "b", "c"] * 10)  # 3 items, each clicked 10 times
    assert one_user.stats()["density"] == 1.0 and "density       1.00000" in describe(one_user)
    two = _dataset(["u", "u", "u", "v"], ["a", "a", "b", "a"])  # cells (u,a), (u,b), (v,a) of 2 × 2
    assert two.stats()["density"] == 0.75


def test_distinct_pairs_over_blocks_equals_one_pass():
    rng = np.random.default_rng(0)
    users = rng.integers(0, 50, 2000).astype(str)
    ds = _dataset(users, rng.integers(0, 40, 2000).astype(str))
    rows = np.repeat(np.arange(ds.num_users), np.diff(ds.indptr))
    expected = len(set(zip(rows.tolist(), ds.items.tolist())))
    assert ds.distinct_pairs() == ds.distinct_pairs(block=7) == ds.distinct_pairs(block=1) == expected
