"""Leave-one-out end to end: the whole input excluded, the objective metric, a trained run under the
protocol, and runs saved before it existed evaluating as they did."""

import json
import shutil

import numpy as np
import pytest
import torch

from recsys.api import Run
from recsys.cli import main
from recsys.config import ConfigError, DataConfig, load_config
from recsys.data.prepare import Dataset
from recsys.data.split import split_dataset
from recsys.evaluate import compute_metrics, evaluate, evaluate_with_config
from recsys.models.base import InterestModel
from recsys.run import RunDir
from recsys.train.trainer import train

from conftest import TINY_RUN_OVERRIDES, resolved

NUM_ITEMS = 50


class LastClickModel(InterestModel):
    """K = 1: the embedding of the last input click."""

    num_interests = 1

    def __init__(self, emb: np.ndarray) -> None:
        super().__init__()
        self.emb = torch.nn.Parameter(torch.from_numpy(emb))

    def interests(self, seq, lengths):
        return self.emb[seq.gather(1, (lengths - 1)[:, None])]  # [B, 1, d]

    def item_embeddings(self):
        return self.emb


def _dataset(num_users: int = 150) -> Dataset:
    """Sequences of 3..40 clicks over a small catalogue, so that inputs often outgrow max_len."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 41, size=num_users)
    items = rng.integers(1, NUM_ITEMS, size=int(lengths.sum()))
    return Dataset(
        item_raw=np.array(["<pad>"] + [str(i) for i in range(1, NUM_ITEMS)]),
        user_raw=np.array([f"u{u}" for u in range(num_users)]),
        indptr=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        items=items,
        times=np.arange(len(items), dtype=np.float64),
        item_category=np.zeros(NUM_ITEMS, dtype=np.int64),
        category_raw=np.array(["<unknown>"]),
        item_counts=np.bincount(items, minlength=NUM_ITEMS),
    )


def _brute_metrics(emb: np.ndarray, ds: Dataset, test, whole_input: bool) -> dict[str, float]:
    """The test users' metrics by a full sort: every item scored by the last input click, minus the
    user's clicks before the target (the last one): all of them, or only the ``max_len`` fed to
    the model."""
    last = test.inputs[np.arange(len(test)), test.lengths - 1]
    scores = (emb[last] @ emb.T).astype(np.float64)
    scores[:, 0] = -np.inf
    for i, u in enumerate(test.users):
        before = ds.items[ds.indptr[u] : ds.indptr[u + 1] - 1]
        scores[i, before if whole_input else test.inputs[i, : test.lengths[i]]] = -np.inf
    top = np.argsort(-scores, axis=1, kind="stable")[:, :50]
    return compute_metrics(top, test.truth_indptr, test.truth_items, topn=(10, 50), num_items=NUM_ITEMS)


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_exclusion_removes_every_earlier_click_not_only_the_models_input(backend):
    ds = _dataset()
    split = split_dataset(ds, DataConfig(split="leave_one_out", max_len=3))
    assert (np.diff(ds.indptr)[split.test.users] - 1 > 3).any()  # inputs longer than max_len
    emb = np.random.default_rng(1).standard_normal((NUM_ITEMS, 8)).astype(np.float32)
    got = evaluate(LastClickModel(emb), split.test, topn=(10, 50), exclude_history=True, batch_size=16, backend=backend)
    want = _brute_metrics(emb, ds, split.test, whole_input=True)
    assert got == pytest.approx(want)
    assert want != pytest.approx(_brute_metrics(emb, ds, split.test, whole_input=False))  # the difference shows


def test_exclusion_follows_the_protocol_unless_set():
    ds = _dataset()
    emb = np.random.default_rng(2).standard_normal((NUM_ITEMS, 8)).astype(np.float32)
    model = LastClickModel(emb)
    for split_name, overrides, excluded in [
        ("leave_one_out", [], True),
        ("leave_one_out", ["eval.exclude_history=false"], False),
        ("user", [], False),
        ("user", ["eval.exclude_history=true"], True),
    ]:
        cfg = load_config(None, [f"data.split={split_name}", "data.max_len=3", *overrides])
        test = split_dataset(ds, cfg.data).test
        got = evaluate_with_config(model, test, resolved(cfg))
        assert got == pytest.approx(evaluate(model, test, topn=(10, 20, 50), exclude_history=excluded)), overrides


def test_objective_names_a_metric_at_a_cutoff():
    assert load_config(None, ["eval.objective=ndcg@10"]).eval.objective == "ndcg@10"
    for bad in ("precision@10", "ndcg@30", "mrr", "ndcg@x"):
        with pytest.raises(ConfigError, match=r"^eval.objective: .* N in eval.topn \[10, 20, 50\]"):
            load_config(None, [f"eval.objective={bad}"])
    with pytest.raises(ConfigError, match="eval.exclude_history"):
        load_config(None, ["eval.exclude_history=sometimes"])


def test_a_run_under_leave_one_out_keeps_the_best_objective(tmp_path, capsys):
    overrides = [*TINY_RUN_OVERRIDES, "data.split=leave_one_out", "eval.objective=mrr@10", "train.max_steps=40"]
    cfg = load_config(None, [*overrides, "train.eval_every=10", f"output_dir={tmp_path}"])
    result = train(cfg, log=lambda line: None)
    rd = RunDir(result.run_dir)
    valid = [r for r in rd.read_metrics() if r.get("split") == "valid"]
    assert len(valid) >= 3 and result.best_valid == max(r["mrr@10"] for r in valid)
    test = rd.read_test_metrics()
    assert {"recall@10", "ndcg@10", "hitrate@10", "mrr@10", "mrr@50"} <= set(test)
    assert test["recall@10"] == test["hitrate@10"]  # one target per user
    run = Run.load(result.run_dir, device="cpu")
    assert run.evaluate() == pytest.approx(test)
    test_set = run.eval_set("test")
    assert (np.diff(test_set.truth_indptr) == 1).all() and test["users"] == len(test_set) > 0
    capsys.readouterr()
    assert main(["evaluate", result.run_dir, "--quiet"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert [c.strip() for c in header.strip("|").split("|")][1:5] == ["Recall@10", "NDCG@10", "HitRate@10", "MRR@10"]


def test_runs_saved_before_the_protocol_evaluate_as_they_did(tiny_run, tmp_path):
    """A config.json without eval.objective, eval.topn [20, 50] and eval.exclude_history false
    (the defaults then): ComiRec's protocol, no exclusion, its two cutoffs."""
    old = tmp_path / "old"
    shutil.copytree(tiny_run, old)
    rd = RunDir(old)
    saved = json.loads((old / "config.json").read_text())
    del saved["eval"]["objective"]
    saved["eval"].update(topn=[20, 50], exclude_history=False)
    rd.save_config(saved)
    run = Run.load(old, device="cpu")
    assert run.config.data.split == "user" and run.config.eval.objective == "recall@50"  # resolved from its topn
    got = run.evaluate()
    assert {k for k in got if "@" in k} == {
        f"{m}@{n}" for m in ("recall", "ndcg", "hitrate", "mrr", "coverage", "diversity") for n in (20, 50)
    }
    test, cats = run.eval_set("test"), run.dataset.item_category
    assert got == pytest.approx(evaluate(run.model, test, topn=(20, 50), exclude_history=False, item_category=cats))
    assert got != pytest.approx(evaluate(run.model, test, topn=(20, 50), exclude_history=True, item_category=cats))
    assert len(test) == round(0.1 * run.dataset.num_users)  # ComiRec's 8:1:1 user split
