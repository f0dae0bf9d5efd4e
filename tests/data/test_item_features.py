"""Item features (data.item_features): every format, multi-valued fields, dense vectors, alignment
with the internal item ids (new items included), the errors, persistence and the cache key."""

from __future__ import annotations

import gzip
import json
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recsys.config import ConfigError, DataConfig, load_config
from recsys.data import DataError, DataWarning, describe, load_dataset
from recsys.data.feature_readers import JSON_FIELD
from recsys.data.features import ItemFeatures
from recsys.data.prepare import Dataset, prepare
from recsys.data.readers import read_interactions

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"

# clicks on i1 (4 clicks), i2 (3), i3 (2), i4 (1): internal ids 1, 2, 3, 4 by falling popularity
CLICKS = [("u1", "i1"), ("u1", "i2"), ("u1", "i3"), ("u2", "i1"), ("u2", "i2"), ("u2", "i4")]
CLICKS += [("u3", "i1"), ("u3", "i2"), ("u3", "i3"), ("u4", "i1")]


def clicks_file(tmp_path: Path) -> Path:
    path = tmp_path / "clicks.csv"
    path.write_text("user,item\n" + "".join(f"{u},{i}\n" for u, i in CLICKS))
    return path


def config(tmp_path: Path, features: Path, **settings) -> DataConfig:
    return DataConfig(
        source=str(clicks_file(tmp_path)),
        time_col="",
        min_item_count=1,
        min_user_count=1,
        item_features=str(features),
        **settings,
    )


def prepared(tmp_path: Path, features: Path, **settings) -> Dataset:
    cfg = config(tmp_path, features, **settings)
    return prepare(read_interactions(cfg), cfg)


def features_of(ds: Dataset) -> ItemFeatures:
    assert ds.features is not None
    return ds.features


def values(features: ItemFeatures, field: str, raw_item: str, ds: Dataset) -> list[str]:
    """The raw values of ``field`` for the raw item id ``raw_item`` (clicked or new)."""
    names = list(ds.item_raw) + list(features.new_raw)
    (f,) = [f for f in features.fields if f.name == field]
    return f.values_of(names.index(raw_item)).tolist()


