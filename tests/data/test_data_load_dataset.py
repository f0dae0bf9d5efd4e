"""load_dataset (read or generate, prepare, cache) and describe."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from recsys.config import load_config
from recsys.data import DataWarning, describe, load_dataset


def small_synthetic(tmp_path, *extra: str):
    return load_config(
        None,
        [
            "synthetic.num_users=200",
            "synthetic.num_items=100",
            "synthetic.num_categories=5",
            f"data.cache_dir={tmp_path / 'cache'}",
            *extra,
        ],
    )


def test_synthetic_source_and_cache(tmp_path):
    cfg = small_synthetic(tmp_path)
    first = load_dataset(cfg)
    entries = list((tmp_path / "cache").iterdir())
    assert len(entries) == 1 and (entries[0] / "items.npy").is_file()
    cached = load_dataset(cfg)
    np.testing.assert_array_equal(cached.items, first.items)
    np.testing.assert_array_equal(cached.item_raw, first.item_raw)
    assert first.num_users == 200 and first.num_categories == 6
    load_dataset(small_synthetic(tmp_path, "synthetic.seed=8"))
    assert len(list((tmp_path / "cache").iterdir())) == 2  # another setting, another entry


def test_cache_follows_the_source_file(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("user,item,timestamp\n" + "".join(f"u{u},i{i},{i}\n" for u in range(3) for i in range(2)))
    cfg = load_config(
        None,
        [
            f"data.source={path}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "data.min_item_count=1",
            "data.min_user_count=1",
        ],
    )
    assert load_dataset(cfg).num_users == 3
    path.write_text(path.read_text() + "u9,i0,5\n")
    os.utime(path, ns=(0, 10**9))  # a different size and mtime: the cached entry is stale
    assert load_dataset(cfg).num_users == 4


def test_describe_reports_counts_after_filtering(tmp_path):
    text = describe(load_dataset(small_synthetic(tmp_path)))
    lines = dict(line.split(None, 1) for line in text.splitlines())
    assert lines["users"] == "200"
    assert lines["items"] == "100"
    assert lines["categories"].startswith("5 ")
    assert lines["timestamps"] == "yes"


@pytest.mark.parametrize("prepare", ["memory", "disk"])
def test_a_user_holding_most_clicks_is_named_with_the_share(tmp_path, prepare):
    if prepare == "disk":
        pytest.importorskip("duckdb")
    people = [(f"u{t % 6}", f"i{t % 3}", t) for t in range(30)]
    for name, rows in (("people", people), ("bot", [("bot", f"i{t % 9}", t) for t in range(470)] + people)):
        (tmp_path / f"{name}.csv").write_text("user,item,timestamp\n" + "".join(f"{u},{i},{t}\n" for u, i, t in rows))

    def load(name: str) -> None:
        source = tmp_path / f"{name}.csv"
        load_dataset(
            load_config(None, [f"data.source={source}", f"data.prepare={prepare}", f"data.cache_dir={tmp_path}"])
        )

    with pytest.warns(DataWarning, match=r"bot\.csv: user 'bot' holds 94% of the 500 clicks after filtering; "):
        load("bot")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        load("people")  # the largest user holds 5 of 30 clicks
