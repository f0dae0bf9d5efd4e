"""New items for a saved run without retraining (recsys.run.new_items): a newer feature file's
unknown items join the catalogue after its ids, each as the model's feature part alone (checked by
hand against the trained value rows and projection), existing items unchanged, saved in the run so
a reload, `recsys recommend`, `recsys index` and the service see them; and the refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from recsys.cli import main
from recsys.data.errors import DataError
from recsys.data.feature_readers import RawFeatures
from recsys.data.features import FeatureField, ItemFeatures, new_items
from tests.conftest import tiny_clicks_overrides

GENRES = 4


def _vector(i: int) -> str:
    return "|".join(f"{np.sin(i * (k + 1)):.4f}" for k in range(3))


def _feature_file(path: Path, items: dict[str, tuple[str, str, str]]) -> Path:
    """``items``: raw id -> (genre cell, brand cell, vector cell)."""
    rows = "".join(f"{item},{genre},{brand},{vector}\n" for item, (genre, brand, vector) in items.items())
    path.write_text("item,genre,brand,emb\n" + rows)
    return path


def _training_items() -> dict[str, tuple[str, str, str]]:
    # i1..i34: i30..i34 are never clicked (new items at training); every value below is in the vocabularies
    return {f"i{i}": (f"g{i % GENRES}|g{(i + 1) % GENRES}", f"b{i % 3}", _vector(i)) for i in range(1, 35)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A tiny run with a feature file (attributes and vectors) and one without features."""
    from recsys.api import fit

    root = tmp_path_factory.mktemp("new-items")
    clicks = root / "clicks.csv"
    rng = np.random.default_rng(1)
    clicks.write_text("user,item\n" + "".join(f"u{u},i{int(i)}\n" for u in range(60) for i in rng.integers(1, 30, 12)))
    common = tiny_clicks_overrides(clicks, root / "runs", 20)
    features = _feature_file(root / "items.csv", _training_items())
    with_features = fit(  # new items as their feature part alone, which the tests below rebuild by hand
        None,
        overrides={
            **common,
            "data.item_features": str(features),
            "data.feature_vector_col": "emb",
            "model.cold_rows": "zero",
            "name": "feat",
        },
        log=None,
    )
    without = fit(None, overrides={**common, "name": "ids"}, log=None)
    return {"features": with_features.path, "ids": without.path, "root": root}


@pytest.fixture
def run_dir(trained, tmp_path) -> Path:
    """A copy of the run with features, for a test to change."""
    return Path(shutil.copytree(trained["features"], tmp_path / "run"))


def _newer_file(path: Path) -> Path:
    """Training's items (i1 with other values, which are not read) and six new ones: i35 with a
    genre the run never saw beside a known one, i36 with nothing the run knows, the rest known."""
    items = _training_items()
    items["i1"] = ("g3", "b2", _vector(99))
    items |= {f"i{i}": (f"g{i % GENRES}", f"b{i % 3}", _vector(i)) for i in range(37, 41)}
    items["i38"] = ("g0|g1|g2", "b2", _vector(38))  # more values than any trained item: wider value lists
    items["i35"] = ("g1|g99", "b0", _vector(35))
    items["i36"] = ("gx", "", "")
    return _feature_file(path, items)


def _feature_part_by_hand(run, raw: str, genres: list[str], brand: list[str], vector: list[float] | None):
    """The model's feature part of an item with these raw values: each field's mean of its known
    values' trained rows, plus the trained projection of the vector (double precision)."""
    state = run.model.state_dict()
    features = run.dataset.features
    out = torch.zeros(run.config.model.dim, dtype=torch.float64)
    for k, values in enumerate((genres, brand)):
        vocab = list(features.fields[k].vocab)
        known = [vocab.index(v) for v in values if v in vocab[1:]]
        if known:
            out += state[f"embedding.features.fields.{k}.weight"][known].double().mean(0)
    if vector is not None:
        out += state["embedding.features.project.weight"].double() @ torch.tensor(vector, dtype=torch.float64)
    return out