def test_csv_single_and_multi_valued_fields_align_with_the_item_ids(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text("brand,item,tags\nacme,i3,red|blue\n,i1, red \nzeta,i2,\nacme,z9,blue|red|blue\nacme,a1,green\n")
    ds = prepared(tmp_path, path)
    f = features_of(ds)
    assert ds.item_raw.tolist() == ["<pad>", "i1", "i2", "i3", "i4"]
    assert [field.name for field in f.fields] == ["brand", "tags"]
    assert f.num_known == 5 and f.num_new == 2 and f.num_items == 7
    assert f.new_raw.tolist() == ["a1", "z9"]  # after the clicked items, in raw-id order, not file order
    assert values(f, "brand", "i3", ds) == ["acme"] and values(f, "brand", "i1", ds) == []
    assert values(f, "tags", "i3", ds) == ["red", "blue"]  # file order within an item
    assert values(f, "tags", "i1", ds) == ["red"]  # trimmed
    assert values(f, "tags", "z9", ds) == ["blue", "red"]  # a value repeated in one item counts once
    assert values(f, "tags", "i4", ds) == []  # a clicked item without a row
    brand, tags = f.fields
    assert brand.vocab.tolist() == ["<none>", "acme", "zeta"]  # ids by falling item count, 0 = none
    assert tags.vocab.tolist() == ["<none>", "red", "blue", "green"]  # on 3, 2 and 1 items
    assert tags.vocab_size == 4 and tags.indptr.shape == (8,) and tags.indptr[1] == 0  # padding row 0 is empty
    assert f.dense is None and f.dense_mask is None
    assert "2 new items" in describe(ds) and "3 of 4 clicked items covered" in describe(ds)


def test_compressed_tsv_with_its_own_item_column(tmp_path):
    path = tmp_path / "items.tsv.gz"
    with gzip.open(path, "wt") as f:
        f.write("id\tsize\ni1\tS|M\ni2\tM\n")
    ds = prepared(tmp_path, path, feature_item_col="id")
    f = features_of(ds)
    assert f.num_new == 0
    assert values(f, "size", "i1", ds) == ["S", "M"] and values(f, "size", "i2", ds) == ["M"]


def test_whole_number_ids_and_values_follow_the_id_rule(tmp_path):
    clicks = tmp_path / "clicks.csv"
    clicks.write_text("user,item\n1,7\n1,8\n2,7\n")
    path = tmp_path / "items.tsv"
    path.write_text("item\tsize\n7.0\t10.0|2\n8\t10\n")
    cfg = DataConfig(source=str(clicks), time_col="", min_item_count=1, min_user_count=1, item_features=str(path))
    ds = prepare(read_interactions(cfg), cfg)
    f = features_of(ds)
    assert f.num_new == 0
    assert values(f, "size", "7", ds) == ["10", "2"] and values(f, "size", "8", ds) == ["10"]


def test_parquet_scalar_list_and_vector_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "item": ["i2", "i1", "n1"],
            "brand": ["b", None, "a"],
            "tags": pa.array([["x", "y"], None, ["y", None]], type=pa.list_(pa.string())),
            "level": pa.array([1.0, 2.0, None]),  # a float column of whole numbers: "1", "2"
            "emb": pa.array([[1.0, 2.0], None, [3.0, 4.0]], type=pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, tmp_path / "items.parquet")
    ds = prepared(tmp_path, tmp_path / "items.parquet", feature_vector_col="emb")
    f = features_of(ds)
    assert [field.name for field in f.fields] == ["brand", "tags", "level"]
    assert values(f, "tags", "i2", ds) == ["x", "y"] and values(f, "tags", "n1", ds) == ["y"]
    assert values(f, "level", "i1", ds) == ["2"] and values(f, "brand", "i1", ds) == []
    assert f.dense is not None and f.dense_mask is not None
    assert f.dense.shape == (6, 2) and f.dense.dtype == np.float32  # 5 known ids and one new item
    np.testing.assert_array_equal(f.dense[2], [1.0, 2.0])  # i2
    np.testing.assert_array_equal(f.dense[5], [3.0, 4.0])  # n1, the new item
    np.testing.assert_array_equal(f.dense_mask, [False, False, True, False, False, True])
    np.testing.assert_array_equal(f.dense[1], [0.0, 0.0])  # i1: no vector, zeros


def test_parquet_fixed_size_vectors(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    emb = pa.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], type=pa.list_(pa.float64(), 3))
    pq.write_table(pa.table({"item": [1, 2], "emb": emb}), tmp_path / "items.parquet")
    clicks = tmp_path / "clicks.csv"
    clicks.write_text("user,item\nu,1\nu,2\nv,2\n")
    cfg = DataConfig(
        source=str(clicks),
        time_col="",
        min_item_count=1,
        min_user_count=1,
        item_features=str(tmp_path / "items.parquet"),
        feature_vector_col="emb",
    )
    f = features_of(prepare(read_interactions(cfg), cfg))
    assert f.fields == [] and f.dim == 3
    np.testing.assert_array_equal(f.dense, [[0, 0, 0], [4, 5, 6], [1, 2, 3]])  # item 2 is clicked most: id 1


