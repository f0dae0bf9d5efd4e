"""A warm start (``recsys train --init-from RUN``): a new run on a newer log starts from an earlier
run's best weights instead of fresh ones.

The new run is a run of its own: its data, its split, its resolved config and its run directory.
Only its starting weights come from the earlier run:

- **the network** (every parameter outside the item table: encoder, heads, positions, norms) is
  copied by name; the two models must be the same model (same names and shapes), else the start is
  refused naming the first setting that differs and both values. The new config's automatic model
  settings (``model.dim``, ``model.hidden``, ...) take the earlier run's values (:func:`follow_model`),
  so a log that grew past a size rule keeps the model it continues, and the readout's warm-up
  (``train.soft_readout_steps``) is skipped where automatic: the interests have formed;
- **the item rows** are matched by raw item id (the two runs number items by their own popularity
  order): an item of both logs keeps its row, an item the new log dropped is gone
  (:meth:`recsys.items.ItemTable.load_rows`). An item new to this log starts as the mean row of the
  known items clicked right before and after it in the training sequences
  (:func:`neighbour_pairs`), a row near what it will learn where a fresh row would be learned from
  its clicks alone, as in a cold run; one never clicked beside a known item keeps the new model's
  fresh row (with item features, its features carry it as well). With features on both sides each
  field's value rows are copied by raw value (a brand keeps its row), and the vectors' map where
  they are as wide;
- **the optimiser starts fresh**: Adam's moments estimate the earlier log's gradients at the
  earlier weights' last steps, and its bias correction restarts with them, so the first steps are
  as small as a fresh run's (no learning-rate warm-up is needed). The weight average
  (``train.ema_decay``) starts from the loaded weights, the step counter, the patience and the
  plan's budget from zero.

The run directory records the start (:meth:`recsys.run.RunDir.read_origin`), and the log says it in
one line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from recsys.config import Config, ConfigError, automatic_keys, is_automatic
from recsys.data import Dataset
from recsys.data.batches import gather_rows
from recsys.data.split import Split
from recsys.items import find_item_table
from recsys.run import Experiment, LoadedRun, load_run
from recsys.text import count

__all__ = ["WarmStart", "follow_model", "neighbour_pairs", "open_earlier", "warm_start"]

# the settings a differing parameter is most likely due to, named first; then the rest of the model's
SAME = "a warm start needs the same model"
FIRST_SETTINGS = ("model.name", "model.dim", "model.num_interests", "model.hidden", "model.num_layers", "data.max_len")
# settings that shape no parameter: never the reason a parameter differs
SHAPELESS = {"model.dropout", "model.attention_dropout", "model.backend", "model.softcap", "model.score_cap"}
SHAPELESS |= {"model.routing_iters", "model.init", "model.filter_alpha"}


@dataclass(frozen=True)
class WarmStart:
    """What a warm start carried: the earlier run, the items matched by raw id (``known``) among
    this run's ``items``, the earlier run's items this log lacks (``dropped``), the network's
    tensors copied (``parameters``), with features ``(field, values copied, values here)``, and the
    new items that started from the rows of the items clicked beside them (``from_neighbours``)."""

    run: str
    known: int
    items: int
    dropped: int
    parameters: int
    values: tuple[tuple[str, int, int], ...] = ()
    from_neighbours: int = 0

    @property
    def new(self) -> int:
        """Items of this run the earlier one did not have: fresh rows (or their features alone)."""
        return self.items - self.known

    def line(self) -> str:
        """The log's one line: ``initialised from RUN: 11,873 of 12,101 items by id, 228 new, 14
        parameters copied`` (and what the earlier run had that this log lacks, and the feature values)."""
        text = f"initialised from {self.run}: {self.known:,} of {count(self.items, 'item')} by id, {self.new:,} new"
        if self.new:
            text += f" ({self.from_neighbours:,} from the known items clicked beside them)"
        text += f", {count(self.parameters, 'parameter')} copied"
        if self.dropped:
            text += f"; {self.dropped:,} of its items are not in this log"
        if self.values:
            text += "; feature values by name: " + ", ".join(f"{f} {n:,} of {m:,}" for f, n, m in self.values)
        return text

    def record(self) -> dict[str, Any]:
        """Plain data for the run directory (``init_from.json``)."""
        return {**dataclasses.asdict(self), "new": self.new, "values": [list(v) for v in self.values]}


def open_earlier(path: str | Path) -> LoadedRun:
    """The run a warm start starts from, with its best weights (on the CPU). A path that is not a
    trained run (no config, no best weights) is a ``FileNotFoundError`` naming it."""
    try:
        return load_run(path)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"--init-from: {err}") from None


def follow_model(cfg: Config, earlier: Config) -> Config:
    """``cfg`` with its automatic model settings (``model.dim``, ``model.hidden``, ...) set to the
    ``earlier`` run's resolved values: a warm start continues that model, whatever the size rules
    would decide on the newer log. Settings given in ``cfg`` stay as given (and must match).

    The readout's warm-up (``train.soft_readout_steps``), when automatic, is 0: it exists to let a
    fresh model's K interests form before the argmax readout picks among them, and the earlier
    run's interests have formed; rerunning it blends them again (measured: docs/results.md, "The
    item side")."""
    leaves = {key.split(".", 1)[1] for key in automatic_keys(cfg) if key.startswith("model.")}
    if cfg.model.name != earlier.model.name:
        return cfg  # another model: warm_start refuses it, naming model.name
    model = dataclasses.replace(cfg.model, **{leaf: getattr(earlier.model, leaf) for leaf in leaves})
    train = cfg.train
    if is_automatic(cfg, "train.soft_readout_steps"):
        train = dataclasses.replace(train, soft_readout_steps=0)
    return dataclasses.replace(cfg, model=model, train=train)


