"""One experiment's setup, written once: load the clicks, split them, count the training
clicks per item, build the model. Used by training, run loading, indexing, serving, export and
the experiments; :func:`load_run` is the same setup on a saved run plus its best weights and the
items added to it since (:mod:`recsys.run.new_items`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from recsys.config import Config
from recsys.data import Dataset, Split, load_dataset, split_dataset
from recsys.device import model_device, resolve_device, to_device
from recsys.models import InterestModel, build_model, spec_for
from recsys.run.layout import RunDir
from recsys.run.settings import Facts, check, resolve

if TYPE_CHECKING:
    import pandas as pd

    from recsys.data.features import ItemFeatures

# (the resolved config, the model on the meta device, catalogue size with padding); what it returns is ignored
CheckMemory = Callable[[Config, InterestModel, int], object]

__all__ = ["Experiment", "Facts", "LoadedRun", "build_experiment", "load_run", "train_item_counts"]


def train_item_counts(split: Split, num_items: int) -> Tensor:
    """``[num_items]`` int64 click counts over the training sequences only (no eval leakage)."""
    return torch.from_numpy(split.train_item_counts(num_items))


@dataclass(eq=False)
class Experiment:
    """A resolved config with its prepared dataset, split, training click counts ``[num_items]``,
    model and the facts the config was resolved with."""

    cfg: Config
    dataset: Dataset
    split: Split
    item_counts: Tensor
    model: InterestModel
    facts: Facts

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live."""
        return model_device(self.model)

    def item_table(self) -> np.ndarray:
        """``[num_items, d]`` float32 item embeddings of the model (row 0 = padding)."""
        with torch.inference_mode():
            return self.model.item_embeddings().detach().to("cpu", torch.float32).numpy().copy()

    def interests(self, inputs: np.ndarray, lengths: np.ndarray, batch_size: int = 2048) -> np.ndarray:
        """Interests ``[B, K, d]`` float32 of right-padded ``inputs [B, L]`` (internal ids) with
        ``lengths [B]``, computed ``batch_size`` rows at a time in eval mode (on a GPU: queued
        without waiting for it, and copied back once)."""
        out = []
        self.model.eval()
        with torch.inference_mode():
            for start in range(0, len(lengths), batch_size):
                seq, lens = to_device(
                    (
                        np.asarray(inputs[start : start + batch_size], dtype=np.int64),
                        np.asarray(lengths[start : start + batch_size], dtype=np.int64),
                    ),
                    self.device,
                )
                out.append(self.model.interests(seq, lens).float())
        if not out:
            k, d = int(getattr(self.model, "num_interests", 1)), self.item_table().shape[1]
            return np.zeros((0, k, d), dtype=np.float32)
        return torch.cat(out).cpu().numpy()


def build_experiment(
    cfg: Config,
    *,
    dataset: Dataset | None = None,
    clicks: pd.DataFrame | None = None,
    progress: bool = False,
    check_memory: CheckMemory | None = None,
    device: str | torch.device = "cpu",
    world_size: int = 1,
) -> Experiment:
    """Load ``cfg``'s data (or use ``dataset``, or the click table ``clicks``), split it, count
    the training clicks, resolve ``cfg`` and build its model (untrained, on the CPU).

    This is where a config's automatic values are decided, once: :func:`recsys.run.settings.resolve`
    with the :class:`~recsys.run.settings.Facts` of the data and of training on ``device`` with
    ``world_size`` processes; the experiment holds the resolved copy. A setting the model does not
    read fails before the data is read (:func:`recsys.run.settings.check`).

    ``check_memory(cfg, shapes, num_items)``, when given, runs before the model takes any memory,
    with the resolved config, on the same model built on the ``meta`` device (parameters with
    shapes and no storage), so a size that cannot fit (e.g. :func:`recsys.train.memory.check_fits`)
    is refused before it is allocated rather than by the allocator or the out-of-memory killer.
    """
    check(cfg)
    ds = dataset if dataset is not None else load_dataset(cfg, clicks=clicks, progress=progress)
    if ds.features is not None and not (cfg.model.use_features and spec_for(cfg.model.name).trainable):
        ds = dataclasses.replace(ds, features=None)  # the run's catalogue is what its model represents
    split = split_dataset(ds, cfg.data)
    facts = Facts.of(ds, split, device, world_size)
    cfg = resolve(cfg, facts)
    counts = train_item_counts(split, ds.num_items)

    def build() -> InterestModel:
        return build_model(cfg.model, ds.num_items, cfg.data.max_len, item_counts=counts, features=ds.features)

    if check_memory is not None:
        with torch.device("meta"):
            check_memory(cfg, build(), ds.num_items)
    model = build()
    return Experiment(cfg, ds, split, counts, model, facts)


@dataclass(eq=False)
class LoadedRun(Experiment):
    """A saved run in memory: its experiment with the best weights (model in eval mode)."""

    dir: RunDir
    additions: int = 0  # the run's additions (recsys.run.new_items) its dataset and model hold

    @property
    def path(self) -> Path:
        return self.dir.path

    def take_new_items(self, blocks: list[ItemFeatures]) -> None:
        """Append the new items of ``blocks`` (each a block of feature rows,
        :func:`recsys.data.features.new_items`) to the run's catalogue in memory: its dataset's
        features and its model's item table grow (:meth:`recsys.items.ItemTable.add_items`);
        nothing is written."""
        if not blocks:
            return
        if self.dataset.features is None:
            raise ValueError(f"{self.path}: has added items, but its model reads no item features")
        ds = self.dataset
        for rows in blocks:
            ds = ds.with_new_items(rows)
        assert ds.features is not None
        self.model.add_new_items(ds.features)
        self.dataset = ds
        self.additions += len(blocks)


def load_run(path: str | Path, device: str | torch.device = "cpu") -> LoadedRun:
    """Open run directory ``path`` (written by ``recsys train``) with its best weights and the
    items added to it after training (:func:`recsys.run.add_items`).

    Raises ``FileNotFoundError`` naming ``path`` when it is not a trained run (nothing is created).
    ``device``: see :func:`recsys.device.resolve_device` (``auto`` = CUDA when available).
    """
    device = resolve_device(device)  # a GPU this machine lacks fails before anything is read
    rd = RunDir(path)
    rd.require_trained()
    cfg = rd.read_config()
    exp = build_experiment(cfg, dataset=rd.load_dataset(), device=device)
    rd.load_best(map_location="cpu", model=exp.model)
    run = LoadedRun(exp.cfg, exp.dataset, exp.split, exp.item_counts, exp.model, exp.facts, rd)
    run.take_new_items(rd.load_added_items())
    run.model.to(device).eval()
    return run