def test_json_object_of_lists_is_one_field(tmp_path):
    path = tmp_path / "item_attributes.json"
    path.write_text(json.dumps({"i1": [1, 2, 3], "i2": [2], "new": [4, 4], "i3": 5, "i4": None}))
    ds = prepared(tmp_path, path)
    f = features_of(ds)
    assert [field.name for field in f.fields] == [JSON_FIELD]
    assert values(f, JSON_FIELD, "i1", ds) == ["1", "2", "3"]
    assert values(f, JSON_FIELD, "i3", ds) == ["5"] and values(f, JSON_FIELD, "i4", ds) == []
    assert f.new_raw.tolist() == ["new"] and values(f, JSON_FIELD, "new", ds) == ["4"]
    assert f.fields[0].vocab.tolist() == ["<none>", "2", "1", "3", "4", "5"]


def test_json_object_of_fields_and_json_lines_with_vectors(tmp_path):
    rows = {"i1": {"brand": "a", "tags": ["x", "y"], "emb": [1, 2]}, "i2": {"brand": "b", "emb": None}}
    (tmp_path / "items.json").write_text(json.dumps(rows, indent=2))
    lines = "".join(json.dumps({"item": item, **fields}) + "\n" for item, fields in rows.items())
    (tmp_path / "items.jsonl").write_text(lines + "\n")  # a blank line is passed over
    for name in ("items.json", "items.jsonl"):
        ds = prepared(tmp_path, tmp_path / name, feature_vector_col="emb")
        f = features_of(ds)
        assert [field.name for field in f.fields] == ["brand", "tags"], name
        assert values(f, "tags", "i1", ds) == ["x", "y"] and values(f, "brand", "i2", ds) == ["b"]
        assert f.dense is not None and f.dense_mask is not None
        np.testing.assert_array_equal(f.dense[1], [1.0, 2.0])
        np.testing.assert_array_equal(f.dense_mask, [False, True, False, False, False])


def test_movielens_u_item_gives_its_genres(tmp_path):
    folder = tmp_path / "ml"
    folder.mkdir()
    (folder / "u.genre").write_text("unknown|0\nAction|1\nComedy|2\n")
    (folder / "u.item").write_text("i1|A (1995)|01-Jan-1995||http://x|0|1|1\ni9|B (1995)|01-Jan-1995||http://x|1|0|0\n")
    ds = prepared(tmp_path, folder / "u.item")
    f = features_of(ds)
    assert values(f, "genre", "i1", ds) == ["Action", "Comedy"]
    assert values(f, "genre", "i9", ds) == []  # the unknown genre is no genre
    assert f.new_raw.tolist() == ["i9"]


