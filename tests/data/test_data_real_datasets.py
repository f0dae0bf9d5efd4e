"""The real datasets in ../shared/data load with the counts their README states."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recsys.config import DataConfig
from recsys.data.prepare import prepare
from recsys.data.readers import read_interactions
from recsys.data.split import split_dataset

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
pytestmark = [
    pytest.mark.data,
    pytest.mark.skipif(not DATA.is_dir(), reason=f"real datasets not found at {DATA}"),
]

# name: (raw users, raw items, raw clicks) from the README; (users, items, clicks) after
# the default filtering (items >= 5 clicks, then users >= 5 clicks)
COUNTS = {
    "ml-100k": ((943, 1682, 100_000), (943, 1349, 99_287)),
    "amazon-beauty": ((22_363, 12_101, 198_502), (22_363, 12_101, 198_502)),
    "taobao": ((47_703, 53_324, 637_165), (47_235, 37_730, 592_693)),
    "comirec-book-sample": ((1467, 17_049, 20_000), (23, 84, 142)),
}


@functools.cache
def read(name: str) -> pd.DataFrame:
    """The click table of one dataset, read once per test session (tests do not modify it)."""
    path = DATA / name
    if not path.is_dir():
        pytest.skip(f"{path} absent")
    return read_interactions(DataConfig(source=str(path)))


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_raw_counts_match_the_readme(name):
    df = read(name)
    assert (df["user"].nunique(), df["item"].nunique(), len(df)) == COUNTS[name][0]


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_default_filtering(name):
    df = read(name)
    ds = prepare(df, DataConfig())
    stats = ds.stats()
    assert (stats["users"], stats["items"], stats["interactions"]) == COUNTS[name][1]
    # the same filter written plainly with pandas
    items = df["item"].value_counts()
    kept = df[df["item"].isin(items.index[items >= 5])]
    users = kept["user"].value_counts()
    kept = kept[kept["user"].isin(users.index[users >= 5])]
    assert (kept["user"].nunique(), kept["item"].nunique(), len(kept)) == COUNTS[name][1]
    assert np.all(np.diff(ds.item_counts[1:]) <= 0)
    split = split_dataset(ds, DataConfig())
    assert len(split.test) > 0 and len(split.train_users) > 0


def test_movielens_genres_and_times():
    df = read("ml-100k")
    assert df["category"].nunique() == 18  # 19 genres, 'unknown' read as no category
    assert sorted(df.loc[df["category"].isna(), "item"].unique()) == ["1373", "267"]
    ds = prepare(df, DataConfig())
    assert ds.times is not None
    same_user = np.repeat(np.arange(ds.num_users), ds.lengths)
    step = np.diff(ds.times)[np.diff(same_user) == 0]
    assert np.all(step >= 0)


def test_comirec_sample_has_categories_for_every_item():
    df = read("comirec-book-sample")
    assert df["category"].notna().all()
    assert df.attrs["time_is_position"] is True


def test_taobao_has_positions_only():
    df = read("taobao")
    assert df.attrs["time_is_position"] is True
    first_user = df[df["user"] == "1"]
    assert first_user["item"].tolist()[:5] == ["1", "2", "3", "4", "5"]
    assert first_user["time"].tolist()[:3] == [0.0, 1.0, 2.0]


def test_time_split_on_amazon_beauty():
    ds = prepare(read("amazon-beauty"), DataConfig())
    split = split_dataset(ds, DataConfig(split="time"))
    assert len(split.valid) > 100 and len(split.test) > 100
    train_clicks = int(split.train_lengths.sum())
    assert train_clicks == int(np.sum(ds.times < split.cutoff))