def test_new_items_are_their_feature_part_after_the_catalogue_and_the_rest_is_unchanged(run_dir, tmp_path):
    from recsys.api import Run

    run = Run.load(run_dir, device="cpu")
    before_raw, before = run.item_embeddings()
    size = run.dataset.catalogue_size
    lines: list[str] = []
    found = run.add_items(_newer_file(tmp_path / "items-v2.csv"), log=lines.append)

    assert found.num_new == 6 and found.first == size and found.known == 34
    assert found.unknown_values == {"genre": 2, "brand": 0} and found.blank == 1
    assert lines == [found.describe()]
    assert "6 new items" in lines[0] and "2 of their values unknown to the run (genre 2) contribute nothing" in lines[0]
    raw, emb = run.item_embeddings()
    assert list(raw[: len(before_raw)]) == list(before_raw)  # no id moved
    assert list(raw[len(before_raw) :]) == ["i35", "i36", "i37", "i38", "i39", "i40"]  # raw-id order
    np.testing.assert_array_equal(emb[: len(before)], before)  # i1's new values are not read
    vector = [float(x) for x in _vector(35).split("|")]
    want = _feature_part_by_hand(run, "i35", ["g1", "g99"], ["b0"], vector)
    torch.testing.assert_close(torch.from_numpy(emb[size - 1]).double(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(emb[size], 0)  # i36: nothing the run knows
    for i in range(37, 41):
        genres = ["g0", "g1", "g2"] if i == 38 else [f"g{i % GENRES}"]
        want = _feature_part_by_hand(run, f"i{i}", genres, [f"b{i % 3}"], [float(x) for x in _vector(i).split("|")])
        torch.testing.assert_close(torch.from_numpy(emb[size + i - 36]).double(), want, rtol=1e-5, atol=1e-6)

    run.model.embedding.cold_rows = "attribute_mean"  # the default: the new items also take their attributes' mean row
    _, predicted = run.item_embeddings()
    warm = run.model.embedding.warm.numpy()[1:]  # the embeddings leave the padding row out
    np.testing.assert_array_equal(predicted[warm], emb[warm])  # clicked items unchanged; i30..i34 are clickless too
    assert np.abs(predicted[size + 1 :] - emb[size + 1 :]).max(axis=1).min() > 0  # each known-valued new item moves
    np.testing.assert_array_equal(predicted[size], 0)  # i36: nothing the run knows, no attribute either
    run.model.embedding.cold_rows = "zero"

    recs = run.recommend(sequences=[["i37", "i2"]], n=run.dataset.catalogue_size - 3)  # a new item in a history
    assert {"i35", "i38", "i39", "i40"} <= set(recs["item"]) and "i37" not in set(recs["item"])

    again = Run.load(run_dir, device="cpu")  # saved in the run: a reload sees them, with the same ids
    assert again.dataset.catalogue_size == size + 6
    np.testing.assert_array_equal(again.item_embeddings()[1], emb)
    assert list(again.dataset.item_map.lookup(["i35", "i40", "i1"])) == [
        size,
        size + 5,
        run.dataset.item_map.lookup(["i1"])[0],
    ]


def test_recsys_index_adds_the_items_and_covers_them_and_recommend_returns_them(run_dir, tmp_path, capsys):
    from recsys.api import Run

    size = Run.load(run_dir, device="cpu").dataset.catalogue_size
    newer = _newer_file(tmp_path / "items-v2.csv")
    assert main(["index", str(run_dir), "--factory", "Flat", "--item-features", str(newer), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "items-v2.csv: 6 new items" in out and f"over {size - 1 + 6:,} items" in out
    assert main(["index", str(run_dir), "--factory", "Flat", "--item-features", str(newer), "--quiet"]) == 0
    assert "no new items" in capsys.readouterr().out  # the second time: nothing to add, nothing changed
    assert len(list((run_dir / "added_items").iterdir())) == 1

    run = Run.load(run_dir, device="cpu")
    assert "loaded from" in run.search  # the saved index matches the grown table
    (tmp_path / "users.txt").write_text("u1\nu2\nu3\n")
    out_file = tmp_path / "recs.csv"
    args = [
        "recommend",
        str(run_dir),
        "--users",
        str(tmp_path / "users.txt"),
        "--n",
        str(size + 5),
        "--out",
        str(out_file),
    ]
    assert main([*args, "--quiet"]) == 0
    items = set(pd.read_csv(out_file, dtype=str)["item"])
    assert {"i35", "i37", "i38", "i39", "i40"} <= items
    assert main(["evaluate", str(run_dir), "--quiet"]) == 0  # evaluation ranks the grown catalogue
    assert main(["export", str(run_dir), "--format", "torchscript"]) == 0
    exported = pd.read_csv(run_dir / "export" / "torchscript" / "items.csv", dtype=str)
    assert list(exported["item"].iloc[-6:]) == ["i35", "i36", "i37", "i38", "i39", "i40"]
    from recsys.items import new_items
    from recsys.run import load_run

    fresh = new_items(load_run(run_dir).model)  # the added items and training's own new ones
    assert list(exported["new"] == "True") == fresh[1:].tolist() and fresh[-6:].all() and not fresh[1:].all()


def test_serve_adds_the_items_and_the_service_takes_and_returns_their_raw_ids(run_dir, tmp_path):
    from recsys.serve.recommender import Recommender

    lines: list[str] = []
    newer = _newer_file(tmp_path / "v2.csv")
    rec = Recommender.from_run(run_dir, factory="Flat", item_features=newer, log=lines.append)
    size = rec.dataset.catalogue_size
    assert lines[0].startswith(f"{newer}: 6 new items") and rec.info()["items"] == size - 1
    pytest.importorskip("fastapi", reason="the service needs the serve extra")
    from fastapi.testclient import TestClient

    from recsys.config import ServeConfig
    from recsys.serve.app import create_app

    with TestClient(create_app(rec, ServeConfig(max_n=size))) as client:
        body = client.post("/recommend", json={"items": ["i38", "i2", "nope"], "n": size - 3}).json()
    returned = {entry["item"] for entry in body["items"]}
    assert body["unknown_items"] == ["nope"] and {"i35", "i37", "i39", "i40"} <= returned and "i38" not in returned


def test_a_file_without_new_items_changes_nothing(run_dir, trained):
    from recsys.api import Run

    run = Run.load(run_dir, device="cpu")
    found = run.add_items(trained["root"] / "items.csv")
    assert (
        found.num_new == 0 and "no new items (its 34 items are in the run already); nothing changed" in found.describe()
    )
    assert not (run_dir / "added_items").exists()


def test_a_malformed_file_is_the_readers_one_line_error(run_dir, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("item,genre,brand,emb\ni50,g1,b0,0.1|0.2|0.3\ni50,g2,b1,0.1|0.2|0.3\n")
    with pytest.raises(DataError) as at_training:
        from recsys.api import Run

        Run.load(run_dir, device="cpu").add_items(bad)
    assert f"{bad}:3: item 'i50' again" in str(at_training.value)
    assert main(["index", str(run_dir), "--item-features", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == f"recsys index: error: {at_training.value}"
    wide = tmp_path / "wide.csv"
    wide.write_text("item,genre,brand,emb\ni50,g1,b0,0.1|0.2\n")
    assert main(["index", str(run_dir), "--item-features", str(wide)]) == 2
    assert "vectors of 2 values; the run's projection was trained on 3-d vectors" in capsys.readouterr().err
    assert main(["index", str(run_dir), "--item-features", str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: no such item feature file" in capsys.readouterr().err
    assert not (run_dir / "added_items").exists()


def test_a_run_trained_without_features_refuses_in_one_line(trained, tmp_path, capsys):
    newer = _newer_file(tmp_path / "v2.csv")
    assert main(["index", str(trained["ids"]), "--item-features", str(newer)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "was trained without item features" in err and "data.item_features" in err


def test_an_addition_the_manifest_does_not_record_is_passed_over(run_dir, tmp_path):
    from recsys.api import Run
    from recsys.run import RunDir

    run = Run.load(run_dir, device="cpu")
    size = run.dataset.catalogue_size
    run.add_items(_newer_file(tmp_path / "v2.csv"))
    shutil.copytree(run_dir / "added_items" / "0001", run_dir / "added_items" / "0002")  # a write cut short
    assert [p.name for p in RunDir(run_dir).added_item_folders()] == ["0001"]
    assert Run.load(run_dir, device="cpu").dataset.catalogue_size == size + 6


def _block_features() -> ItemFeatures:
    vocab = np.array(["<none>", "a", "b"])
    return ItemFeatures(
        [FeatureField("tag", vocab, np.array([0, 0, 1, 2, 2]), np.array([1, 2]))], None, None, 4, np.array([])
    )


def test_new_items_map_values_into_the_vocabulary_and_append_after_the_catalogue():
    features = _block_features()  # ids 1..3 clicked
    raw = RawFeatures(
        Path("f.csv"),
        np.array(["10", "9", "x1"]),
        {
            "tag": (np.array([0, 0, 0, 1, 2]), np.array(["b", "zz", "b", "a", "c"])),
            "color": (np.array([0]), np.array(["r"])),
        },
    )
    found = new_items(raw, features, np.array(["<pad>", "x1", "x2", "x3"]))
    assert list(found.rows.new_raw) == ["9", "10"] and found.first == 4 and found.known == 1
    assert found.unknown_values == {"tag": 1} and found.ignored_fields == ["color"] and found.missing_fields == []
    grown = features.appended(found.rows)
    assert grown.num_items == 6 and list(grown.new_raw) == ["9", "10"]
    assert [list(grown.fields[0].values_of(i)) for i in range(6)] == [[], ["a"], ["b"], [], ["a"], ["b"]]
    with pytest.raises(DataError, match="not rows of these item features"):
        features.appended(features)


def test_a_damaged_addition_is_one_line_and_removing_the_additions_restores_trainings_catalogue(
    run_dir, tmp_path, capsys
):
    from recsys.api import Run

    size = Run.load(run_dir, device="cpu").dataset.catalogue_size
    newer = _newer_file(tmp_path / "v2.csv")
    assert main(["index", str(run_dir), "--factory", "Flat", "--item-features", str(newer), "--quiet"]) == 0
    vectors = run_dir / "added_items" / "0001" / "dense.npy"
    vectors.write_bytes(vectors.read_bytes()[:-4] + b"\0\0\0\0")
    assert main(["recommend", str(run_dir), "--all", "--out", str(tmp_path / "r.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{vectors}: corrupted" in err and f"recsys index {run_dir} --remove-added-items" in err
    assert main(["index", str(run_dir), "--factory", "Flat", "--remove-added-items", "--quiet"]) == 0
    assert "removed 1 addition" in capsys.readouterr().out
    assert Run.load(run_dir, device="cpu").dataset.catalogue_size == size
    assert Run.load(run_dir, device="cpu").add_items(newer).num_new == 6  # added again, as 0001
    assert Run.load(run_dir, device="cpu").dataset.catalogue_size == size + 6