def error_of(tmp_path: Path, name: str, content: str | bytes | None, **settings) -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(DataError) as err:
        prepared(tmp_path, path, **settings)
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("name", "content", "settings", "where", "says"),
    [
        ("f.csv", "id,brand\ni1,a\n", {}, ":1", "no column 'item' (data.feature_item_col)"),
        (
            "f.csv",
            "item,brand\ni1,a\n",
            {"feature_vector_col": "emb"},
            ":1",
            "no column 'emb' (data.feature_vector_col)",
        ),
        ("f.csv", "item,brand\ni1,a\n\n ,b\n", {}, ":4", "empty item (field 1)"),
        ("f.csv", "item,brand\ni1,a\ni2,b,c\n", {}, ":3", "expected 2 fields, found 3"),
        (
            "f.csv",
            "item,brand\ni1,a\ni2,b\ni1.0,c\ni1,d\n",
            {},
            ":5",
            "item 'i1' again (column 'item'; its first row is line 2)",
        ),
        ("f.csv", 'item,brand\ni1,"a\ni2,b\n', {}, ":2", "a quote opens here and is never closed"),
        ("f.csv", "item,brand\ni1,a\ni2,caf\xe9\n".encode("latin-1"), {}, ":3", "not valid utf-8 text"),
        (
            "f.csv",
            "item,emb\ni1,1|2\ni2,1|2|3\n",
            {"feature_vector_col": "emb"},
            ":3",
            "column 'emb': a vector of 3 values; the first one (line 2) has 2",
        ),
        (
            "f.csv",
            "item,emb\ni1,1|2\ni2,1|x\n",
            {"feature_vector_col": "emb"},
            ":3",
            "column 'emb': value 2 is nan (not a finite number)",
        ),
        ("f.csv", "item,emb\ni1,1|inf\n", {"feature_vector_col": "emb"}, ":2", "column 'emb': value 2 is inf"),
        ("f.csv", "item,a,a\ni1,x,y\n", {}, ":1", "the header names column 'a' more than once"),
        (
            "f.json",
            '{"i1": [1],\n "i2": {"a": {"b": 1}}}',
            {},
            ":2",
            "field 'a': expected a value or a list of values, found {\"b\": 1}",
        ),
        (
            "f.json",
            '{"i1": [1],\n "i2": [2],\n "i1": [3]}',
            {},
            ":3",
            "item 'i1' again (the key; its first row is line 1)",
        ),
        ("f.json", '{"i1": [1],\n "i2": [2,}', {}, ":2", "not valid JSON"),
        ("f.json", '[["i1", 1]]', {}, ":1", "expected a JSON object {item: values}"),
        (
            "f.json",
            '{"i1": {"emb": [1, "x"]}}',
            {"feature_vector_col": "emb"},
            ":1",
            "field 'emb': expected a list of numbers",
        ),
        ("f.jsonl", '{"item": "i1"}\n{"item": "i2"\n', {}, ":2", "not valid JSON"),
        ("f.jsonl", '{"item": "i1"}\n["i2"]\n', {}, ":2", "expected a JSON object"),
        ("f.jsonl", '{"item": "i1"}\n\n{"name": "i2"}\n', {}, ":3", "no field 'item' (data.feature_item_col)"),
        ("f.jsonl", '{"item": "i1"}\n{"item": [1]}\n', {}, ":2", "field 'item': expected an item id"),
        (
            "f.jsonl",
            '{"item": "i1", "emb": [1, null]}\n',
            {"feature_vector_col": "emb"},
            ":1",
            "field 'emb': value 2 is nan",
        ),
        (
            "f.jsonl",
            '{"item": "i1"}\n',
            {"feature_vector_col": "emb"},
            "",
            "no vectors in field 'emb' (data.feature_vector_col)",
        ),
    ],
)
def test_every_error_names_the_file_line_and_field(tmp_path, name, content, settings, where, says):
    message = error_of(tmp_path, name, content, **settings)
    assert message.startswith(f"{tmp_path / name}{where}: "), message
    assert says in message, message


def test_parquet_errors_name_the_row_and_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "f.parquet"
    cases = [
        ({"id": ["i1"]}, {}, "", "no column 'item' (data.feature_item_col); the columns are ['id']"),
        ({"item": ["i1", None]}, {}, ": row 2", "empty item (column 'item')"),
        ({"item": ["i1", "i1"]}, {}, ": row 2", "item 'i1' again (column 'item'; its first row is row 1)"),
        ({"item": ["i1"], "deep": pa.array([[[1]]])}, {}, "", "column 'deep' holds list<"),
        (
            {"item": ["i1"], "emb": ["x"]},
            {"feature_vector_col": "emb"},
            "",
            "column 'emb' (data.feature_vector_col) holds string",
        ),
        (
            {"item": ["i1", "i2"], "emb": [[1.0], [1.0, 2.0]]},
            {"feature_vector_col": "emb"},
            ": row 2",
            "a vector of 2 values",
        ),
        (
            {"item": ["i1", "i2"], "emb": [[1.0], [float("nan")]]},
            {"feature_vector_col": "emb"},
            ": row 2",
            "value 1 is nan",
        ),
        ({"item": ["i1", "i2"], "emb": [[1.0], [None]]}, {"feature_vector_col": "emb"}, ": row 2", "value 1 is nan"),
    ]
    for columns, settings, where, says in cases:
        pq.write_table(pa.table(columns), path)
        message = error_of(tmp_path, "f.parquet", None, **settings)
        assert message.startswith(f"{path}{where}: ") and says in message, message