def warm_start(exp: Experiment, earlier: LoadedRun) -> WarmStart:
    """Load ``earlier``'s best weights into ``exp``'s freshly built model (see the module docstring):
    the network by name, the item rows by raw id. Raises :class:`~recsys.config.ConfigError` naming
    the first differing setting (or parameter) and both values when the models differ."""
    where = f"--init-from {earlier.path}"
    if not (exp.model.trainable and earlier.model.trainable):
        raise ConfigError(f"{where}: model.name {exp.cfg.model.name!r} has no weights to start from")
    here, there = find_item_table(exp.model), find_item_table(earlier.model)
    if here is None or there is None:
        raise ConfigError(f"{where}: {type(exp.model if here is None else earlier.model).__name__} has no item table")
    (here_table, here_prefix), (there_table, there_prefix) = here, there
    ours = {k: v for k, v in exp.model.state_dict().items() if not k.startswith(here_prefix)}
    theirs = {k: v for k, v in earlier.model.state_dict().items() if not k.startswith(there_prefix)}
    _check_same_model(where, exp.cfg, earlier.cfg, ours, theirs)
    if there_table.features is not None and here_table.features is None:
        raise ConfigError(
            f"{where}: the earlier run represents items with their features ({earlier.cfg.data.item_features}), "
            "this run has none; give it data.item_features too"
        )
    if here_table.dim != there_table.dim:
        raise _differs(where, exp.cfg, earlier.cfg, f"{here_prefix}: {there_table.dim} there, {here_table.dim} here")
    missing, unexpected = exp.model.load_state_dict(theirs, strict=False)
    assert not unexpected and all(k.startswith(here_prefix) for k in missing), (missing, unexpected)
    here_ids, there_ids = matched_items(exp.dataset, earlier.dataset)
    values = here_table.load_rows(there_table, torch.from_numpy(here_ids), torch.from_numpy(there_ids))
    new = np.ones(exp.dataset.catalogue_size, dtype=bool)
    new[0], new[here_ids] = False, False
    targets, sources = neighbour_pairs(exp.split, new)
    started = here_table.start_as_means(torch.from_numpy(targets), torch.from_numpy(sources))
    return WarmStart(
        run=str(earlier.path),
        known=len(here_ids),
        items=exp.dataset.catalogue_size - 1,
        dropped=earlier.dataset.catalogue_size - 1 - len(there_ids),
        parameters=len(theirs),
        values=tuple(values),
        from_neighbours=started,
    )


def neighbour_pairs(split: Split, new: np.ndarray, users: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
    """``(targets [p], sources [p])`` int64: every pair of clicks next to each other in a training
    sequence of which one is a ``new`` item (``new [num_items]`` bool) and the other is not, the new
    one as the target; read ``users`` sequences at a time (the training clicks stay where they are)."""
    targets, sources = [], []
    starts, ends = split.clicks_indptr[split.train_users], split.train_ends[split.train_users]
    for at in range(0, len(starts), users):
        indptr, items = gather_rows(split.clicks, starts[at : at + users], ends[at : at + users])
        row = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))  # [n] the sequence of each click
        inside = row[:-1] == row[1:]  # [n - 1] clicks j and j + 1 in one sequence
        before, after = items[:-1][inside], items[1:][inside]
        for target, source in ((after, before), (before, after)):
            pick = new[target] & ~new[source]
            targets.append(target[pick])
            sources.append(source[pick])
    if not targets:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(targets).astype(np.int64), np.concatenate(sources).astype(np.int64)


def matched_items(here: Dataset, there: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(ids_here [n], ids_there [n])`` int64: the items of both datasets' catalogues (new items of
    their features included), each under its id in ``here`` and in ``there``, matched by raw id;
    the padding id 0 never."""
    at = pd.Index(np.asarray(there.catalogue_raw[1:], dtype=str)).get_indexer(
        np.asarray(here.catalogue_raw[1:], dtype=str)
    )
    found = at >= 0
    return (np.flatnonzero(found) + 1).astype(np.int64), (at[found] + 1).astype(np.int64)


def _check_same_model(
    where: str, cfg: Config, earlier: Config, ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]
) -> None:
    """Raise naming the first differing setting and parameter unless ``ours`` and ``theirs`` (the
    network's entries of the two ``state_dict``\\ s) have the same names and shapes."""
    if cfg.model.name != earlier.model.name:
        raise _differs(where, cfg, earlier, "")
    for name in [*ours, *(k for k in theirs if k not in ours)]:
        here, there = ours.get(name), theirs.get(name)
        if here is None or there is None or here.shape != there.shape:
            raise _differs(where, cfg, earlier, f"{name}: {_shape(there)} there, {_shape(here)} here")


def _differs(where: str, cfg: Config, earlier: Config, parameter: str) -> ConfigError:
    """The one-line refusal: the first model setting that differs between the runs, both values,
    and the ``parameter`` that showed it."""
    keys = [*FIRST_SETTINGS, *(f"model.{f.name}" for f in dataclasses.fields(cfg.model))]
    for key in dict.fromkeys(k for k in keys if k not in SHAPELESS):
        mine, theirs = _setting(cfg, key), _setting(earlier, key)
        if mine != theirs:
            shown = f" (parameter {parameter})" if parameter else ""
            return ConfigError(f"{where}: another model: {key} is {theirs!r} there, {mine!r} here{shown}; {SAME}")
    return ConfigError(f"{where}: another model: parameter {parameter}; {SAME}")


def _setting(cfg: Config, key: str) -> Any:
    section, leaf = key.split(".", 1)
    return getattr(getattr(cfg, section), leaf)


def _shape(tensor: torch.Tensor | None) -> str:
    return "absent" if tensor is None else str(list(tensor.shape))
