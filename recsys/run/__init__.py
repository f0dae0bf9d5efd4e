"""The run directory's one owner, and the one place an experiment is set up.

- :mod:`recsys.run.files`: atomic writes (fsync + rename) and the plain-checkpoint check;
- :mod:`recsys.run.manifest`: the SHA-256 and size of every run file, recorded on write and
  verified on read (:class:`IntegrityError`);
- :mod:`recsys.run.layout`: :class:`RunDir`, the only code that knows a run's file names;
- :mod:`recsys.run.experiment`: :func:`build_experiment` (load, split, count, build) and
  :func:`load_run` (the same on a saved run, with its best weights);
- :mod:`recsys.run.index`: a run's saved ANN indexes (build, measure, reopen).

Names are imported lazily, so the data pipeline can use :mod:`recsys.run.files` without
pulling in the models.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "atomic_torch_save": "files", "atomic_write": "files", "atomic_write_text": "files", "check_plain": "files",
    "atomic_save": "files", "default_file_mode": "files",
    "IntegrityError": "manifest",
    "RunDir": "layout", "new_run_dir": "layout", "index_slug": "layout",
    "Experiment": "experiment", "LoadedRun": "experiment", "build_experiment": "experiment",
    "load_run": "experiment", "train_item_counts": "experiment",
    "IndexReport": "index", "build_run_index": "index", "open_run_index": "index",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'recsys.run' has no attribute {name!r}")
    return getattr(importlib.import_module(f"recsys.run.{_EXPORTS[name]}"), name)
