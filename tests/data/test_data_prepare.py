"""Preparation: filtering and k-core, id maps by popularity, ordering, categories, save/load."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from recsys.config import DataConfig
from recsys.data.prepare import Dataset, filter_counts, prepare
from recsys.data.readers import DataError


def clicks(rows: list[tuple], time_is_position: bool = False) -> pd.DataFrame:
    """``rows`` of (user, item, time[, category]) -> a reader-shaped DataFrame."""
    cols = ["user", "item", "time", "category"][: len(rows[0])]
    df = pd.DataFrame(rows, columns=cols).astype({"user": "str", "item": "str", "time": "float64"})
    df.attrs["time_is_position"] = time_is_position
    return df


def sequences(ds: Dataset) -> dict[str, list[str]]:
    """Raw user -> raw items in stored order."""
    return {
        ds.user_raw[u]: ds.item_raw[ds.items[ds.indptr[u] : ds.indptr[u + 1]]].tolist() for u in range(ds.num_users)
    }


def test_filter_items_then_users_and_kcore():
    # items a (3 clicks), b (2), c (1); users: u1 {a,b,c}, u2 {a,b}, u3 {a}
    users = np.array([0, 0, 0, 1, 1, 2])
    items = np.array([0, 1, 2, 0, 1, 0])
    once = filter_counts(users, items, min_item_count=2, min_user_count=2, kcore=False)
    # c goes (1 click); then u3 (1 click) goes; a now has 2 clicks, still fine
    assert once.tolist() == [True, True, False, True, True, False]
    strict = filter_counts(users, items, min_item_count=3, min_user_count=2, kcore=False)
    # only a survives the item filter; every user then has <= 1 click of a
    assert not strict.any()
    # users u0 {a,b}, u1 {a,b}, u2 {a,c}, u3 {c}: one pass drops u3, which leaves c with one
    # click; k-core goes on: c drops, then u2 (one click left)
    users = np.array([0, 0, 1, 1, 2, 2, 3])
    items = np.array([0, 1, 0, 1, 0, 2, 2])
    one_pass = filter_counts(users, items, 2, 2, kcore=False)
    assert one_pass.tolist() == [True] * 6 + [False]
    core = filter_counts(users, items, 2, 2, kcore=True)
    assert core.tolist() == [True] * 4 + [False] * 3


def test_ids_by_falling_popularity_ties_by_numeric_raw_id():
    df = clicks(
        [
            ("u1", "10", 0),
            ("u1", "9", 1),
            ("u2", "10", 0),
            ("u2", "9", 1),
            ("u2", "100", 2),
            ("u3", "100", 0),
            ("u3", "10", 1),
            ("u3", "2", 2),
        ]
    )
    ds = prepare(df, DataConfig(min_item_count=0, min_user_count=0))
    # 10: 3 clicks; 9 and 100: 2 (tie: 9 < 100 numerically); 2: 1
    assert ds.item_raw.tolist() == ["<pad>", "10", "9", "100", "2"]
    assert ds.item_counts.tolist() == [0, 3, 2, 2, 1]
    assert ds.num_items == 5
    shuffled = df.sample(frac=1, random_state=3).reset_index(drop=True)
    again = prepare(shuffled, DataConfig(min_item_count=0, min_user_count=0))
    assert again.item_raw.tolist() == ds.item_raw.tolist()
    assert again.user_raw.tolist() == ["u1", "u2", "u3"]


def test_text_ids_tie_break_lexicographically():
    df = clicks([("b", "y", 0), ("a", "x", 0), ("a", "z", 1)])
    ds = prepare(df, DataConfig(min_item_count=0, min_user_count=0))
    assert ds.item_raw.tolist() == ["<pad>", "x", "y", "z"]
    assert ds.user_raw.tolist() == ["a", "b"]


def test_sequences_sorted_by_time_with_stable_ties():
    df = clicks([("u", "a", 5), ("u", "b", 1), ("v", "c", 0), ("u", "c", 5), ("u", "d", 1), ("u", "e", 3)])
    ds = prepare(df, DataConfig(min_item_count=0, min_user_count=0))
    assert sequences(ds)["u"] == ["b", "d", "e", "a", "c"]  # equal times keep row order
    assert ds.times.tolist() == [1, 1, 3, 5, 5, 0]
    assert ds.indptr.tolist() == [0, 5, 6]


def test_positions_only_source_keeps_no_times():
    ds = prepare(
        clicks([("u", "a", 0), ("u", "b", 1)], time_is_position=True), DataConfig(min_item_count=0, min_user_count=0)
    )
    assert ds.times is None
    assert ds.stats()["timestamps"] is False


def test_categories_first_label_unknown_zero_and_popularity_order():
    df = clicks(
        [
            ("u", "a", 0, "X"),
            ("u", "b", 1, None),
            ("v", "b", 0, "Y"),
            ("v", "c", 1, "Z"),
            ("v", "a", 2, "Q"),
            ("w", "b", 0, "Y"),
            ("w", "d", 1, None),
        ]
    )
    df["category"] = df["category"].astype("str")
    ds = prepare(df, DataConfig(min_item_count=0, min_user_count=0))
    by_item = dict(zip(ds.item_raw.tolist(), ds.category_raw[ds.item_category].tolist()))
    # b's first non-missing label is Y; a keeps X (its first); d has none
    assert by_item == {"<pad>": "<unknown>", "b": "Y", "a": "X", "c": "Z", "d": "<unknown>"}
    assert ds.category_raw.tolist() == ["<unknown>", "Y", "X", "Z"]  # by clicks: Y 3, X 2, Z 1
    assert ds.item_category[0] == 0


def test_filtering_applies_before_ids():
    rows = [(f"u{u}", "pop", u) for u in range(5)] + [("u0", "rare", 9)]
    ds = prepare(clicks(rows), DataConfig(min_item_count=2, min_user_count=1))
    assert ds.item_raw.tolist() == ["<pad>", "pop"]
    with pytest.raises(DataError, match="no clicks left after filtering"):
        prepare(clicks(rows), DataConfig(min_item_count=2, min_user_count=2))


def test_errors_name_the_file_the_clicks_came_from():
    df = clicks([("u", "a", 0)])
    df.attrs["source"] = "data/log.csv"
    with pytest.raises(DataError, match=r"^data/log\.csv: no clicks left after filtering \(data\.min_item_count=5"):
        prepare(df, DataConfig())
    with pytest.raises(DataError, match=r"^data/log\.csv: lacks columns \['time'\]"):
        prepare(df.drop(columns="time"), DataConfig())


def test_missing_columns_and_values_are_errors():
    with pytest.raises(DataError, match=r"lacks columns \['time'\]"):
        prepare(pd.DataFrame({"user": ["a"], "item": ["b"]}), DataConfig())
    df = clicks([("a", "x", 0), ("b", "y", 0)])
    df.loc[1, "item"] = None
    with pytest.raises(DataError, match="1 row with a missing item"):
        prepare(df, DataConfig(min_item_count=0, min_user_count=0))


def test_save_load_round_trip_and_encode(tmp_path):
    df = clicks([("u1", "a", 0, "X"), ("u1", "b", 1, "Y"), ("u2", "a", 0, "X")])
    ds = prepare(df, DataConfig(min_item_count=0, min_user_count=0))
    ds.save(tmp_path / "ds")
    back = Dataset.load(tmp_path / "ds")
    for name in ("item_raw", "user_raw", "indptr", "items", "times", "item_category", "category_raw", "item_counts"):
        np.testing.assert_array_equal(getattr(back, name), getattr(ds, name), err_msg=name)
    assert back.stats() == ds.stats()
    ids, unknown = back.item_map.encode(["b", "zz", "a", "<pad>"])
    assert ids.tolist() == [2, 1] and unknown == ["zz", "<pad>"]
    users, unknown = back.user_map.encode(["u2", "nobody"])
    assert users.tolist() == [1] and unknown == ["nobody"]


def test_id_map_encodes_decodes_and_names_unknown_ids():
    rows = [("7", "10", 0), ("7", "2", 1), ("8", "10", 0)]
    ds = prepare(clicks(rows), DataConfig(min_item_count=0, min_user_count=0))
    items = ds.item_map
    assert items.lookup([10, "2", "3"]).tolist() == [1, 2, -1]  # numbers are looked up by their text
    assert items.decode(np.array([[2, 1]])).tolist() == [["2", "10"]]
    assert items.lookup(["<pad>"]).tolist() == [-1]  # padding is never an answer
    assert ds.user_map.require(["8", "7"], "users").tolist() == [1, 0]
    with pytest.raises(ValueError, match=r"^--users: 2 unknown user ids: 'x', '9'$"):
        ds.user_map.require(["7", "x", "9"], "--users")
    with pytest.raises(ValueError, match=r"item id 0 is outside 1\.\.2"):
        items.decode(np.array([1, 0]))
    with pytest.raises(TypeError, match="a list of raw item ids"):
        items.encode("10")


def test_load_rejects_inconsistent_files(tmp_path):
    ds = prepare(clicks([("u", "a", 0), ("u", "b", 1)]), DataConfig(min_item_count=0, min_user_count=0))
    ds.items = np.array([1, 7])
    ds.save(tmp_path / "bad")
    with pytest.raises(DataError, match="items must be in 1..num_items-1"):
        Dataset.load(tmp_path / "bad")
    with pytest.raises(DataError, match="not a saved dataset"):
        Dataset.load(tmp_path / "nothing")


def test_stats():
    df = clicks([("u1", "a", 0), ("u1", "b", 1), ("u1", "a", 2), ("u2", "a", 0)])
    s = prepare(df, DataConfig(min_item_count=0, min_user_count=0)).stats()
    assert (s["users"], s["items"], s["interactions"]) == (2, 2, 4)
    assert (s["mean_length"], s["median_length"], s["max_length"]) == (2.0, 2.0, 3)
    assert s["density"] == pytest.approx(3 / 4)  # cells (u1, a), (u1, b), (u2, a): a repeat counts once
    assert s["categories"] == 0


def test_all_missing_categories_map_to_unknown():
    df = clicks([("u", "a", 0, None), ("u", "b", 1, None)])
    df["category"] = df["category"].astype("str")
    ds = prepare(df, DataConfig(min_item_count=0, min_user_count=0))
    assert ds.category_raw.tolist() == ["<unknown>"]
    assert ds.item_category.tolist() == [0, 0, 0]
