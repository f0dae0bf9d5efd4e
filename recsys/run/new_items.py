"""New items for a saved run, without retraining: ``recsys index RUN --item-features FILE``,
``recsys serve RUN --item-features FILE``, ``Run.add_items(FILE)``.

A run trained with ``data.item_features`` represents an item by its id row plus its feature part
(:mod:`recsys.items.features`), and an item without training clicks by its feature part alone. So
an item that appears after training can join the catalogue as such an item: :func:`add_items`
reads a feature file as training read its own (the run's ``data`` settings, the same readers and
one-line errors), and every item of the file the run's catalogue lacks becomes a new item:

- its id is after the catalogue's (existing ids never move), new items in raw-id order;
- its representation is the model's feature part alone: its values looked up in the run's
  trained vocabularies (a value the run never saw has no trained row and contributes nothing,
  counted on the log line), its vector through the trained projection;
- items the run already has keep their representation: the file's values for them are not read
  (their rows were trained with the values of training's file).

The addition is saved in the run directory (:meth:`~recsys.run.RunDir.save_added_items`, one
folder an addition, recorded in the manifest) and applied by every later load
(:func:`~recsys.run.load_run`): ``recommend``, ``serve``, ``index``, ``export``, ``evaluate`` and
:meth:`recsys.Run.load` see the grown catalogue; the dataset and weights saved by training do not
change. A saved index built before the addition no longer matches, so ``recsys index`` builds
another over the grown table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from recsys.data.feature_readers import read_feature_file
from recsys.data.features import NewItems, new_items
from recsys.run.experiment import LoadedRun

__all__ = ["add_items"]


def add_items(run: LoadedRun, path: str | Path, *, log: Callable[[str], None] = print) -> NewItems:
    """Add the items of feature file ``path`` that ``run``'s catalogue lacks (module docstring), in
    memory and in the run directory; ``log`` gets one line saying what was added. A file without
    new items changes nothing.

    Raises ``ValueError`` for a run whose model reads no item features, ``FileNotFoundError`` for a
    missing file, :class:`~recsys.data.errors.DataError` for a malformed one (as training would),
    and :class:`~recsys.run.RunInUse` while another process trains the run."""
    features = run.dataset.features
    if features is None:
        raise ValueError(
            f"{run.path} was trained without item features, so it cannot take new items (a new item is its "
            "features alone): train it with data.item_features (and model.use_features = true)"
        )
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such item feature file")
    found = new_items(
        read_feature_file(dataclasses.replace(run.cfg.data, item_features=str(path))),
        features,
        run.dataset.catalogue_raw,
    )
    log(found.describe())
    if not found.num_new:
        return found
    run.dir.claim()  # one writer: not while the run trains, nor beside another addition
    try:
        if len(run.dir.added_item_folders()) != run.additions:
            raise ValueError(f"{run.path}: items were added by another process since it was loaded; load it again")
        run.dir.save_added_items(found.rows)
    finally:
        run.dir.release()
    run.take_new_items([found.rows])
    return found
