"""The run directory's one owner, and the one place an experiment is set up.

- :mod:`recsys.run.layout`: :class:`RunDir`, the only code that knows a run's file names; it
  writes through :mod:`recsys.io` (atomic writes, the SHA-256 manifest) and raises
  :class:`IntegrityError` for a file that does not match the manifest;
- :mod:`recsys.run.experiment`: :func:`build_experiment` (load, split, count, build) and
  :func:`load_run` (the same on a saved run, with its best weights);
- :mod:`recsys.run.index`: a run's saved ANN indexes (build, measure, reopen);
- :mod:`recsys.run.new_items`: :func:`add_items`, new items for a trained run without retraining.
"""

from recsys.io import IntegrityError
from recsys.run.experiment import Experiment, LoadedRun, build_experiment, load_run, train_item_counts
from recsys.run.index import IndexReport, build_run_index, open_run_index, retrieval_settings
from recsys.run.layout import RunDir, RunInUse, index_slug, new_run_dir, unfinished_runs
from recsys.run.new_items import add_items

__all__ = [
    "Experiment",
    "IndexReport",
    "IntegrityError",
    "LoadedRun",
    "RunDir",
    "RunInUse",
    "add_items",
    "build_experiment",
    "build_run_index",
    "index_slug",
    "load_run",
    "new_run_dir",
    "open_run_index",
    "retrieval_settings",
    "train_item_counts",
    "unfinished_runs",
]
