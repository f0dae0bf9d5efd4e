"""`recsys recommend`: output format, unknown users, --all, --exclude-seen, Parquet and CSV."""

import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from recsys.cli import main
from recsys.data.prepare import Dataset
from recsys.run import retrieval_settings
from recsys.serve.batch import read_user_file
from recsys.serve.recommender import Recommender


@pytest.fixture(scope="module")
def dataset(tiny_run):
    return Dataset.load(f"{tiny_run}/dataset")


def test_recommend_csv_format_and_unknown_users(tiny_run, dataset, tmp_path, capsys):
    users = [dataset.user_raw[5], "ghost", dataset.user_raw[0], dataset.user_raw[5], ""]
    (tmp_path / "users.txt").write_text("\n".join(users) + "\n")
    out = tmp_path / "recs.csv"
    assert (
        main(
            [
                "recommend",
                tiny_run,
                "--users",
                str(tmp_path / "users.txt"),
                "--n",
                "7",
                "--out",
                str(out),
                "--factory",
                "Flat",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "skipped 1 unknown user: 'ghost'" in captured.err
    assert f"14 recommendations for 2 users (7 items each) written to {out}" in captured.out
    table = pd.read_csv(out, dtype={"user": str, "item": str})
    assert list(table.columns) == ["user", "rank", "item", "score", "interest"]
    assert list(pd.unique(table["user"])) == [dataset.user_raw[5], dataset.user_raw[0]]  # input order, once each
    for _, rows in table.groupby("user"):
        assert list(rows["rank"]) == list(range(1, 8))
        assert (np.diff(rows["score"].to_numpy()) <= 1e-6).all()  # best first
        assert rows["item"].is_unique and rows["item"].isin(dataset.item_raw[1:]).all()
        assert rows["interest"].between(0, 3).all()


def test_one_recommendation_for_one_user_is_written_in_the_singular(tiny_run, dataset, tmp_path, capsys):
    (tmp_path / "users.txt").write_text(f"{dataset.user_raw[3]}\nghost\n")
    out = tmp_path / "recs.csv"
    args = ["--users", str(tmp_path / "users.txt"), "--n", "1", "--out", str(out), "--factory", "Flat"]
    assert main(["recommend", tiny_run, *args]) == 0
    captured = capsys.readouterr()
    assert f"1 recommendation for 1 user (1 item each) written to {out}" in captured.out
    assert "skipped 1 unknown user: 'ghost'" in captured.err


def _seen_recommended(dataset, table) -> int:
    """How many recommended (user, item) pairs the user already clicked."""
    item_id = {raw: i for i, raw in enumerate(dataset.item_raw)}
    user_id = {raw: u for u, raw in enumerate(dataset.user_raw)}
    count = 0
    for user, rows in table.groupby("user"):
        u = user_id[user]
        seen = set(dataset.items[dataset.indptr[u] : dataset.indptr[u + 1]].tolist())
        count += len(seen & {item_id[i] for i in rows["item"]})
    return count


def test_recommend_all_parquet_excludes_seen_by_default(tiny_run, dataset, tmp_path):
    pytest.importorskip("pyarrow", reason="Parquet output needs pyarrow (the parquet extra)")
    out = tmp_path / "recs.parquet"
    assert (
        main(["recommend", tiny_run, "--all", "--n", "5", "--out", str(out), "--batch-size", "64", "--factory", "Flat"])
        == 0
    )
    table = pd.read_parquet(out)
    assert table["user"].nunique() == dataset.num_users and len(table) == 5 * dataset.num_users
    assert _seen_recommended(dataset, table) == 0
    assert (
        main(["recommend", tiny_run, "--all", "--n", "5", "--out", str(out), "--no-exclude-seen", "--factory", "Flat"])
        == 0
    )
    assert _seen_recommended(dataset, pd.read_parquet(out)) > 0  # the model ranks clicked items high


def test_recommend_uses_the_runs_saved_index(tiny_run, tmp_path, capsys):
    """Was: without --factory, `recommend --all` built retrieval.factory in memory and ignored the
    index `recsys index` had saved."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)  # the shared run stays without a saved index
    assert main(["index", str(run), "--factory", "HNSW32,Flat", "--ef-search", "48"]) == 0
    capsys.readouterr()
    tables = {}
    for name, factory in (("default", []), ("given", ["--factory", "HNSW32,Flat"])):
        out = tmp_path / f"{name}.csv"
        assert main(["recommend", str(run), "--all", "--n", "5", "--out", str(out), *factory]) == 0
        assert "index: HNSW32,Flat loaded from" in capsys.readouterr().out
        tables[name] = pd.read_csv(out, dtype={"user": str, "item": str})
    pd.testing.assert_frame_equal(tables["default"], tables["given"])
    assert Recommender.from_run(run, log=lambda line: None).index_name == "HNSW32,Flat"  # what `serve` loads
    assert main(["index", str(run), "--factory", "IVF4,Flat"]) == 0
    assert Recommender.from_run(run, log=lambda line: None).index_name == "IVF4,Flat"  # the newest one


def test_hnsw_lists_hold_every_eligible_item_at_n_equal_to_the_catalogue(tiny_run, dataset, tmp_path, capsys):
    """Was: after `recsys index --factory "HNSW32,Flat"`, `recommend --all --n 1000` gave most
    users fewer than 1,000 items, and the service answered 862 items with "n": 1000."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    assert main(["index", str(run), "--factory", "HNSW4,Flat", "--ef-search", "8"]) == 0
    capsys.readouterr()
    catalogue = dataset.num_items - 1
    out = tmp_path / "recs.csv"
    assert main(["recommend", str(run), "--all", "--n", str(catalogue), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    held = pd.read_csv(out, dtype={"user": str, "item": str}).groupby("user").size()
    users = np.flatnonzero(np.isin(dataset.user_raw, held.index))
    seen = [len(np.unique(dataset.items[dataset.indptr[u] : dataset.indptr[u + 1]])) for u in users]
    np.testing.assert_array_equal(held[dataset.user_raw[users]].to_numpy(), catalogue - np.array(seen))
    assert f"{held.min():,} to {held.max():,} items each" in printed

    pytest.importorskip("fastapi", reason="the service needs the serve extra")
    from fastapi.testclient import TestClient

    from recsys.config import ServeConfig
    from recsys.serve.app import create_app

    rec = Recommender.from_run(run, log=lambda line: None)
    assert rec.index_name == "HNSW4,Flat"
    app = create_app(rec, ServeConfig(max_n=catalogue + 10))
    with TestClient(app) as client:
        body = client.post("/recommend", json={"user": str(dataset.user_raw[0]), "n": catalogue + 10}).json()
    assert body["n"] == len(body["items"]) == catalogue - seen[0] and body["requested_n"] == catalogue + 10


def test_recommend_caps_a_huge_n_at_the_catalogue(tiny_run, dataset, tmp_path, capsys):
    """Was: --n 1000000000 failed with numpy's "Unable to allocate 7.45 TiB"."""
    out = tmp_path / "recs.csv"
    args = ["recommend", tiny_run, "--all", "--n", "1000000000", "--out", str(out), "--factory", "Flat"]
    assert main([*args, "--no-exclude-seen"]) == 0
    printed = capsys.readouterr().out
    assert f"is more than the {dataset.num_items - 1:,} items of the catalogue" in printed
    held = pd.read_csv(out, dtype={"user": str, "item": str}).groupby("user").size()
    assert (held == dataset.num_items - 1).all() and len(held) == dataset.num_users


def test_raw_ids_round_trip_exactly(tmp_path, capsys):
    """Was: leading spaces of raw ids were stripped, so output ids did not always round-trip."""
    users = [" 17", "17", "a b", "u,1", 'q"'] + [f"u{i}" for i in range(10)]
    rows = [(u, f" i{(k + j) % 9} ", t) for k, u in enumerate(users) for j, t in enumerate(range(6))]
    pd.DataFrame(rows, columns=["user", "item", "timestamp"]).to_csv(tmp_path / "clicks.csv", index=False)
    assert (
        main(
            [
                "train",
                "--model",
                "popular",
                "--data",
                str(tmp_path / "clicks.csv"),
                "--set",
                f"output_dir={tmp_path}",
                "--set",
                "name=pop",
                "--set",
                "data.valid_frac=0.2",
                "--set",
                "data.test_frac=0.2",
            ]
        )
        == 0
    )
    (tmp_path / "users.txt").write_text("\n".join(users[:5]) + "\n")
    out = tmp_path / "recs.csv"
    assert (
        main(
            [
                "recommend",
                str(tmp_path / "pop"),
                "--users",
                str(tmp_path / "users.txt"),
                "--n",
                "2",
                "--no-exclude-seen",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "unknown" not in capsys.readouterr().err
    table = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(pd.unique(table["user"])) == users[:5]
    assert set(table["item"]) <= {f" i{k} " for k in range(9)}


def test_recommend_errors(tiny_run, tmp_path, capsys):
    (tmp_path / "users.txt").write_text("ghost\n")
    out = str(tmp_path / "r.csv")
    assert main(["recommend", tiny_run, "--users", str(tmp_path / "users.txt"), "--out", out, "--strict"]) == 2
    assert "1 unknown user id: 'ghost'" in capsys.readouterr().err
    assert main(["recommend", tiny_run, "--all", "--out", str(tmp_path / "r.json")]) == 2
    assert ".parquet, .csv" in capsys.readouterr().err
    assert main(["recommend", tiny_run, "--users", str(tmp_path / "none.txt"), "--out", out]) == 2
    assert "file not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --users and --all are exclusive
        main(["recommend", tiny_run, "--all", "--users", "x", "--out", out])
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="no user ids"):
        read_user_file(tmp_path / "blank.txt")


def test_progress_bars_close_when_the_work_fails(tiny_run, monkeypatch):
    import recsys.evaluate.evaluator as evaluator
    import recsys.serve.batch as batch
    from recsys.api import Run
    from recsys.progress import progress_bar

    closed = []

    def recording_bar(*args, **kwargs):
        bar = progress_bar(*args, **kwargs)
        close = bar.close
        bar.close = lambda: (closed.append(bar), close())
        return bar

    def broken(*args, **kwargs):
        raise RuntimeError("broken")

    monkeypatch.setattr(batch, "progress_bar", recording_bar)
    monkeypatch.setattr(evaluator, "progress_bar", recording_bar)
    run = Run.load(tiny_run, device="cpu").use_index("Flat")
    monkeypatch.setattr(run._recommender, "recommend", broken)
    with pytest.raises(RuntimeError, match="broken"):
        run.recommend(n=5)
    monkeypatch.setattr(run.model, "interests", broken)
    with pytest.raises(RuntimeError, match="broken"):
        run.evaluate()
    assert len(closed) == 2


def test_exact_search_on_the_device_gives_the_faiss_table(tiny_run):
    """retrieval.backend = torch (on a GPU: "auto") searches where the model runs, batches queued
    and read back once; the table equals FAISS Flat's."""
    import copy

    from recsys.run import load_run
    from recsys.serve.batch import recommend_table
    from recsys.serve.recommender import Recommender

    run = load_run(tiny_run)
    on_device = copy.copy(run)
    on_device.cfg = copy.deepcopy(run.cfg)
    on_device.cfg.retrieval.backend = "torch"
    faiss, torch_rec = (
        Recommender.of_run(r, retrieval_settings(r, "Flat"), log=lambda line: None) for r in (run, on_device)
    )
    assert not faiss.retriever.on_device and torch_rec.retriever.on_device
    users = np.arange(run.dataset.num_users)
    for exclude_seen in (True, False):
        want = recommend_table(faiss, users, 7, exclude_seen=exclude_seen, batch_size=64)
        got = recommend_table(torch_rec, users, 7, exclude_seen=exclude_seen, batch_size=64)
        pd.testing.assert_frame_equal(got.drop(columns="score"), want.drop(columns="score"))
        np.testing.assert_allclose(got["score"], want["score"], rtol=1e-5, atol=1e-5)
    rows = faiss.recommend(*faiss.user_inputs(users[:5]), np.array([1, 2, 3, 4, 5]))
    on_dev = torch_rec.recommend(*torch_rec.user_inputs(users[:5]), np.array([1, 2, 3, 4, 5]))
    np.testing.assert_array_equal(on_dev.ids, rows.ids)  # each row cut at its own n


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_recommend_on_the_gpu_never_syncs_per_batch(tiny_run, count_syncs):
    from recsys.api import Run

    run = Run.load(tiny_run, device="cuda")  # Flat + auto: exact search on the GPU
    assert run.recommend(n=5).shape[0] > 0

    def syncs(batch_size: int) -> int:
        return count_syncs(lambda: run.recommend(n=5, batch_size=batch_size))

    assert syncs(16) == syncs(10_000) > 0  # ~25 batches sync the host as often as one (results come back once)
    cpu = Run.load(tiny_run, device="cpu").recommend(n=5)
    gpu = run.recommend(n=5)
    pd.testing.assert_frame_equal(gpu.drop(columns="score"), cpu.drop(columns="score"))
