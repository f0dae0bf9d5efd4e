"""``model.cold_scale = -1`` and ``retrieval.new_item_share = -1`` (the defaults): how items without
clicks rank, chosen on validation once a run has trained (:mod:`recsys.train.new_items`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from recsys.config import Config, ConfigError, load_config
from recsys.items import ItemTable
from recsys.run import load_run
from recsys.train import new_items as chooser
from recsys.train.new_items import SCALES, SHARES, TOLERANCE, choose_for_new_items
from tests.conftest import tiny_clicks_overrides


def _write(root: Path) -> dict[str, str | int]:
    """A small log whose items i3 and i5 are held out of training (their attributes kept), so they
    are items without clicks that validation users click."""
    rng = np.random.default_rng(3)
    rows = "".join(f"u{u},i{int(i)}\n" for u in range(80) for i in rng.integers(1, 25, 10))
    (root / "clicks.csv").write_text("user,item\n" + rows)
    (root / "items.csv").write_text("item,genre\n" + "".join(f"i{i},g{i % 4}\n" for i in range(1, 25)))
    (root / "held.txt").write_text("i3\ni5\n")
    return {
        **tiny_clicks_overrides(root / "clicks.csv", root / "runs", 10),
        "data.item_features": str(root / "items.csv"),
        "data.held_out_items": str(root / "held.txt"),
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from recsys.api import fit

    root = tmp_path_factory.mktemp("cold-scale")
    lines: list[str] = []
    run = fit(None, overrides=_write(root), log=lines.append)
    return load_run(run.path), lines


def test_a_trained_run_records_the_chosen_values_and_says_why(trained):
    run, lines = trained
    saved = json.loads((run.path / "config.json").read_text())
    scale, share = saved["model"]["cold_scale"], saved["retrieval"]["new_item_share"]
    for name, value, grid in [("model.cold_scale", scale, SCALES), ("retrieval.new_item_share", share, SHARES)]:
        said = [line for line in lines if line.startswith(f"{name}: ")]
        assert value in grid and len(said) == 1 and said[0].startswith(f"{name}: {value:g}, the largest")
    assert run.cfg.model.cold_scale == scale and run.cfg.retrieval.new_item_share == share  # what loading reads
    (table,) = [m for m in run.model.modules() if isinstance(m, ItemTable)]
    assert table.cold_scale == scale


def _choosing(cfg: Config, scale: float = -1.0, share: float = -1.0) -> Config:
    """A copy of ``cfg`` with the two settings as given (-1: left to the chooser)."""
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, cold_scale=scale),
        retrieval=dataclasses.replace(cfg.retrieval, new_item_share=share),
    )


def _scripted(monkeypatch, values: dict[tuple[float, float], float]) -> list[tuple[float, float]]:
    """Make the chooser's validation return ``values[(scale, share)]``; the pairs it tried, in order."""
    tried: list[tuple[float, float]] = []

    def evaluate(model, valid, cfg, item_category=None, across_ranks=False):
        (table,) = [m for m in model.modules() if m.__class__.__name__.endswith("Table")]
        tried.append((table.cold_scale, cfg.retrieval.new_item_share))
        return {cfg.eval.objective: values[tried[-1]]}

    monkeypatch.setattr(chooser, "evaluate_with_config", evaluate)
    return tried


def test_the_largest_values_within_the_tolerance_of_the_best_and_each_search_stops_past_it(trained, monkeypatch):
    run, _ = trained
    cfg = _choosing(run.cfg)
    best = 0.302
    scales = {1.0: 0.300, 1.1: best, 1.2: best * (1 - TOLERANCE / 2), 1.3: best * (1 - 2 * TOLERANCE), 1.4: 0.25}
    shares = {0.0: best, 0.02: 0.31, 0.05: 0.31 * (1 - TOLERANCE / 2), 0.1: 0.2}
    tried = _scripted(
        monkeypatch, {**{(s, 0.0): v for s, v in scales.items()}, **{(1.2, s): v for s, v in shares.items()}}
    )
    lines: list[str] = []
    chosen = choose_for_new_items(run.model, run.split.valid, cfg, None, lines.append)
    assert (chosen.model.cold_scale, chosen.retrieval.new_item_share) == (1.2, 0.05)
    # 1.4 and a share of 0.1 are over 5% below the best: larger values are not tried
    assert tried == [(s, 0.0) for s in scales] + [(1.2, s) for s in shares]
    assert "model.cold_scale: 1.2" in lines[0] and "1.4: 0.2500" in lines[0]
    assert "retrieval.new_item_share: 0.05" in lines[1] and "0.1: 0.2000" in lines[1]


