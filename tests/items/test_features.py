"""Items represented by their ids and features: the feature part against a double-precision loop,
new and never-trained items by their features alone, the row-sparse form reading the same
representations, and a run on a log with a feature file (training, its catalogue, serving)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recsys.data.features import FeatureField, ItemFeatures
from recsys.items import FeatureUse, ItemTable, RowUpdates
from recsys.items.features import FeatureEmbedding
from tests.conftest import tiny_clicks_overrides

# 6 known ids (0 = padding, 1..5 clicked) and 2 new ones (6, 7); two fields, one multi-valued
GENRES = [[], [1, 2], [2], [], [1, 3], [3], [2, 3], [1]]
BRAND = [[], [1], [1], [2], [], [2], [1], []]


def _field(name: str, rows: list[list[int]], vocab: int) -> FeatureField:
    indptr = np.cumsum([0, *map(len, rows)]).astype(np.int64)
    indices = np.array([v for r in rows for v in r], dtype=np.int64)
    return FeatureField(name, np.array(["<none>", *(f"{name}{v}" for v in range(1, vocab))]), indptr, indices)


def _features(dense: bool = True) -> ItemFeatures:
    vectors = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    mask = np.array([False, True, True, False, True, True, False, True])
    vectors[~mask] = 0
    return ItemFeatures(
        fields=[_field("genre", GENRES, 4), _field("brand", BRAND, 3)],
        dense=vectors if dense else None,
        dense_mask=mask if dense else None,
        num_known=6,
        new_raw=np.array(["n1", "n2"]),
    )


def test_the_feature_part_is_the_mean_of_each_fields_values_plus_the_projected_vector():
    features = _features()
    part = FeatureEmbedding(features, 5).double()
    ids = torch.tensor([[0, 1, 3], [4, 6, 7]])
    got = part(ids)
    want = torch.zeros(2, 3, 5, dtype=torch.float64)
    for b in range(2):
        for j in range(3):
            i = int(ids[b, j])
            for table, rows in zip(part.fields, (GENRES, BRAND)):
                if rows[i]:
                    want[b, j] += table.weight[rows[i]].mean(0)
            want[b, j] += part.project.weight @ torch.from_numpy(features.dense[i]).double()
    torch.testing.assert_close(got, want)
    assert (got[0, 0] == 0).all()  # padding: no values, no vector


def test_new_and_untrained_items_are_their_features_alone_and_the_rest_add_their_id_rows():
    table = ItemTable(6, 5)
    trained = torch.tensor([0, 4, 0, 2, 1, 3])  # item 2 has no training clicks
    rows_before = table.all().detach().clone()
    table.add_features(_features(), trained, FeatureUse(cold_rows="zero"))
    assert table.num_items == 8 and table.all().shape == (8, 5)
    feats = table.features(torch.arange(8))
    warm = torch.tensor([0, 1, 0, 1, 1, 1, 0, 0], dtype=torch.float32)[:, None]
    id_rows = torch.cat([rows_before, torch.zeros(2, 5)])
    torch.testing.assert_close(table.all(), warm * id_rows + feats)
    seq = torch.tensor([[6, 2, 1, 0]])
    out = table(seq, torch.tensor([3]))
    torch.testing.assert_close(out[0, :3], table.all()[[6, 2, 1]])
    assert (out[0, 3] == 0).all()


def test_the_row_sparse_form_reads_the_same_representations_and_trains_the_feature_rows():
    torch.manual_seed(0)
    table = ItemTable(6, 5)
    table.add_features(_features(), torch.tensor([0, 4, 1, 2, 1, 3]))
    full = table.all().detach().clone()
    sparse = table.trained_as("sparse", RowUpdates(lr=0.1), "table.weight")
    seq, lengths, targets = torch.tensor([[7, 3, 1], [5, 0, 0]]), torch.tensor([3, 1]), torch.tensor([2, 6])
    with sparse.step_rows(seq, targets) as (local, local_targets):
        h = sparse(local, lengths)
        torch.testing.assert_close(h[0], full[[7, 3, 1]])
        torch.testing.assert_close(sparse.weight[local_targets], full[[2, 6]])
        (h.sum() + sparse.weight[local_targets].sum()).backward()
    assert sparse.features is not None and sparse.features.fields[0].weight.grad is not None
    assert sparse.collect()[0].abs().sum() > 0


def test_a_run_with_a_feature_file_trains_retrieves_new_items_and_ids_alone_leave_them_out(tmp_path):
    from recsys.api import Run, fit

    clicks = tmp_path / "clicks.csv"
    rng = np.random.default_rng(1)
    rows = [f"u{u},i{int(i)}\n" for u in range(60) for i in rng.integers(1, 30, size=12)]
    clicks.write_text("user,item\n" + "".join(rows))
    # every item has a genre; i30..i34 are never clicked: new items
    (tmp_path / "items.csv").write_text("item,genre\n" + "".join(f"i{i},g{i % 4}\n" for i in range(1, 35)))
    common = {**tiny_clicks_overrides(clicks, tmp_path / "runs", 30), "data.item_features": str(tmp_path / "items.csv")}
    run = fit(None, overrides=common, log=None)
    assert run.dataset.features is not None and run.dataset.catalogue_size == run.dataset.num_items + 5
    raw, emb = run.item_embeddings()
    assert len(raw) == len(emb) == run.dataset.catalogue_size - 1 and {f"i{i}" for i in range(30, 35)} <= set(raw)
    again = Run.load(run.path)
    torch.testing.assert_close(torch.from_numpy(again.item_embeddings()[1]), torch.from_numpy(emb))
    recs = again.recommend(sequences=[["i30", "i1"]], n=run.dataset.catalogue_size - 3)  # a new item in a history
    assert {f"i{i}" for i in range(31, 35)} <= set(recs["item"])  # every other new item is retrievable
    ids_alone = fit(None, overrides={**common, "model.use_features": False}, log=None)
    assert ids_alone.dataset.features is None
    assert len(ids_alone.item_embeddings()[0]) == ids_alone.dataset.num_items - 1


def test_id_dropout_leaves_clicked_items_id_rows_out_in_training_only():
    table = ItemTable(6, 5)
    table.add_features(_features(), torch.tensor([0, 4, 1, 2, 1, 3]), FeatureUse(id_dropout=0.5))
    table.eval()
    ids = torch.arange(1, 6).repeat(400)  # clicked items, each read 400 times
    feats = table.features(ids).detach()
    with_rows = table._represent(table.table.weight[ids], ids).detach()  # eval: every warm id row read
    warm = table.warm[ids, None].float()  # an item without training clicks would be its features alone
    torch.testing.assert_close(with_rows, warm * table.table.weight[ids].detach() + feats)
    table.train()
    torch.manual_seed(0)
    drawn = table._represent(table.table.weight[ids], ids).detach()
    alone = torch.isclose(drawn, feats).all(-1)  # rows left out: the features alone
    assert (alone | torch.isclose(drawn, with_rows).all(-1)).all()
    assert 0.4 < alone.float().mean() < 0.6  # about id_dropout of the reads
    with pytest.raises(ValueError, match="model.id_dropout"):
        FeatureUse(id_dropout=1.0)


def test_id_dropout_without_item_features_is_refused():
    from recsys.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="model.id_dropout: .* needs data.item_features"):
        load_config(None, ["model.id_dropout=0.3"])


def test_attribute_mean_rows_stand_for_clickless_items_outside_training():
    """model.cold_rows = "attribute_mean": an item without training clicks adds, outside training,
    the mean over its fields of the mean id row of the clicked items sharing each of its values
    (a double-precision loop), recomputed when the rows change; clicked items are unchanged."""
    table = ItemTable(6, 5).double()
    trained = torch.tensor([0, 4, 0, 2, 1, 3])  # items 1, 3, 4, 5 clicked; 2 (and the new 6, 7) not
    table.add_features(_features(dense=False), trained, FeatureUse(cold_rows="attribute_mean"))
    table.double().eval()
    rows = table.table.weight.detach()
    warm = [i for i in range(8) if table.warm[i]]
    want_rows = torch.zeros(8, 5, dtype=torch.float64)
    for i in range(8):
        if table.warm[i]:
            want_rows[i] = rows[i]
            continue
        parts = []
        for field in (GENRES, BRAND):
            if field[i]:
                sharing = [[j for j in warm if v in field[j]] for v in field[i]]
                means = [rows[js].mean(0) if js else torch.zeros(5, dtype=torch.float64) for js in sharing]
                parts.append(torch.stack(means).mean(0))
        if parts:
            want_rows[i] = torch.stack(parts).mean(0)
    feats = table.features(torch.arange(8)).detach()
    torch.testing.assert_close(table.all().detach(), want_rows + feats)
    assert (want_rows[6] != 0).any() and (want_rows[2] != 0).any()  # new item 6 and untrained 2 both have a row
    with torch.no_grad():
        table.table.weight[1] += 1.0  # a clicked item's row moves: the predicted rows follow
    assert not torch.allclose(table.all()[6].detach(), want_rows[6] + feats[6])
    table.train()  # in training a clickless item stays its features alone
    torch.testing.assert_close(table.all()[[2, 6, 7]].detach(), feats[[2, 6, 7]])
    with pytest.raises(ValueError, match="model.cold_rows"):
        FeatureUse(cold_rows="bogus")


def test_cold_scale_scales_clickless_items_outside_training_only():
    table = ItemTable(6, 5)
    table.add_features(_features(), torch.tensor([0, 4, 0, 2, 1, 3]), FeatureUse(cold_rows="zero", cold_scale=1.5))
    table.eval()
    boosted = table.all().detach()
    table.cold_scale = 1.0
    plain = table.all().detach()
    scale = torch.tensor([1, 1, 1.5, 1, 1, 1, 1.5, 1.5])[:, None]  # 2 untrained, 6 and 7 new
    torch.testing.assert_close(boosted, plain * scale)
    table.cold_scale = 1.5
    seq = torch.tensor([[6, 2, 1]])  # a history holding new items reads them as they are
    torch.testing.assert_close(table(seq, torch.tensor([3]))[0].detach(), plain[[6, 2, 1]])
    table.train()
    torch.testing.assert_close(table.all().detach(), plain)
    with pytest.raises(ValueError, match="model.cold_scale"):
        FeatureUse(cold_scale=0.0)


def test_a_cold_scale_without_item_features_is_refused_and_old_runs_keep_zero_rows():
    from recsys.config import Config, ConfigError, load_config
    from recsys.run.saved_config import run_config_from_dict

    saved = Config().to_dict()
    del saved["model"]["cold_rows"]
    assert run_config_from_dict(saved).model.cold_rows == "zero" and Config().model.cold_rows == "attribute_mean"
    with pytest.raises(ConfigError, match="model.cold_scale=1.5: .* needs data.item_features"):
        load_config(None, ["model.cold_scale=1.5"])
