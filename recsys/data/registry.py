"""The registry of public datasets: one ``<name>.toml`` per dataset in the top-level ``data/``
folder (:data:`REGISTRY_DIR`): the checkout's own, or the copy a wheel installs under the
environment's ``share/multi-interest-recsys/data`` (found through the distribution's file list,
or beside the installed package where ``pip install --target DIR`` put it: ``DIR/share/...``,
which the file list, written for an environment, places outside ``DIR``), so an installed
recsys has it too.

Each file is a training config (``recsys train --config <the file>``; ``recsys data fetch NAME``
prints the command) with one extra table, ``[dataset]``, that training ignores and
``recsys data list|fetch`` reads::

    [dataset]
    title = "MovieLens 100K"
    homepage = "https://grouplens.org/datasets/movielens/100k/"
    licence = "..."              # who may use it and how (a short note; the homepage has the terms)
    convert = "movielens-100k"   # how the raw files become the prepared form (recsys.data.convert)
    published = { users = 943, items = 1682, clicks = 100000 }   # raw counts the owner states
    [[dataset.files]]
    name = "ml-100k.zip"         # file name in the cache's raw/ folder
    url = "https://..."          # empty: the host needs a login; `manual` says where to get it
    mirrors = ["https://..."]    # tried in order when `url` cannot be reached
    manual = ""                  # where to download it by hand (login-gated hosts)
    sha256 = ""                  # "" = unknown: fetch computes and prints it and checks `size` only
    md5 = "..."                  # the publisher's checksum, when it publishes md5 rather than sha256
    size = 4924029               # bytes; 0 = unknown

The prepared files of dataset ``NAME`` live in ``data_root() / NAME`` (in a checkout, by default
``data/NAME`` beside the registry, ignored by git); a config names them as
``data.source = "dataset:NAME/clicks.csv"`` and :func:`resolve_source` turns that into the
path (or says to run ``recsys data fetch NAME`` first).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recsys.config import REGISTRY_TABLE, DataConfig
from recsys.data.readers import DataError
from recsys.extras import DISTRIBUTION

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

INSTALLED_REGISTRY = f"share/{DISTRIBUTION}/data"  # where a wheel puts data/ (pyproject's data-files)


def _checkout_data() -> Path | None:
    """The top-level ``data/`` of the checkout this module runs from, or None when installed."""
    root = Path(__file__).resolve().parents[2]
    return root / "data" if (root / "pyproject.toml").is_file() and (root / "data" / "README.md").is_file() else None


def _installed_registry() -> Path | None:
    """The registry a wheel installed (``INSTALLED_REGISTRY`` under the environment, or under the
    ``--target`` folder that holds the package), or None."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    readme = next((f for f in dist.files or [] if f.as_posix().endswith(f"{INSTALLED_REGISTRY}/README.md")), None)
    if readme is None:
        return None
    for found in (Path(str(readme.locate())), Path(str(dist.locate_file(f"{INSTALLED_REGISTRY}/README.md")))):
        if found.is_file():
            return found.resolve().parent
    return None


CHECKOUT_DATA = _checkout_data()
REGISTRY_DIR = CHECKOUT_DATA or _installed_registry() or Path(sys.prefix) / INSTALLED_REGISTRY
DATA_DIR_ENV = "RECSYS_DATA_DIR"
SOURCE_PREFIX = "dataset:"
PREPARED_MARKER = "prepared.json"  # written last by a fetch: the prepared files are complete


@dataclass(frozen=True)
class DatasetFile:
    """One raw file of a dataset (see the module docstring for the keys)."""

    name: str
    url: str = ""
    mirrors: tuple[str, ...] = ()
    manual: str = ""
    sha256: str = ""
    md5: str = ""
    size: int = 0

    @property
    def known_hash(self) -> str | None:
        """pooch's ``known_hash``: ``"sha256:..."`` or ``"md5:..."``, or None when unknown."""
        if self.sha256:
            return f"sha256:{self.sha256}"
        return f"md5:{self.md5}" if self.md5 else None


@dataclass(frozen=True)
class DatasetEntry:
    """A registered dataset: ``<name>.toml``'s ``[dataset]`` table."""

    name: str
    title: str
    homepage: str
    licence: str
    convert: str
    files: tuple[DatasetFile, ...]
    published: dict[str, int] = field(default_factory=dict)
    config: Path = Path()

    @property
    def size(self) -> int | None:
        """Total download size in bytes, or None when a file's size is unknown."""
        sizes = [f.size for f in self.files]
        return sum(sizes) if all(sizes) else None

    @property
    def manual(self) -> bool:
        """Whether a file must be downloaded by hand (its host needs a login)."""
        return any(not f.url for f in self.files)