def test_an_unknown_format_or_missing_file_is_named(tmp_path):
    assert "not a feature file recsys reads" in error_of(tmp_path, "items.xlsx", "x")
    assert "data.item_features: " in error_of(tmp_path, "absent.csv", None)


def test_skip_bad_rows_drops_them_with_one_warning(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text("item,brand,emb\ni1,a,1|2\n,b,1|2\ni2,c,1|2\ni1,d,1|2\ni3,e,1\ni4,f,1|2,x\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = prepared(tmp_path, path, feature_vector_col="emb", skip_bad_rows=True)
    (warning,) = [w for w in caught if issubclass(w.category, DataWarning)]
    assert str(warning.message) == f"{path}: skipped 4 malformed lines (line 3, 5, 6, 7)"
    f = features_of(ds)
    assert values(f, "brand", "i1", ds) == ["a"]  # the first row of a repeated item is kept
    assert values(f, "brand", "i3", ds) == [] and values(f, "brand", "i4", ds) == []
    assert f.dense_mask is not None and f.dense_mask.tolist() == [False, True, True, False, False]


def test_saved_and_loaded_with_the_dataset(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text('{"item": "i1", "tags": ["x", "y"], "emb": [1, 2]}\n{"item": "new", "tags": "z", "emb": [3, 4]}\n')
    ds = prepared(tmp_path, path, feature_vector_col="emb")
    ds.save(tmp_path / "ds")
    assert sorted(p.name for p in (tmp_path / "ds" / "features").iterdir()) == [
        "dense.npy",
        "dense_mask.npy",
        "features.json",
        "field0_indices.npy",
        "field0_indptr.npy",
        "field0_vocab.npy",
        "new_raw.npy",
    ]
    loaded = Dataset.load(tmp_path / "ds")
    a, b = features_of(ds), features_of(loaded)
    assert (b.num_known, b.new_raw.tolist(), b.source) == (a.num_known, ["new"], str(path))
    for x, y in zip(a.fields, b.fields):
        assert x.name == y.name
        for name in ("vocab", "indptr", "indices"):
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name))
    np.testing.assert_array_equal(a.dense, b.dense)
    np.testing.assert_array_equal(a.dense_mask, b.dense_mask)


def test_a_damaged_saved_feature_folder_is_named(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text("item,tags\ni1,a|b\n")
    prepared(tmp_path, path).save(tmp_path / "ds")
    (tmp_path / "ds" / "features" / "field0_indptr.npy").unlink()
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'ds' / 'features'}: not saved item features")):
        Dataset.load(tmp_path / "ds")


def test_the_cache_key_follows_the_feature_file_and_its_settings(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text("item,tags,emb\ni1,a,1|2\n")
    cache, clicks = tmp_path / "cache", clicks_file(tmp_path)

    def load(*extra: str) -> Dataset:
        settings = [f"data.source={clicks}", "data.time_col=", "data.min_item_count=1"]
        settings += ["data.min_user_count=1", f"data.cache_dir={cache}", f"data.item_features={path}", *extra]
        return load_dataset(load_config(None, settings))

    assert values(features_of(load()), "tags", "i1", load()) == ["a"]
    assert len(list(cache.iterdir())) == 1  # the second load reused the entry
    path.write_text("item,tags,emb\ni1,b|c,1|2\n")
    os.utime(path, ns=(0, 10**9))
    assert values(features_of(load()), "tags", "i1", load()) == ["b", "c"]
    assert features_of(load("data.feature_vector_col=emb")).dim == 2
    assert len(list(cache.iterdir())) == 3


def test_out_of_core_preparation_carries_the_same_features(tmp_path):
    pytest.importorskip("duckdb")
    from recsys.data.ondisk import prepare_on_disk

    path = tmp_path / "items.csv"
    path.write_text("item,tags,emb\ni3,a|b,1|2\nzz,c,3|4\ni1,,\n")
    cfg = config(tmp_path, path, feature_vector_col="emb")
    a, b = features_of(prepare(read_interactions(cfg), cfg)), features_of(prepare_on_disk(cfg, tmp_path / "ds"))
    assert (a.num_known, a.new_raw.tolist()) == (b.num_known, b.new_raw.tolist())
    for name in ("vocab", "indptr", "indices"):
        np.testing.assert_array_equal(getattr(a.fields[0], name), getattr(b.fields[0], name))
    np.testing.assert_array_equal(a.dense, b.dense)


def test_a_bad_feature_file_stops_out_of_core_preparation_before_the_log(tmp_path, monkeypatch):
    pytest.importorskip("duckdb")
    from recsys.data import ondisk

    path = tmp_path / "items.csv"
    path.write_text("item,tags\ni1,a\ni1,b\n")
    monkeypatch.setattr(ondisk, "_read", lambda *args: pytest.fail("the log was read"))
    with pytest.raises(DataError, match=re.escape(f"{path}:3: item 'i1' again")):
        ondisk.prepare_on_disk(config(tmp_path, path), tmp_path / "ds")


def test_the_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="data.feature_item_col"):
        load_config(None, ["data.item_features=f.csv", "data.feature_item_col="])
    with pytest.raises(ConfigError, match="data.feature_vector_col"):
        load_config(None, ["data.feature_vector_col=item"])


@pytest.mark.data
@pytest.mark.skipif(not DATA.is_dir(), reason=f"real datasets not found at {DATA}")
def test_amazon_beauty_item_attributes():
    folder = DATA / "amazon-beauty"
    cfg = DataConfig(source=str(folder / "interactions.csv"), item_features=str(folder / "item_attributes.json"))
    ds = prepare(read_interactions(cfg), cfg)
    f = features_of(ds)
    (field,) = f.fields
    per_item = np.diff(field.indptr)
    assert (f.num_known, f.num_new) == (12_102, 0)  # every one of the 12,101 items is clicked and covered
    assert per_item[0] == 0 and (per_item[1:] > 0).all()
    raw = json.loads((folder / "item_attributes.json").read_text())
    distinct = {item: list(dict.fromkeys(str(v) for v in listed)) for item, listed in raw.items()}
    assert np.bincount([len(v) for v in raw.values()]).tolist() == [0, 65, 598, 3_919, 5_799, 1_497, 223]  # as listed
    assert np.bincount(per_item[1:]).tolist() == np.bincount([len(v) for v in distinct.values()]).tolist()
    assert per_item.max() == 6 and field.vocab_size == 638  # 637 attribute ids and "<none>"
    for item in ("4", "83", "214", ds.item_raw[1], ds.item_raw[-1]):
        assert values(f, JSON_FIELD, item, ds) == distinct[item]


@pytest.mark.data
@pytest.mark.skipif(not DATA.is_dir(), reason=f"real datasets not found at {DATA}")
def test_movielens_genres_from_u_item():
    folder = DATA / "ml-100k"
    cfg = DataConfig(source=str(folder), item_features=str(folder / "u.item"))
    ds = prepare(read_interactions(cfg), cfg)
    f = features_of(ds)
    (genre,) = f.fields
    assert genre.vocab_size == 19  # 18 genres (the unknown genre is none) and "<none>"
    assert f.num_known == 1_350 and f.num_new == 1_682 - 1_349  # the items the filter dropped are new
    assert values(f, "genre", "1", ds) == ["Animation", "Children's", "Comedy"]  # Toy Story
    first = pd.Series([v[0] if len(v := genre.values_of(i)) else None for i in range(1, f.num_known)])
    assert (
        first.fillna("<unknown>").to_numpy() == ds.category_raw[ds.item_category[1:]]
    ).all()  # category = first genre