def test_a_given_value_is_kept_and_only_the_other_is_chosen(trained, monkeypatch):
    run, _ = trained
    tried = _scripted(monkeypatch, {(1.3, 0.0): 0.3, (1.3, 0.02): 0.3, (1.3, 0.05): 0.1})
    cfg = _choosing(run.cfg, scale=1.3)
    run.model.embedding.cold_scale = 1.3  # as a run built with the given scale has it
    chosen = choose_for_new_items(run.model, run.split.valid, cfg, None, print)
    assert chosen.model.cold_scale == 1.3 and chosen.retrieval.new_item_share == 0.02 and tried[0] == (1.3, 0.0)
    given = _choosing(run.cfg, scale=1.3, share=0.1)
    assert choose_for_new_items(run.model, run.split.valid, given, None, print) is None


def test_nothing_is_tried_where_validation_has_no_item_without_clicks(trained, monkeypatch):
    run, _ = trained
    tried = _scripted(monkeypatch, {})
    lines: list[str] = []
    valid = run.split.valid
    cold = torch.nonzero(~run.model.embedding.warm).squeeze(1).numpy()
    keep = np.flatnonzero(
        [not np.isin(valid.truth_items[a:b], cold).any() for a, b in zip(valid.truth_indptr, valid.truth_indptr[1:])]
    )
    warm_only = valid.rows(keep)
    assert len(warm_only) < len(valid)  # the held-out items are validation targets
    cfg = _choosing(run.cfg)
    chosen = choose_for_new_items(run.model, warm_only, cfg, None, lines.append)
    assert (chosen.model.cold_scale, chosen.retrieval.new_item_share) == (1.0, 0.0)
    assert tried == [] and "no validation target is an item without clicks" in lines[0]


def test_the_settings_take_minus_one_or_a_value_of_their_range():
    with pytest.raises(ConfigError, match=r"model.cold_scale: must be > 0 \(or -1"):
        load_config(None, ["model.cold_scale=0"])
    with pytest.raises(ConfigError, match="needs data.item_features"):
        load_config(None, ["model.cold_scale=1.5"])
    with pytest.raises(ConfigError, match=r"retrieval.new_item_share: must be in \[0, 1\) \(or -1"):
        load_config(None, ["retrieval.new_item_share=1.0"])
    with pytest.raises(ConfigError, match="retrieval.new_item_share=0.1: reserves places.*needs data.item_features"):
        load_config(None, ["retrieval.new_item_share=0.1"])
    cfg = load_config(None, [])
    assert cfg.model.cold_scale == -1.0 and cfg.retrieval.new_item_share == -1.0


def test_a_run_keeps_the_chosen_share_when_served(trained):
    """Serving a run (the Recommender, host and device search) keeps its chosen share of each list for new items."""
    from recsys.serve.recommender import Recommender

    run, _ = trained
    valid = run.split.valid
    cold = (~run.model.embedding.warm).numpy()
    cold[0] = False
    n = np.array([5, 10] * 3)
    for share in (0.0, 0.2, 0.5):
        for backend in ("faiss", "torch"):
            settings = dataclasses.replace(run.cfg.retrieval, new_item_share=share, backend=backend)
            rec = Recommender.of_run(run, settings, log=lambda _: None)
            out = rec.recommend(valid.inputs[: len(n)], valid.lengths[: len(n)], n)
            kept = np.array([cold[row[:size]].sum() for row, size in zip(out.ids, n)])
            wanted = np.minimum((share * n).astype(int), cold.sum())  # two new items in this catalogue
            assert (out.ids[0, 5:] == -1).all()
            if share:
                assert (kept >= wanted).all()
            else:  # the lists by score alone hold fewer: the share is what put them there
                assert (kept < np.minimum((0.5 * n).astype(int), cold.sum())).any()


def test_recommend_takes_a_share_of_its_own(trained, tmp_path):
    import pandas as pd

    from recsys.cli import main

    run, _ = trained
    out = tmp_path / "r.csv"
    args = ["--all", "--n", "4", "--no-exclude-seen", "--new-item-share", "0.5", "--out", str(out)]
    assert main(["recommend", str(run.path), *args]) == 0
    table = pd.read_csv(out)
    held = {"i3", "i5"}
    per_user = table.groupby("user")["item"].apply(lambda items: len(held & set(items)))
    assert (per_user == 2).all()  # half of every list of 4: the two new items (none excluded)