def data_root() -> Path:
    """Where fetched datasets live: ``$RECSYS_DATA_DIR``; else, in a checkout, its ``data/`` (the
    design's place for datasets, beside the registry; git ignores what is fetched there); else
    ``$XDG_CACHE_HOME/recsys/data``, else ``~/.cache/recsys/data`` (an install's own folder may
    not be writable)."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    if CHECKOUT_DATA is not None:
        return CHECKOUT_DATA
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "recsys" / "data"


def load_entry(path: str | Path) -> DatasetEntry:
    """Read one registry file; errors name the file and key."""
    path = Path(path)
    try:
        table = tomllib.loads(path.read_text())[REGISTRY_TABLE]
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise DataError(f"{path}: {err}") from None
    except KeyError:
        raise DataError(f"{path}: no [dataset] table (not a registry entry)") from None
    known = {f.name for f in dataclasses.fields(DatasetFile)}
    files = []
    for i, spec in enumerate(table.get("files", [])):
        unknown = set(spec) - known
        if unknown or "name" not in spec or not (spec.get("url") or spec.get("manual")):
            raise DataError(
                f"{path}: dataset.files[{i}]: needs name and url (or manual); unknown keys {sorted(unknown)}"
            )
        files.append(DatasetFile(**{**spec, "mirrors": tuple(spec.get("mirrors", ()))}))
    missing = [key for key in ("title", "homepage", "licence", "convert") if not table.get(key)]
    if missing or not files:
        raise DataError(f"{path}: [dataset] lacks {missing or ['files']}")
    return DatasetEntry(
        name=path.stem,
        title=table["title"],
        homepage=table["homepage"],
        licence=table["licence"],
        convert=table["convert"],
        files=tuple(files),
        published=dict(table.get("published", {})),
        config=path,
    )


def registry(directory: Path = REGISTRY_DIR) -> dict[str, DatasetEntry]:
    """Every ``<name>.toml`` in ``directory`` by name, sorted."""
    if not directory.is_dir():
        raise DataError(f"the dataset registry is missing ({directory}); reinstall {DISTRIBUTION}")
    return {p.stem: load_entry(p) for p in sorted(directory.glob("*.toml"))}


def entry(name: str, directory: Path = REGISTRY_DIR) -> DatasetEntry:
    """The registered dataset ``name``; an unknown name lists the known ones."""
    path = directory / f"{name}.toml"
    if not path.is_file():
        raise DataError(f"unknown dataset {name!r}; registered: {', '.join(registry(directory))}")
    return load_entry(path)


def resolve_source(data: DataConfig) -> DataConfig:
    """``data`` with ``dataset:NAME/PATH`` in ``source`` or ``categories`` replaced by
    ``data_root() / NAME / PATH``; a dataset not fetched yet is an error saying how to fetch it."""
    changes: dict[str, Any] = {}
    for key in ("source", "categories"):
        value = getattr(data, key)
        if not value.startswith(SOURCE_PREFIX):
            continue
        name, _, inner = value[len(SOURCE_PREFIX) :].partition("/")
        folder = data_root() / name
        if not (folder / PREPARED_MARKER).is_file():
            raise DataError(
                f"data.{key}: dataset {name!r} is not fetched into {folder}; "
                f"run `recsys data fetch {name}` (or set {DATA_DIR_ENV} to where it was fetched)"
            )
        changes[key] = str(folder / inner)
    return dataclasses.replace(data, **changes) if changes else data


def human_size(size: int | None) -> str:
    """``4924029`` -> ``"4.9 MB"``; None -> ``"unknown"``."""
    if size is None:
        return "unknown"
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def _checked_by(e: DatasetEntry) -> str:
    kinds = {"sha256" if f.sha256 else "md5" if f.md5 else "size" if f.size else "none" for f in e.files}
    return "+".join(sorted(kinds))


def format_registry(entries: dict[str, DatasetEntry]) -> str:
    """The table ``recsys data list`` prints: name, download size, how the download is
    checked (``none``: fetch prints its SHA-256 to record), how to get it, licence."""
    rows = [("name", "size", "checked by", "download", "licence")]
    for name, e in entries.items():
        rows.append(
            (name, human_size(e.size), _checked_by(e), "by hand (login)" if e.manual else "automatic", e.licence)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    return "\n".join(lines) + f"\n\ncache: {data_root()} (set {DATA_DIR_ENV} to change it)"
