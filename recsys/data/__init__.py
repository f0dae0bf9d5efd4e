"""The click-data pipeline: read → prepare (filter, id maps) → split → training batches.

Entry points: :func:`load_dataset` (read or generate, then prepare, with an optional on-disk
cache; a large log is prepared out of core, :mod:`recsys.data.ondisk`), :func:`describe` (the
statistics ``recsys data`` prints), :func:`split_dataset` and :class:`TrainSampler`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from pathlib import Path

import pandas as pd

from recsys.config import Config
from recsys.data.batches import TrainSampler, pad_sequences
from recsys.data.features import FeatureField, ItemFeatures
from recsys.data.formats import all_readers
from recsys.data.prepare import Dataset, prepare
from recsys.data.readers import DataError, DataWarning, read_frame, read_interactions
from recsys.data.registry import resolve_source
from recsys.data.sources import data_suffix
from recsys.data.split import EvalSet, Split, read_held_out, split_dataset
from recsys.data.synthetic import generate
from recsys.extras import install_hint
from recsys.io.files import one_at_a_time
from recsys.progress import progress_bar
from recsys.text import count

__all__ = [
    "DISK_THRESHOLD",
    "DOMINANT_SHARE",
    "IN_MEMORY",
    "DataError",
    "DataWarning",
    "Dataset",
    "EvalSet",
    "FeatureField",
    "ItemFeatures",
    "Split",
    "TrainSampler",
    "default_cache_dir",
    "describe",
    "generate",
    "load_dataset",
    "pad_sequences",
    "prepare",
    "read_frame",
    "read_interactions",
    "split_dataset",
]

IN_MEMORY = "<dataframe>"  # data.source of a run trained on a click table passed in memory

_CACHE_VERSION = 4  # bump when reading or preparation changes what a cached dataset holds
DISK_THRESHOLD = 256 * 2**20  # source bytes from which data.prepare = "auto" prepares out of core (~10M clicks)
_PACKED_RATIO = 4  # a Parquet or compressed byte counts as this many bytes of text: it holds more clicks
DOMINANT_SHARE = 0.5  # one user above this share of the clicks is warned about (load_dataset)


def load_dataset(cfg: Config, *, clicks: pd.DataFrame | None = None, progress: bool = False) -> Dataset:
    """The prepared dataset of ``cfg.data`` (``source = "synthetic"`` generates it from
    ``cfg.synthetic``; ``dataset:NAME/PATH`` names a file of a fetched registered dataset,
    see :mod:`recsys.data.registry`). With ``cfg.data.cache_dir`` set, the result is cached there under a
    key of every setting and source file (size and modification time) that shapes it.

    ``clicks``: an in-memory click table (:func:`read_frame`) used instead of the source;
    ``cfg.data.source`` should then be :data:`IN_MEMORY`, the label saved with the run.
    ``progress``: a bar over the stages (read, prepare, cache) on a terminal.

    ``cfg.data.prepare``: ``disk`` prepares a file source out of core (:func:`prepare_on_disk`)
    into the cache (``data.cache_dir``, else :func:`default_cache_dir`), or reuses what an earlier
    run prepared there from the same files and settings, and returns it memory-mapped; ``auto``
    does so for sources of :data:`DISK_THRESHOLD` bytes or more (Parquet and compressed bytes count four times);
    ``memory`` never does.

    A cache entry is prepared by one process at a time (:func:`~recsys.io.files.one_at_a_time`):
    the ranks of a torchrun job (or runs started together) that find it missing wait while the
    first prepares and publishes it, then open it.

    A log that one user dominates (more than :data:`DOMINANT_SHARE` of the clicks after
    filtering: a crawler, a test account, a placeholder id) gives a :class:`DataWarning` naming
    the user and the share: it trains without error, on mostly that user.

    ``cfg.data.held_out_items`` is read last (:func:`~recsys.data.split.read_held_out`) into
    ``Dataset.held_out``, whose clicks the split keeps out of training.
    """
    ds = _load(cfg, clicks, progress)
    _warn_if_dominated(ds)
    held = read_held_out(cfg.data, ds)  # after the cache: one prepared dataset serves every held-out set
    return ds if held is None else dataclasses.replace(ds, held_out=held)


def _load(cfg: Config, clicks: pd.DataFrame | None, progress: bool) -> Dataset:
    """:func:`load_dataset` without its check of the result."""
    if clicks is None and cfg.data.source == IN_MEMORY:
        raise DataError(
            f"data.source: {IN_MEMORY!r} was a click table passed in memory (recsys.fit); "
            "pass it again or set data.source to a file"
        )
    if clicks is None:
        cfg = dataclasses.replace(cfg, data=resolve_source(cfg.data))  # dataset:NAME/... -> the fetched files
        if _out_of_core(cfg):
            target = _cache_path(cfg, Path(cfg.data.cache_dir) if cfg.data.cache_dir else default_cache_dir())
            cached = _open_cached(target)
            if cached is not None:
                return cached
            with one_at_a_time(target):
                cached = _open_cached(target)  # published while this process waited
                if cached is not None:
                    return cached
                from recsys.data.ondisk import prepare_on_disk  # imports duckdb

                return prepare_on_disk(cfg.data, target, progress=progress)
    cache = _cache_path(cfg, Path(cfg.data.cache_dir)) if cfg.data.cache_dir and clicks is None else None
    if cache is None:
        return _prepare_in_memory(cfg, clicks, None, progress)
    cached = _open_cached(cache)
    if cached is not None:
        return cached
    with one_at_a_time(cache):
        cached = _open_cached(cache)
        return cached if cached is not None else _prepare_in_memory(cfg, clicks, cache, progress)


def _open_cached(target: Path) -> Dataset | None:
    """The dataset published at ``target``, or None when there is none (or it cannot be read: it
    is then prepared again)."""
    if not (target / "dataset.json").is_file():
        return None
    try:
        return Dataset.load(target)
    except DataError:
        return None


def _prepare_in_memory(cfg: Config, clicks: pd.DataFrame | None, cache: Path | None, progress: bool) -> Dataset:
    """Read (or generate) the clicks and prepare them in memory; saved at ``cache`` when given."""
    with progress_bar(3 if cache else 2, "data", enabled=progress, unit="stage") as bar:
        bar.set_description(f"data: reading {cfg.data.source if clicks is None else 'the click table'}")
        if clicks is not None:
            df = read_frame(clicks, cfg.data, where=IN_MEMORY)
        elif cfg.data.source == "synthetic":
            df = generate(cfg.synthetic)
        else:
            df = read_interactions(cfg.data)
        bar.update()
        bar.set_description(f"data: filtering and mapping ids of {len(df):,} clicks")
        ds = prepare(df, cfg.data)
        bar.update()
        if cache is not None:
            bar.set_description(f"data: caching in {cache}")
            ds.save(cache)
            bar.update()
    return ds


def _warn_if_dominated(ds: Dataset) -> None:
    """A :class:`DataWarning` when one user holds more than :data:`DOMINANT_SHARE` of the clicks."""
    lengths = ds.lengths
    if len(lengths) < 2:
        return  # one user holds every click: the split says there are too few users
    top = int(lengths.argmax())
    share = int(lengths[top]) / len(ds.items)
    if share > DOMINANT_SHARE:
        warnings.warn(
            f"{ds.source or 'data'}: user {str(ds.user_raw[top])!r} holds {share:.0%} of the "
            f"{count(len(ds.items), 'click')} after filtering; training will mostly fit that user "
            "(a crawler, a test account or a placeholder id? drop it from the log if so)",
            DataWarning,
            stacklevel=3,
        )


def describe(ds: Dataset) -> str:
    """Human-readable statistics of a prepared dataset (after filtering)."""
    s = ds.stats()
    rows = [
        ("source", s["source"] or "-"),
        ("users", f"{s['users']:,}"),
        ("items", f"{s['items']:,}"),
        ("interactions", f"{s['interactions']:,}"),
        ("clicks/user", f"mean {s['mean_length']:.1f}, median {s['median_length']:g}, max {s['max_length']:,}"),
        ("categories", f"{s['categories']:,} ({count(int(s['items_with_category']), 'item')} labelled)"),
        ("density", f"{s['density']:.5f}"),
        ("timestamps", "yes" if s["timestamps"] else "no (click order only)"),
    ]
    if ds.features is not None:
        rows.append(("features", ds.features.summary()))
    if ds.held_out is not None:
        clicks = int(ds.item_counts[ds.held_out[ds.held_out < ds.num_items]].sum())
        rows.append(("held out", f"{count(len(ds.held_out), 'item')}, {count(clicks, 'click')} kept out of training"))
    return "\n".join(f"{name:<14}{value}" for name, value in rows)


def default_cache_dir() -> Path:
    """Where out-of-core preparation keeps its datasets without ``data.cache_dir``:
    ``$XDG_CACHE_HOME/recsys/prepared``, by default ``~/.cache/recsys/prepared``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "recsys" / "prepared"


