"""One id rule for every input path (was: in a DataFrame ``1`` and ``"1"``, ``17`` and
``17.0`` became one id; in a CSV they stayed two)."""

import numpy as np
import pandas as pd
import pytest

from recsys.config import DataConfig
from recsys.data import prepare, read_frame, read_interactions
from recsys.data.ids import canonical_id, canonical_ids, factorize_ids

# user u1 clicks item 17 written three ways, item 7 and item 007 (two ids: leading zeros count)
USERS = ["u1", "u1", "u1", "u1", "u1", "u2", "u2", "u2"]
ITEMS = ["17", "17.0", "17.00", "7", "007", "1", "1.0", "-3.0"]


def _ids(ds):
    return sorted(ds.item_raw[1:].tolist())


def _config(path="") -> DataConfig:
    return DataConfig(source=str(path), min_item_count=1, min_user_count=1, time_col="", max_len=5)


def test_the_rule():
    assert [canonical_id(x) for x in ("17", "17.0", "17.00", 17.0, 17, "-3.0", "007", "7.5", "1e3", " 17.0")] == [
        "17",
        "17",
        "17",
        "17",
        "17",
        "-3",
        "007",
        "7.5",
        "1e3",
        " 17.0",
    ]
    assert canonical_ids(np.array(["17.0", "x.0", "0.0", "10"])).tolist() == ["17", "x.0", "0", "10"]
    codes, names = factorize_ids(pd.Series(["17", "17.0", None, "8"]))
    assert codes.tolist() == [0, 0, -1, 1] and names.tolist() == ["17", "8"]


def test_a_csv_and_a_dataframe_of_the_same_clicks_give_the_same_ids(tmp_path):
    path = tmp_path / "clicks.csv"
    path.write_text("user,item\n" + "".join(f'{u},"{i}"\n' for u, i in zip(USERS, ITEMS)))
    from_csv = prepare(read_interactions(_config(path)), _config(path))
    frame = pd.DataFrame({"user": USERS, "item": [17, 17.0, "17.00", 7, "007", 1, "1", -3.0]})
    from_frame = prepare(read_frame(frame, _config(), "clicks"), _config())
    assert _ids(from_csv) == _ids(from_frame) == ["-3", "007", "1", "17", "7"]
    assert from_csv.item_counts[from_csv.item_map.lookup(["17"])[0]] == 3  # one item, three clicks


@pytest.mark.parametrize("asked", ["17.0", 17, 17.0, "17"])
def test_lookups_follow_the_rule(tmp_path, asked):
    frame = pd.DataFrame({"user": USERS, "item": ITEMS})
    ds = prepare(read_frame(frame, _config(), "clicks"), _config())
    assert ds.item_map.lookup([asked])[0] == ds.item_map.lookup(["17"])[0] > 0
    assert ds.item_map.lookup(["7"])[0] != ds.item_map.lookup(["007"])[0]
