"""``model.cold_scale = -1`` (the default): the boost of items without clicks chosen on validation
once a run has trained (:mod:`recsys.train.cold_scale`)."""

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
from recsys.train import cold_scale as chooser
from recsys.train.cold_scale import GRID, TOLERANCE, choose_cold_scale
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


def test_a_trained_run_records_the_chosen_scale_and_says_why(trained):
    run, lines = trained
    saved = json.loads((run.path / "config.json").read_text())["model"]["cold_scale"]
    said = [line for line in lines if line.startswith("model.cold_scale: ")]
    assert saved in GRID and len(said) == 1 and said[0].startswith(f"model.cold_scale: {saved:g}, the largest")
    assert run.cfg.model.cold_scale == saved  # what loading the run reads, into its table
    (table,) = [m for m in run.model.modules() if isinstance(m, ItemTable)]
    assert table.cold_scale == saved


def _with_scale(cfg: Config, scale: float) -> Config:
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, cold_scale=scale))


def _scripted(monkeypatch, values: dict[float, float]) -> list[float]:
    """Make the chooser's validation return ``values[scale]``; the scales it tried, in order."""
    tried: list[float] = []

    def evaluate(model, valid, cfg, item_category=None, across_ranks=False):
        (table,) = [m for m in model.modules() if m.__class__.__name__.endswith("Table")]
        tried.append(table.cold_scale)
        return {cfg.eval.objective: values[table.cold_scale]}

    monkeypatch.setattr(chooser, "evaluate_with_config", evaluate)
    return tried


def test_the_largest_scale_within_the_tolerance_of_the_best_and_the_search_stops_past_it(trained, monkeypatch):
    run, _ = trained
    cfg = _with_scale(run.cfg, -1.0)
    best = 0.302
    values = {1.0: 0.300, 1.1: best, 1.2: best * (1 - TOLERANCE / 2), 1.3: best * (1 - 2 * TOLERANCE), 1.4: 0.25}
    tried = _scripted(monkeypatch, values)
    lines: list[str] = []
    assert choose_cold_scale(run.model, run.split.valid, cfg, None, lines.append) == 1.2
    assert tried == [1.0, 1.1, 1.2, 1.3, 1.4]  # 1.4 is over 5% below the best: larger scales are not tried
    assert "model.cold_scale: 1.2" in lines[0] and "1.4: 0.2500" in lines[0]


def test_nothing_is_chosen_where_the_user_gave_a_scale_or_validation_has_no_such_item(trained, monkeypatch):
    run, _ = trained
    tried = _scripted(monkeypatch, {})
    given = _with_scale(run.cfg, 1.3)
    assert choose_cold_scale(run.model, run.split.valid, given, None, print) is None
    lines: list[str] = []
    valid = run.split.valid
    cold = torch.nonzero(~run.model.embedding.warm).squeeze(1).numpy()
    keep = np.flatnonzero(
        [not np.isin(valid.truth_items[a:b], cold).any() for a, b in zip(valid.truth_indptr, valid.truth_indptr[1:])]
    )
    warm_only = valid.rows(keep)
    assert len(warm_only) < len(valid)  # the held-out items are validation targets
    assert choose_cold_scale(run.model, warm_only, _with_scale(run.cfg, -1.0), None, lines.append) == 1.0
    assert tried == [] and "no validation target is an item without clicks" in lines[0]


def test_the_setting_takes_minus_one_or_a_positive_scale():
    with pytest.raises(ConfigError, match=r"model.cold_scale: must be > 0 \(or -1"):
        load_config(None, ["model.cold_scale=0"])
    with pytest.raises(ConfigError, match="needs data.item_features"):
        load_config(None, ["model.cold_scale=1.5"])
    assert load_config(None, []).model.cold_scale == -1.0