def _out_of_core(cfg: Config) -> bool:
    """Whether ``cfg.data`` asks for out-of-core preparation (see :func:`load_dataset`)."""
    data = cfg.data
    if data.prepare == "memory" or data.source == "synthetic":
        return False
    if data.prepare == "disk":
        return True
    source = Path(data.source)
    files = [p for p in (source.rglob("*") if source.is_dir() else [source]) if p.is_file()]
    size = sum(p.stat().st_size * (_PACKED_RATIO if _packed(p) else 1) for p in files)
    if size < DISK_THRESHOLD:
        return False
    try:
        import duckdb  # noqa: F401
    except ImportError:
        warnings.warn(
            f"{data.source}: {size / 2**30:.1f} GiB prepared in memory; {install_hint('scale')} prepares "
            "it out of core",
            stacklevel=3,
        )
        return False
    return True


def _packed(path: Path) -> bool:
    """Whether ``path`` holds its clicks packed: compressed, or of a packed format (Parquet)."""
    return data_suffix(path) != path.suffix.lower() or any(r.packed and r.knows_name(path) for r in all_readers())


def _cache_path(cfg: Config, root: Path) -> Path:
    data = cfg.data
    key: dict[str, object] = {
        "version": _CACHE_VERSION,
        "data": {
            name: getattr(data, name)
            for name in (
                "source",
                "format",
                "user_col",
                "item_col",
                "time_col",
                "category_col",
                "categories",
                "item_features",
                "feature_item_col",
                "feature_vector_col",
                "skip_bad_rows",
                "min_item_count",
                "min_user_count",
                "kcore",
            )
        },
    }
    if data.source == "synthetic":
        key["synthetic"] = vars(cfg.synthetic)
        name = "synthetic"
    else:
        extra = [Path(name) for name in (data.categories, data.item_features) if name]
        key["files"] = _fingerprint(Path(data.source)) + [entry for path in extra for entry in _fingerprint(path)]
        name = Path(data.source).stem or "data"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return root / f"{name}-{digest}"


def _fingerprint(path: Path) -> list[list[object]]:
    """``[path, size, mtime_ns]`` of a file, or of every file in a folder (its partition folders too)."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in files if p.exists()]
