"""Click-log readers: every input format becomes one tidy DataFrame.

:func:`read_interactions` returns one row per click with columns

- ``user`` (str), ``item`` (str): raw ids exactly as written (spaces inside the field are part
  of the id, so ids round-trip to the output unchanged; an id of blanks only counts as empty);
- ``time`` (float64): the timestamp (unix seconds, or any number; ISO 8601 date-times are
  converted to unix seconds), or the click's position within its user when the source has
  no timestamps;
- ``category`` (str, missing where unknown): only when the source or ``cfg.categories``
  provides one.

``df.attrs["time_is_position"]`` says whether ``time`` is only a position and
``df.attrs["source"]`` names what was read.

Formats (``cfg.format``; ``auto`` detects one from the file name, extension and content): each is
one reader of :mod:`recsys.data.formats`, which decides all that is particular to it. Built in:
``csv`` / ``tsv`` and ``parquet`` (columns named by ``cfg.user_col``, ``cfg.item_col``,
``cfg.time_col`` and ``cfg.category_col``), ``comirec``, ``movielens`` and ``sequences``; a
folder of CSV, TSV or Parquet parts, as Spark, Dask or Ray write them (:mod:`recsys.data.sources`),
is read part by part in path order, and a configured column may be the key of ``key=value``
folders (Hive partitioning), whose value every row below it takes (:func:`partition_roles`).

``cfg.categories`` names an ``item,category`` file (comma or tab separated, header optional)
that works with every format and replaces any per-row category; an item listed twice keeps
its first category.

Text files are UTF-8 (MovieLens: latin-1), plain or compressed (``.gz``, ``.bz2``, ``.xz``); a
leading byte-order mark is dropped, and lines end with ``\\n``, ``\\r\\n`` or ``\\r``. Delimited
files follow RFC 4180 quoting (``"a,b"``, ``""`` for a quote), as pandas and spreadsheets write
them; a field may be of any length, and a quoted field may hold line breaks (a review text, say),
except in the columns recsys reads.

Malformed input raises :class:`DataError` with ``file:line: reason`` (lines counted from 1 as
an editor shows them; Parquet names the row): too many fields, an empty user, item or (for a
category file) category, a timestamp that is not a number, text that is not valid UTF-8, or a
quote that opens a field recsys reads and closes only on a later line (named at the line where
it opens). A line with too few fields reads its missing trailing fields as empty, so it is an
error exactly when a required field is missing. With ``cfg.skip_bad_rows`` those rows are
dropped instead and one :class:`DataWarning` for the whole source (:class:`~recsys.data.rows.Skipped`:
one, not one a part, for a folder) says how many rows, on how many lines (a quoted field can span
several), and where; for one-user-per-line files, how many clicks they held.
A quote that is never closed is an error even then: skipping it would drop the rest of the
file. Reading is vectorised by pandas; the line-by-line scan that finds the offending lines
(:mod:`recsys.data.linescan`) runs only when something is wrong, and checks values with the same
vectorised rules (:mod:`recsys.data.rows`).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recsys.config import AUTO, DataConfig
from recsys.data.errors import DataError, DataWarning
from recsys.data.formats import Reader, detect, reader_for
from recsys.data.linescan import Layout, first_record
from recsys.data.rows import TIDY_COLUMNS, Skipped, check_columns, from_columns, parse_times, roles
from recsys.data.sources import HIVE_NULL, decoding, first_lines, partition_of
from recsys.data.tables import is_number, read_table

__all__ = [
    "DataError",
    "DataWarning",
    "detect_format",
    "find_source",
    "item_categories",
    "own_columns",
    "partition_roles",
    "read_categories",
    "read_frame",
    "read_interactions",
    "with_partition",
]

_CATEGORY_HEADER_NAMES = {"item", "item_id", "itemid", "iid", "id"}
Given = dict[str, str | float | None]  # role -> the value a file's key=value folders give it (partition_roles)


def read_interactions(cfg: DataConfig) -> pd.DataFrame:
    """Read ``cfg.source`` (a file or folder) in ``cfg.format`` into the tidy click table.

    Returns a DataFrame ``[n_clicks]`` with columns ``user``, ``item``, ``time`` and, when
    known, ``category`` (see the module docstring), in the source's row order.
    """
    source = Path(cfg.source)
    reader, files = find_source(cfg)
    skipped = Skipped()
    parts = zip(files, partition_roles(reader, source, files, cfg))
    df = pd.concat([_read_part(reader, path, cfg, given, skipped) for path, given in parts], ignore_index=True)
    skipped.warn(source, len(files))
    categories = item_categories(cfg, reader, files)
    if categories is not None:
        df["category"] = df["item"].map(categories)
    return _clicks(df, str(source), time_is_position=reader.time_is_position(cfg))


def find_source(cfg: DataConfig) -> tuple[Reader, list[Path]]:
    """The reader of ``cfg.source`` (``cfg.format``'s, or detected) and its data files."""
    reader = None if cfg.format == AUTO else reader_for(cfg.format)  # an unknown format before a missing file
    source = Path(cfg.source)
    if not source.exists():
        glob = " (a glob is not expanded: point data.source at the folder)" if set("*?[") & set(str(source)) else ""
        raise DataError(f"data.source: {source} does not exist{glob}")
    return detect(source) if reader is None else (reader, reader.files(source))


def detect_format(source: Path) -> tuple[str, list[Path]]:
    """The format of a file or folder and its data files (:func:`recsys.data.formats.detect`)."""
    reader, files = detect(source)
    return reader.name, files


def _read_part(reader: Reader, path: Path, cfg: DataConfig, given: Given, skipped: Skipped) -> pd.DataFrame:
    """The tidy rows of one data file, with the roles ``given`` by its ``key=value`` folders."""
    with decoding(path):
        df = reader.read(path, own_columns(cfg, given), skipped)
    return with_partition(df, given)


def _clicks(df: pd.DataFrame, source: str, *, time_is_position: bool) -> pd.DataFrame:
    """The tidy rows of a whole source as the click table: each click's position within its user
    as the time where the rows have none, and the attributes; no rows at all is an error."""
    if "time" not in df:
        df["time"] = df.groupby("user", sort=False).cumcount().to_numpy(np.float64)
    if df.empty:
        raise DataError(f"{source}: no clicks found")
    df.attrs["time_is_position"] = time_is_position
    df.attrs["source"] = source
    return df


def partition_roles(reader: Reader, source: Path, files: list[Path], cfg: DataConfig) -> list[Given]:
    """For each of ``files``, the configured columns that its ``key=value`` folders give, by role
    (see :mod:`recsys.data.sources`), where the format reads columns by name
    (:attr:`~recsys.data.formats.Reader.named_columns`): ids and categories as the folder's text,
    times read as a time column's text reads (numbers when any value is one, else ISO 8601
    date-times, in seconds). A folder whose value cannot serve its role (no user or item, a time
    that does not read) is a :class:`DataError` naming it: ``data.skip_bad_rows`` drops rows, not
    folders."""
    if not (reader.named_columns and source.is_dir()):
        return [{} for _ in files]
    columns = roles(cfg)
    role_of = {name: role for role, name in columns.items()}
    found = [
        {role_of[key]: given for key, given in partition_of(path, source).items() if key in role_of} for path in files
    ]
    texts = sorted({value for part in found for role, (value, _) in part.items() if role == "time" and value})
    seconds, kind = parse_times(pd.Series(texts, dtype="str"))
    time_of = dict(zip(texts, seconds.tolist()))
    out: list[Given] = []
    for part in found:
        given: Given = {}
        for role, (value, folder) in part.items():
            origin = f"(the folder gives data.{role}_col {columns[role]!r})"
            if role == "time":
                seconds = time_of.get(value or "", math.nan)
                if not math.isfinite(seconds):
                    shown = HIVE_NULL if value is None else value
                    raise DataError(f"{folder}: time {shown!r} is not a {kind or 'number or date-time'} {origin}")
                given[role] = seconds
            elif role != "category" and not (value or "").strip():
                raise DataError(f"{folder}: empty {role} {origin}")
            else:
                given[role] = value
        out.append(given)
    return out


def own_columns(cfg: DataConfig, given: Given) -> DataConfig:
    """``cfg`` less the columns that a file's ``key=value`` folders give (``given``, by role):
    the settings with which the file itself is read."""
    blank: dict[str, Any] = {f"{role}_col": "" for role in given}
    return dataclasses.replace(cfg, **blank) if given else cfg


def with_partition(df: pd.DataFrame, given: Given) -> pd.DataFrame:
    """Tidy rows ``df`` of one file with the roles ``given`` by its folders as columns (the same
    value on every row), in the tidy column order."""
    if not given:
        return df
    for role, value in given.items():
        df[role] = np.float64(value) if isinstance(value, float) else pd.Series(value, index=df.index, dtype="str")
    return df[[role for role in TIDY_COLUMNS if role in df]]


def item_categories(cfg: DataConfig, reader: Reader, files: list[Path]) -> pd.Series | None:
    """The ``item -> category`` map that replaces the rows' own categories: the file
    ``cfg.categories`` names, else the one the format finds with its data ``files``
    (:meth:`~recsys.data.formats.Reader.category_file`), else None (the rows' own stand)."""
    path = Path(cfg.categories) if cfg.categories else reader.category_file(files)
    return None if path is None else read_categories(path, skip_bad_rows=cfg.skip_bad_rows)


def read_categories(path: str | Path, *, skip_bad_rows: bool = False) -> pd.Series:
    """Read an ``item,category`` file (comma or tab separated; a header row is recognised
    when its first field is ``item``/``item_id``/``id`` or is not a number while the next
    line's is). Returns a Series ``item (str) -> category (str)``; an item listed twice keeps
    its first category.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data.categories: {path} is not a file")
    skipped = Skipped()
    with decoding(path):
        table = _read_category_table(path, skip_bad_rows, skipped)
    skipped.warn(path, 1)
    return pd.Series(table["category"].to_numpy(), index=table["item"].to_numpy())


def _read_category_table(path: Path, skip_bad_rows: bool, skipped: Skipped) -> pd.DataFrame:
    """The tidy ``item``, ``category`` rows of a category file, header detected."""
    first, second = first_lines(path, 2)
    if first is None:
        raise DataError(f"{path}: empty category file")
    sep = "\t" if "\t" in first else ","
    head = first.split(sep)[0].strip()
    header = head.lower() in _CATEGORY_HEADER_NAMES or (
        not is_number(head) and second is not None and is_number(second.split(sep)[0].strip())
    )
    lineno, fields = first_record(path, sep)
    ncols = len(fields)
    if ncols < 2:
        raise DataError(f"{path}:{lineno}: expected 'item{sep}category', found {first!r}")
    layout = Layout(
        sep=sep, header=header, ncols=ncols, fields={"item": 0, "category": 1}, required=("item", "category")
    )
    return read_table(path, layout, skip_bad_rows, skipped).drop_duplicates("item", keep="first")


def read_frame(raw: pd.DataFrame, cfg: DataConfig, where: str = "clicks") -> pd.DataFrame:
    """An in-memory click table (columns named by ``cfg.user_col``, ``item_col``, ``time_col``,
    optionally ``category_col``) -> the tidy click table of :func:`read_interactions`.

    Ids become strings (integral floats without ``.0``); times are numbers or date-times (empty
    ``time_col``: row order). A missing column or a bad row is a :class:`DataError` naming
    ``where``, the column and the row (``data.skip_bad_rows`` drops bad rows instead).
    """
    if not isinstance(raw, pd.DataFrame):
        raise DataError(f"{where}: expected a pandas DataFrame, got {type(raw).__name__}")
    check_columns(where, cfg, list(raw.columns))
    skipped = Skipped()
    df = from_columns(raw, cfg, where, skipped=skipped)
    skipped.warn(where, 1)
    return _clicks(df, where, time_is_position="time" not in df)  # no time column named: row order
