"""Load a self-contained run directory (config, prepared dataset, weights) and evaluate it.

Used by ``recsys evaluate | index | recommend | serve``: a run directory needs nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from recsys.config import Config, ConfigError, run_config_from_dict
from recsys.data import load_dataset
from recsys.data.prepare import Dataset
from recsys.data.split import Split, split_dataset
from recsys.evaluate.evaluator import evaluate_with_config
from recsys.models import InterestModel, build_model
from recsys.train.checkpoint import CONFIG, DATASET, RunDir


@dataclass
class LoadedRun:
    """A run directory in memory: its config, dataset, split and best model (in eval mode)."""

    path: Path
    cfg: Config
    dataset: Dataset
    split: Split
    model: InterestModel


def _model_for(cfg: Config, ds: Dataset, split: Split) -> InterestModel:
    counts = torch.from_numpy(np.bincount(split.train_items, minlength=ds.num_items).astype(np.int64))
    return build_model(cfg.model, ds.num_items, cfg.data.max_len, item_counts=counts)


def read_run_config(path: str | Path) -> Config:
    """The config a run was trained with (its ``config.json``, verified against the manifest);
    errors name the file."""
    path = Path(path)
    config_file = path / CONFIG
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} is not a run directory (no {CONFIG})")
    try:
        values = RunDir(path).read_config()
    except ValueError as err:  # IntegrityError or invalid JSON, already naming the file
        raise ConfigError(str(err)) from None
    if not isinstance(values, dict):
        raise ConfigError(f"{config_file}: not a JSON object")
    try:
        return run_config_from_dict(values)
    except ConfigError as err:
        raise ConfigError(f"{config_file}: {err}") from None


def load_run(path: str | Path, device: str | torch.device = "cpu") -> LoadedRun:
    """Load ``path`` (written by ``recsys train``) with its best weights; every file is
    verified against the run's manifest first."""
    cfg = read_run_config(path)
    rd = RunDir(path)
    rd.verify_tree(DATASET)
    ds = Dataset.load(rd.file(DATASET))
    split = split_dataset(ds, cfg.data)
    model = _model_for(cfg, ds, split)
    if not rd.has_best():
        raise FileNotFoundError(f"{rd.path} has no trained weights (best.pt) yet")
    model.load_state_dict(rd.load_best(map_location="cpu"))
    model.to(device).eval()
    return LoadedRun(rd.path, cfg, ds, split, model)


def evaluate_run(path: Path, cfg: Config | None = None, split: str = "test") -> dict[str, float]:
    """Re-evaluate a saved run on its ``test`` (or ``valid``) users; ``cfg`` may change eval options."""
    run = load_run(path, device="cuda" if torch.cuda.is_available() else "cpu")
    cfg = cfg or run.cfg
    eval_set = run.split.test if split == "test" else run.split.valid
    return evaluate_with_config(run.model, eval_set, cfg, item_category=run.dataset.item_category)


def evaluate_untrained(cfg: Config, split: str = "test", log: Callable[[str], None] = print) -> dict[str, float]:
    """Evaluate a model that needs no training (``popular``) on ``cfg``'s data."""
    ds = load_dataset(cfg)
    sp = split_dataset(ds, cfg.data)
    log(f"data after filtering: {ds.num_users} users, {ds.num_items - 1} items, {len(ds.items)} clicks; "
        f"eval users: valid {len(sp.valid.users)}, test {len(sp.test.users)}")
    model = _model_for(cfg, ds, sp)
    if model.trainable:
        raise ValueError(f"model.name: {cfg.model.name!r} must be trained first (recsys train), then evaluate its run")
    eval_set = sp.test if split == "test" else sp.valid
    return evaluate_with_config(model.eval(), eval_set, cfg, item_category=ds.item_category)
