"""The Python API (recsys.fit, recsys.Run): every call on a DataFrame-trained run and on a
path-trained run, errors that name what is wrong, and the CLI on top of it."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import recsys
from recsys.cli import main
from recsys.config import load_config
from recsys.data import generate

FIT = {
    "data.max_len": 10,
    "data.category_col": "category",
    "model.dim": 16,
    "model.num_interests": 4,
    "model.backend": "torch",
    "train.max_steps": 20,
    "train.eval_every": 20,
    "train.batch_size": 32,
    "train.num_negatives": 64,
}


def _clicks() -> pd.DataFrame:
    """~200 items, 400 users of planted synthetic interests, as a plain user/item/time table."""
    cfg = load_config(
        None,
        [
            "synthetic.num_users=400",
            "synthetic.num_items=200",
            "synthetic.num_categories=8",
            "synthetic.interests_per_user=2",
            "synthetic.mean_length=12",
        ],
    )
    df = generate(cfg.synthetic)
    return pd.DataFrame(
        {
            "user": df["user"].astype(str),
            "item": df["item"].astype(str),
            "time": df["time"],
            "category": df["category"].astype(str),
        }
    )


@pytest.fixture(scope="module", params=["dataframe", "path"])
def fitted(request, tmp_path_factory):
    """(run, clicks): trained by recsys.fit on a DataFrame, or on a CSV file of the same clicks."""
    out = tmp_path_factory.mktemp(request.param)
    clicks = _clicks()
    if request.param == "dataframe":
        source = clicks
        overrides = dict(FIT)
    else:
        source = out / "clicks.csv"
        clicks.rename(columns={"time": "ts"}).to_csv(source, index=False)
        overrides = {**FIT, "data.time_col": "ts"}
    run = recsys.fit(source, overrides={**overrides, "output_dir": str(out / "runs")}, log=None)
    return run, clicks


def test_fit_returns_a_loadable_run(fitted):
    run, clicks = fitted
    assert isinstance(run, recsys.Run) and run.path.is_dir()
    assert run.config.model.name == "comirec_sa" and run.config.data.max_len == 10
    assert set(run.dataset.user_raw) <= set(clicks["user"])
    again = recsys.Run.load(run.path)
    assert again.evaluate() == pytest.approx(run.evaluate())


def test_evaluate(fitted):
    run, _ = fitted
    test, valid = run.evaluate(), run.evaluate("valid")
    assert {"recall@20", "recall@50", "ndcg@50", "hitrate@50", "users"} <= test.keys()
    assert 0 < test["recall@50"] <= 1 and test["users"] == len(run._run.split.test.users)
    assert valid["users"] == len(run._run.split.valid.users)
    assert run.dataset.num_categories == 9  # 8 planted categories + "unknown"
    assert run.evaluate(diversity_lambda=1.0)["diversity@50"] > test["diversity@50"]
    with pytest.raises(ValueError, match="split"):
        run.evaluate("train")


def test_item_embeddings_and_interests(fitted):
    run, _ = fitted
    ids, emb = run.item_embeddings()
    assert emb.shape == (run.dataset.num_items - 1, 16) and emb.dtype == np.float32
    assert list(ids) == list(run.dataset.item_raw[1:])
    torch.testing.assert_close(torch.from_numpy(emb), run.model.item_embeddings()[1:].detach().cpu())

    seqs = [list(ids[:3]), [ids[5]], list(ids[:30])]  # the last is cut to its last max_len = 10 items
    got = run.interests(seqs)
    assert got.shape == (3, 4, 16)
    seq = torch.zeros(3, 10, dtype=torch.long)
    seq[0, :3] = torch.tensor([1, 2, 3])
    seq[1, 0] = 6
    seq[2] = torch.arange(21, 31)
    with torch.no_grad():
        want = run.model.interests(seq, torch.tensor([3, 1, 10])).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run.interests([list(ids[:3]) + ["not-an-item"]]), got[:1], rtol=1e-6)
    with pytest.raises(ValueError, match=r"sequences\[1\]: no item known"):
        run.interests([list(ids[:2]), ["nope"]])
    with pytest.raises(TypeError, match="list of raw item ids"):
        run.interests(["abc"])


def test_recommend_users_sequences_and_all(fitted):
    run, _ = fitted
    users = list(run.dataset.user_raw[:3])
    table = run.recommend(users=users, n=5)
    assert list(table.columns) == ["user", "rank", "item", "score", "interest"]
    assert table.groupby("user")["rank"].apply(list).to_dict() == {u: [1, 2, 3, 4, 5] for u in users}
    assert table["item"].isin(run.dataset.item_raw[1:]).all() and table["interest"].between(0, 3).all()
    for user, rows in table.groupby("user"):  # exclude_seen (default): nothing the user clicked
        u = int(np.flatnonzero(run.dataset.user_raw == user)[0])
        seen = set(run.dataset.item_raw[run.dataset.items[run.dataset.indptr[u] : run.dataset.indptr[u + 1]]])
        assert not seen & set(rows["item"])
        assert (np.diff(rows["score"].to_numpy()) <= 1e-6).all()

    # A user's own history as a sequence gives the same recommendations as the user.
    u0 = 0
    history = list(run.dataset.item_raw[run.dataset.items[run.dataset.indptr[u0] : run.dataset.indptr[u0 + 1]]])
    by_seq = run.recommend(sequences=[history], n=5)
    assert list(by_seq["user"]) == [0] * 5
    assert list(by_seq["item"]) == list(table[table["user"] == users[0]]["item"])
    kept = run.recommend(users=users[:1], n=50, exclude_seen=False)
    assert len(kept) == 50

    everyone = run.recommend(n=2)
    assert everyone["user"].nunique() == run.dataset.num_users and len(everyone) == 2 * run.dataset.num_users

    with pytest.raises(ValueError, match="1 unknown user id: 'ghost'"):
        run.recommend(users=["ghost"])
    skipped = run.recommend(users=["ghost", users[0]], n=3, strict=False)
    assert skipped.attrs["unknown_users"] == ["ghost"] and set(skipped["user"]) == {users[0]}
    with pytest.raises(ValueError, match="not both"):
        run.recommend(users=users, sequences=[history])


def test_index_is_saved_and_used(fitted):
    run, _ = fitted
    report = run.index("HNSW16,Flat", ef_search=64)
    assert Path(report.index_file).is_file() and report.factory == "HNSW16,Flat" and report.recall > 0.9
    assert len(run.recommend(users=list(run.dataset.user_raw[:2]), n=4)) == 8
    assert run._recommender.index_name == "HNSW16,Flat"  # the index just saved


def _torch_interests(run, seq, lengths):
    with torch.no_grad():
        return run.model.interests(torch.from_numpy(seq), torch.from_numpy(lengths)).numpy()


def _check_export_folder(run, out: Path, network: str):
    meta = json.loads((out / "export.json").read_text())
    assert meta["network"] == network and meta["num_interests"] == 4 and meta["dim"] == 16
    emb = np.load(out / "item_embeddings.npy")
    np.testing.assert_array_equal(emb, run._run.item_table())
    ids = pd.read_csv(out / "items.csv", dtype={"item": str})
    assert list(ids["id"]) == list(range(1, run.dataset.num_items))
    assert list(ids["item"]) == list(run.dataset.item_raw[1:])


def test_export_onnx_matches_pytorch(fitted, tmp_path, random_batches):
    ort = pytest.importorskip("onnxruntime")
    run, _ = fitted
    out = run.export(tmp_path / "onnx", format="onnx")
    _check_export_folder(run, out, "interests.onnx")
    session = ort.InferenceSession(str(out / "interests.onnx"))
    for seq, lengths in random_batches(run.dataset.num_items, 10):
        (got,) = session.run(None, {"seq": seq, "lengths": lengths})
        np.testing.assert_allclose(got, _torch_interests(run, seq, lengths), atol=1e-4, rtol=0)


def test_export_torchscript_matches_pytorch(fitted, tmp_path, random_batches):
    run, _ = fitted
    out = run.export(tmp_path / "ts", format="torchscript")
    _check_export_folder(run, out, "interests.pt")
    module = torch.jit.load(str(out / "interests.pt"))
    for seq, lengths in random_batches(run.dataset.num_items, 10):
        with torch.no_grad():
            got = module(torch.from_numpy(seq), torch.from_numpy(lengths)).numpy()
        np.testing.assert_allclose(got, _torch_interests(run, seq, lengths), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="format"):
        run.export(tmp_path / "x", format="tflite")


def test_fit_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        recsys.fit(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match=r"no column 'item' \(data.item_col\)"):
        recsys.fit(pd.DataFrame({"user": ["a"], "product": ["x"]}), overrides={"output_dir": str(tmp_path)})
    with pytest.raises(recsys.config.ConfigError, match="model.dimm"):
        recsys.fit(_clicks(), overrides={"model.dimm": 3})
    assert not any(tmp_path.iterdir())  # nothing written for input that failed


def test_a_frame_with_a_missing_time_names_the_row_and_the_setting_that_drops_it(tmp_path):
    clicks = _clicks().assign(time=lambda df: pd.to_datetime(df["time"], unit="s"))
    clicks.loc[3, "time"] = pd.NaT
    with pytest.raises(
        recsys.data.DataError,
        match=r"^<dataframe>: row 4: time NaT is missing or not a number \(set data\.skip_bad_rows=true to drop",
    ):
        recsys.fit(clicks, overrides={"output_dir": str(tmp_path)})
    assert not any(tmp_path.iterdir())


def test_mistyped_run_path_fails_without_creating_it(tmp_path, capsys):
    missing = tmp_path / "runs" / "tyop"
    with pytest.raises(FileNotFoundError, match="tyop"):
        recsys.Run.load(missing)
    for command in (
        ["evaluate", str(missing)],
        ["index", str(missing)],
        ["export", str(missing)],
        ["recommend", str(missing), "--all", "--out", str(tmp_path / "r.csv")],
    ):
        assert main(command) == 2
        assert "tyop" in capsys.readouterr().err
    assert not missing.exists() and not missing.parent.exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        recsys.Run.load(tmp_path / "empty")


def test_cli_export_and_quiet(tiny_run, tmp_path, capsys):
    assert main(["export", tiny_run, "--format", "torchscript", "--out", str(tmp_path / "ts")]) == 0
    assert (tmp_path / "ts" / "interests.pt").is_file()
    assert main(["evaluate", tiny_run, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "Recall@50" in captured.out and "evaluate" not in captured.err


def test_old_run_directory_loads_and_evaluates(tiny_run, tmp_path):
    """A run written before recsys.run existed has the same files but no manifest: copy one file
    by file, with a config.json from before model.positions / head_values existed, and
    re-evaluate it."""
    old = tmp_path / "old"
    shutil.copytree(tiny_run, old, ignore=shutil.ignore_patterns("index", "export", "manifest.json"))
    config = json.loads((old / "config.json").read_text())
    assert config["model"].pop("positions") == "recent"
    config["model"].pop("head_values")
    config["model"]["positions"] = "recent"  # the tiny run trained with recent positions
    (old / "config.json").write_text(json.dumps(config))
    saved = json.loads((old / "test_metrics.json").read_text())
    assert recsys.Run.load(old).evaluate() == pytest.approx(saved)


def test_python_api_example_script_runs(tmp_path):
    import os
    import subprocess

    script = Path(__file__).parents[1] / "experiments" / "python_api_example.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the PyTorch twins on CPU
    done = subprocess.run(
        [sys.executable, str(script), "--steps", "20", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "test metrics" in done.stdout and "HNSW recall@50" in done.stdout
    by_hand_and_recommend = done.stdout.split("best item by hand ")[1]
    best_by_hand, best_by_recommend = by_hand_and_recommend.split(", by recommend(exclude_seen=False) ")
    assert best_by_hand == best_by_recommend.split()[0]


def test_export_without_the_extra_names_it(tiny_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if `multi-interest-recsys[export]` were not installed
    assert main(["export", tiny_run, "--out", str(tmp_path / "x")]) == 2
    assert "pip install 'multi-interest-recsys[export]'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # no empty export folder left behind


def test_api_checks_lambda_and_run_files_like_the_cli(tiny_run, tmp_path):
    """The Python API refuses what the CLI and the service refuse: a diversity λ outside
    [0, MAX_DIVERSITY_LAMBDA] (before any work), and a run file that fails its manifest."""
    from recsys.run import IntegrityError

    run = recsys.Run.load(tiny_run)
    for lam in (float("inf"), float("nan"), 1e308, -1.0):
        with pytest.raises(ValueError, match="diversity_lambda"):
            run.recommend(n=3, diversity_lambda=lam)
        with pytest.raises(ValueError, match="diversity_lambda"):
            run.evaluate(diversity_lambda=lam)
    damaged = shutil.copytree(tiny_run, tmp_path / "run", ignore=shutil.ignore_patterns("index", "export"))
    best = damaged / "best.pt"
    data = bytearray(best.read_bytes())
    data[len(data) // 2] ^= 0xFF
    best.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="best.pt: corrupted"):
        recsys.Run.load(damaged)


def test_fit_with_another_model_resolves_its_automatic_values(tmp_path):
    # the defaults' automatic values are comirec_sa's (score cap 1, soft readout 1000 steps); a mapping that
    # names another model must get that model's (0 and 0), as `--set model.name=mind` does
    overrides = {**FIT, "model.name": "mind", "train.max_steps": 2, "train.eval_every": 2, "output_dir": str(tmp_path)}
    run = recsys.fit(_clicks(), overrides=overrides, log=None)
    assert (run.config.model.score_cap, run.config.train.soft_readout_steps) == (0.0, 0)
    by_values = load_config(None, values={"model.name": "mind"})
    assert by_values.to_dict() == load_config(None, ["model.name=mind"]).to_dict()
