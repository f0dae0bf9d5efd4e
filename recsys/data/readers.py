"""Click-log readers: every supported input format becomes one tidy DataFrame.

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

Formats (``cfg.format``; ``auto`` picks one from the file name, extension and content):

- ``csv`` / ``tsv``: a header row naming the columns ``cfg.user_col``, ``cfg.item_col``,
  ``cfg.time_col`` (empty: row order within each user) and ``cfg.category_col`` (optional).
- ``parquet``: the same named columns (needs ``pyarrow``).
- A folder of CSV, TSV or Parquet parts, as Spark, Dask or Ray write them
  (:mod:`recsys.data.sources`): the parts' rows in path order; a configured column may be the
  key of ``key=value`` folders (Hive partitioning), whose value every row below it takes
  (:func:`partition_roles`).
- ``comirec``: ComiRec's ``user_id,item_id,position`` files without a header; the categories
  come from the ``item_id,cate_id`` file given as ``cfg.categories`` or found beside the data
  (``*item_cate*``). A folder holding ``X_train.txt``, ``X_valid.txt``, ``X_test.txt`` is read
  as their concatenation (ComiRec splits users across the three files).
- ``movielens``: a MovieLens 100K folder: ``u.data`` (``user, item, rating, time``, tab
  separated; every rating counts as a click) and, when present, ``u.item`` genres. Genres are
  multi-label flags; the category is the first flag set, in ``u.genre`` order, with the
  ``unknown`` genre read as no category.
- ``sequences``: one user per line, ``user item item ...`` separated by blanks, in click order.

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
dropped instead and one :class:`DataWarning` for the whole source (:class:`Skipped`: one, not
one a part, for a folder) says how many rows, on how many lines (a quoted field can span
several), and where; for one-user-per-line files, how many clicks they held.
A quote that is never closed is an error even then: skipping it would drop the rest of the
file. Reading is vectorised by pandas; the line-by-line scan that finds the offending lines
runs only when something is wrong, and checks values with the same vectorised rules.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import io
import math
import re
import warnings
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd

from recsys.config import DATA_FORMATS, DataConfig
from recsys.data.errors import DataError, DataWarning
from recsys.data.sources import (
    HIVE_NULL,
    compression,
    data_files,
    data_suffix,
    decoding,
    open_data,
    partition_of,
    written_as_parts,
)
from recsys.extras import install_hint
from recsys.text import count

_COMIREC_PART = re.compile(r"^(?P<prefix>.+)_(?:train|valid|test)\.txt$")
_CATEGORY_HEADER_NAMES = {"item", "item_id", "itemid", "iid", "id"}
_SHOWN_LINES = 5  # line numbers listed in a skip warning
_SHOWN_FILES = 3  # files listed in a skip warning about a folder
NAMED_FORMATS = ("csv", "tsv", "parquet")  # formats whose columns the config names (a partition can give one)
SEPARATORS = {"csv": ",", "tsv": "\t", "comirec": ","}
TIDY_COLUMNS = ("user", "item", "time", "category")
Given = dict[str, str | float | None]  # role -> the value a file's key=value folders give it (partition_roles)
SKIP_HINT = " (set data.skip_bad_rows=true to drop malformed rows)"
_SCAN_CHUNK = 65_536  # records the line scan holds as Python strings before it stores them as pandas strings
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # line ends, as pandas' C parser splits lines
_NOT_UTF8 = re.compile("[\udc80-\udcff]")  # bytes that were not UTF-8, as errors="surrogateescape" keeps them
_CSV_FIELD_LIMIT = 2**31 - 1  # Python's csv module refuses fields over 131,072 characters; pandas has no limit
_MOVIELENS_GENRES = 19  # genre flags in ML-100K's u.item when u.genre is absent


def read_interactions(cfg: DataConfig) -> pd.DataFrame:
    """Read ``cfg.source`` (a file or folder) in ``cfg.format`` into the tidy click table.

    Returns a DataFrame ``[n_clicks]`` with columns ``user``, ``item``, ``time`` and, when
    known, ``category`` (see the module docstring), in the source's row order.
    """
    source = Path(cfg.source)
    fmt, files = find_source(cfg)
    skip, skipped = cfg.skip_bad_rows, Skipped()
    time_is_position = False
    if fmt in NAMED_FORMATS:
        parts = zip(files, partition_roles(source, files, cfg))
        df = pd.concat([_read_part(path, fmt, cfg, given, skipped) for path, given in parts], ignore_index=True)
        time_is_position = not cfg.time_col
    elif fmt == "comirec":
        df = pd.concat([_read_comirec(path, skip, skipped) for path in files], ignore_index=True)
        time_is_position = True
    elif fmt == "movielens":
        df = _read_movielens(files[0], skip, skipped, with_genres=not cfg.categories)
    else:
        with decoding(files[0]):
            df = _read_sequences(files[0], skip, skipped)
        time_is_position = True
    skipped.warn(source, len(files))
    if "time" not in df:
        df["time"] = df.groupby("user", sort=False).cumcount().to_numpy(np.float64)
    category_file = _category_file(cfg, fmt, files)
    if category_file is not None:
        categories = read_categories(category_file, skip_bad_rows=skip)
        df["category"] = df["item"].map(categories)
    if df.empty:
        raise DataError(f"{source}: no clicks found")
    df.attrs["time_is_position"] = time_is_position
    df.attrs["source"] = str(source)
    return df


def find_source(cfg: DataConfig) -> tuple[str, list[Path]]:
    """The format of ``cfg.source`` (``cfg.format``, or detected) and its data files."""
    if cfg.format not in ("auto", *DATA_FORMATS):
        raise DataError(f"data.format: {cfg.format!r} is not one of {['auto', *DATA_FORMATS]}")
    source = Path(cfg.source)
    if not source.exists():
        glob = " (a glob is not expanded: point data.source at the folder)" if set("*?[") & set(str(source)) else ""
        raise DataError(f"data.source: {source} does not exist{glob}")
    return detect_format(source) if cfg.format == "auto" else (cfg.format, _files_for(source, cfg.format))


def partition_roles(source: Path, files: list[Path], cfg: DataConfig) -> list[Given]:
    """For each of ``files``, the configured columns that its ``key=value`` folders give, by role
    (see :mod:`recsys.data.sources`): ids and categories as the folder's text, times read as a
    time column's text reads (numbers when any value is one, else ISO 8601 date-times, in
    seconds). A folder whose value cannot serve its role (no user or item, a time that does not
    read) is a :class:`DataError` naming it: ``data.skip_bad_rows`` drops rows, not folders."""
    if not source.is_dir():
        return [{} for _ in files]
    columns = _roles(cfg)
    role_of = {name: role for role, name in columns.items()}
    found = [
        {role_of[key]: given for key, given in partition_of(path, source).items() if key in role_of} for path in files
    ]
    texts = sorted({value for part in found for role, (value, _) in part.items() if role == "time" and value})
    seconds, kind = _parse_times(pd.Series(texts, dtype="str"))
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


def _read_part(path: Path, fmt: str, cfg: DataConfig, given: Given, skipped: Skipped) -> pd.DataFrame:
    """One file of a source with named columns (CSV, TSV, Parquet): the tidy rows of the columns it
    holds, with the roles ``given`` by its ``key=value`` folders (:func:`partition_roles`)."""
    own = own_columns(cfg, given)
    with decoding(path):
        if fmt == "parquet":
            df = _read_parquet(path, own, skipped)
        else:
            df = _read_table(path, named_layout(path, SEPARATORS[fmt], own), cfg.skip_bad_rows, skipped)
    return with_partition(df, given)


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
    first, second = _first_lines(path, 2)
    if first is None:
        raise DataError(f"{path}: empty category file")
    sep = "\t" if "\t" in first else ","
    head = first.split(sep)[0].strip()
    header = head.lower() in _CATEGORY_HEADER_NAMES or (
        not _is_number(head) and second is not None and _is_number(second.split(sep)[0].strip())
    )
    lineno, fields = _first_record(path, sep)
    ncols = len(fields)
    if ncols < 2:
        raise DataError(f"{path}:{lineno}: expected 'item{sep}category', found {first!r}")
    layout = _Layout(
        sep=sep, header=header, ncols=ncols, fields={"item": 0, "category": 1}, required=("item", "category")
    )
    return _read_table(path, layout, skip_bad_rows, skipped).drop_duplicates("item", keep="first")


def detect_format(source: Path) -> tuple[str, list[Path]]:
    """Guess the format of a file or folder; returns ``(format, data files)``.

    A folder with ``u.data`` is MovieLens; otherwise its data files (:func:`~recsys.data.sources.data_files`:
    in the folder and its ``key=value`` folders, not counting category files, markers and
    checksums) must be exactly one, ComiRec's ``X_train/X_valid/X_test.txt`` trio, Parquet parts,
    or CSV or TSV parts as Spark writes them (:func:`~recsys.data.sources.written_as_parts`);
    parts are read in path order. A file is classified by its extension under any compression
    (``.csv``, ``.tsv``, ``.parquet``/``.pq``, ``u.data``; ``.csv.gz``) or, for other names, by
    its first line: three comma-separated integers is ComiRec, other commas CSV, tabs TSV,
    blanks one-user-per-line sequences.
    """
    if source.is_dir():
        if (source / "u.data").is_file():
            return "movielens", [source]
        files = data_files(source)
        prefixes = {m.group("prefix") for f in files if (m := _COMIREC_PART.match(f.name))}
        if len(files) > 1 and len(prefixes) == 1 and all(_COMIREC_PART.match(f.name) for f in files):
            return "comirec", files
        kinds = {data_suffix(f) for f in files}
        if len(files) > 1 and kinds <= {".parquet", ".pq"}:
            return "parquet", files
        if len(files) > 1 and kinds in ({".csv"}, {".tsv"}) and written_as_parts(source, files):
            return kinds.pop()[1:], files
        if len(files) != 1:
            names = ", ".join(str(f.relative_to(source)) for f in files) or "none"
            raise DataError(
                f"{source}: cannot tell which file holds the clicks (data files: {names}); "
                "point data.source at the file"
            )
        source = files[0]
    compression(source)  # a compression that is not read is refused before its bytes are taken for text
    suffix = data_suffix(source)
    if source.name == "u.data":
        return "movielens", [source.parent]
    if suffix in (".parquet", ".pq"):
        return "parquet", [source]
    if suffix in (".csv", ".tsv"):
        return suffix[1:], [source]
    (first,) = _first_lines(source, 1)
    if first is None:
        raise DataError(f"{source}: empty file")
    if "," in first:
        fields = first.split(",")
        return ("comirec" if len(fields) == 3 and all(_is_int(f) for f in fields) else "csv"), [source]
    tsv = "\t" in first.strip() and not all(_is_int(token) for token in first.split())
    return ("tsv" if tsv else "sequences"), [source]


def _files_for(source: Path, fmt: str) -> list[Path]:
    """The data files of ``source`` for an explicitly chosen format."""
    if fmt == "movielens":
        folder = source if source.is_dir() else source.parent
        if not (folder / "u.data").is_file():
            raise DataError(f"{folder}: no u.data (MovieLens 100K layout expected)")
        return [folder]
    if source.is_dir():
        detected, files = detect_format(source)
        if fmt in ("comirec", "parquet", detected) or len(files) == 1:
            return files
        raise DataError(f"{source}: point data.source at the {fmt} file")
    return [source]


def _category_file(cfg: DataConfig, fmt: str, files: list[Path]) -> Path | None:
    """``cfg.categories``, or for ComiRec data the ``*item_cate*`` file beside it."""
    if cfg.categories:
        return Path(cfg.categories)
    if fmt != "comirec":
        return None
    folder = files[0].parent
    candidates = sorted(p for p in folder.glob("*item_cate*") if p.is_file())
    match = _COMIREC_PART.match(files[0].name)
    prefix = match.group("prefix") if match else files[0].stem.split("_")[0]
    preferred = [p for p in candidates if p.name.startswith(prefix)]
    if len(preferred) == 1:
        return preferred[0]
    return candidates[0] if len(candidates) == 1 else None


@dataclass(frozen=True)
class _Layout:
    """How to cut a delimited text file into fields."""

    sep: str
    header: bool  # the first non-blank line names the columns (and is not data)
    ncols: int  # fields per line
    fields: dict[str, int]  # role (user, item, time, category) -> column index
    required: tuple[str, ...]  # roles that must not be empty
    encoding: str = "utf-8"


def named_layout(path: Path, sep: str, cfg: DataConfig) -> _Layout:
    """The layout of a CSV/TSV file whose header row names the configured columns."""
    lineno, names = _first_record(path, sep)
    header = [name.strip() for name in names]
    fields = {}
    for role, name in _roles(cfg).items():
        if name not in header:
            raise DataError(f"{path}:{lineno}: no column {name!r} (data.{role}_col); the header has {header}")
        fields[role] = header.index(name)
    required = tuple(role for role in ("user", "item", "time") if role in fields)
    return _Layout(sep=sep, header=True, ncols=len(header), fields=fields, required=required)


COMIREC_LAYOUT = _Layout(
    sep=",", header=False, ncols=3, fields={"user": 0, "item": 1, "time": 2}, required=("user", "item", "time")
)


def _read_comirec(path: Path, skip: bool, skipped: Skipped) -> pd.DataFrame:
    with decoding(path):
        return _read_table(path, COMIREC_LAYOUT, skip, skipped)


def _read_movielens(folder: Path, skip: bool, skipped: Skipped, *, with_genres: bool) -> pd.DataFrame:
    layout = _Layout(
        sep="\t",
        header=False,
        ncols=4,
        fields={"user": 0, "item": 1, "time": 3},
        required=("user", "item", "time"),
        encoding="latin-1",
    )
    df = _read_table(folder / "u.data", layout, skip, skipped)
    if with_genres and (folder / "u.item").is_file():
        table = movielens_genres(folder / "u.item").drop_duplicates("item", keep="first")
        first = [genres[0] if genres else None for genres in table["genres"]]
        df["category"] = df["item"].map(pd.Series(first, index=table["item"], dtype="str"))
    return df


def movielens_genres(path: Path) -> pd.DataFrame:
    """MovieLens 100K's ``u.item`` (``id|title|date|video date|url|flags...``, latin-1; the genres'
    names from ``u.genre`` beside it) -> ``[n]`` rows, in file order: ``item`` (str), ``genres`` (the
    names of the genres flagged, in ``u.genre`` order; the ``unknown`` genre is no genre) and
    ``line``. A line that is not such a row is a :class:`DataError` naming it."""
    names = None
    genre_file = path.parent / "u.genre"
    if genre_file.is_file():
        rows = [line.rsplit("|", 1) for line in genre_file.read_text("latin-1").splitlines() if line.strip()]
        names = [name for name, _ in sorted(rows, key=lambda r: int(r[1]))]
    items, genres, lines = [], [], []
    for lineno, line in enumerate(path.read_text("latin-1").splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("|")
        nflags = len(names) if names else _MOVIELENS_GENRES
        flags = fields[-nflags:]
        if len(fields) < 5 + nflags or not fields[0].strip() or any(f not in ("0", "1") for f in flags):
            raise DataError(f"{path}:{lineno}: expected 'id|title|date|video date|url' and {nflags} 0/1 genre flags")
        items.append(fields[0].strip())
        genres.append([names[i] if names else f"genre{i}" for i, flag in enumerate(flags) if flag == "1" and i > 0])
        lines.append(lineno)
    return pd.DataFrame({"item": pd.Series(items, dtype="str"), "genres": genres, "line": lines})


def _roles(cfg: DataConfig) -> dict[str, str]:
    """Role (user, item, time, category) -> configured column name, for the roles configured."""
    columns = {"user": cfg.user_col, "item": cfg.item_col, "time": cfg.time_col, "category": cfg.category_col}
    return {role: name for role, name in columns.items() if name}


def _read_parquet(path: Path, cfg: DataConfig, skipped: Skipped) -> pd.DataFrame:
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise DataError(f"{path}: reading Parquet needs pyarrow ({install_hint('parquet')})") from err
    try:
        available = pq.read_schema(path).names
        raw = pd.read_parquet(path, columns=[name for name in _roles(cfg).values() if name in available])
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f"{path}: not a readable Parquet file ({err})") from err
    _check_columns(path, cfg, available)
    return from_columns(raw, cfg, path, skipped=skipped)


def _check_columns(where: str | Path, cfg: DataConfig, columns: list[str]) -> None:
    """Raise naming the option of the first configured column that ``columns`` lacks."""
    for role, name in _roles(cfg).items():
        if name not in columns:
            raise DataError(f"{where}: no column {name!r} (data.{role}_col); the columns are {list(columns)}")


def read_frame(raw: pd.DataFrame, cfg: DataConfig, where: str = "clicks") -> pd.DataFrame:
    """An in-memory click table (columns named by ``cfg.user_col``, ``item_col``, ``time_col``,
    optionally ``category_col``) -> the tidy click table of :func:`read_interactions`.

    Ids become strings (integral floats without ``.0``); times are numbers or date-times (empty
    ``time_col``: row order). A missing column or a bad row is a :class:`DataError` naming
    ``where``, the column and the row (``data.skip_bad_rows`` drops bad rows instead).
    """
    if not isinstance(raw, pd.DataFrame):
        raise DataError(f"{where}: expected a pandas DataFrame, got {type(raw).__name__}")
    _check_columns(where, cfg, list(raw.columns))
    skipped = Skipped()
    df = from_columns(raw, cfg, where, skipped=skipped)
    skipped.warn(where, 1)
    if "time" not in df:
        df["time"] = df.groupby("user", sort=False).cumcount().to_numpy(np.float64)
    if df.empty:
        raise DataError(f"{where}: no clicks found")
    df.attrs["time_is_position"] = not cfg.time_col
    df.attrs["source"] = where
    return df


def from_columns(
    raw: pd.DataFrame, cfg: DataConfig, where: str | Path, *, skipped: Skipped, first_row: int = 0
) -> pd.DataFrame:
    """The configured columns of ``raw`` as tidy roles (ids as str, numeric times); bad rows
    raise naming ``where`` and the row, or are dropped with ``data.skip_bad_rows`` and counted
    in ``skipped``.

    ``first_row``: the row number of ``raw``'s first row minus one (``raw`` is a batch of a larger
    table)."""
    path, columns = where, _roles(cfg)
    df = pd.DataFrame({role: _as_str(raw[name]) if role != "time" else raw[name] for role, name in columns.items()})
    if "time" in df and pd.api.types.is_datetime64_any_dtype(df["time"]):
        df["time"] = _datetime_seconds(df["time"])
    elif "time" in df:
        df["time"] = pd.to_numeric(df["time"], errors="coerce")
    required = tuple(role for role in ("user", "item", "time") if role in df)
    masks = _invalid_by_role(df, required)
    bad = _any(masks, len(df))
    if bad.any():
        rows = np.flatnonzero(bad)
        if not cfg.skip_bad_rows:
            row = int(rows[0])
            role = next(role for role in required if masks[role][row])
            value = raw[columns["time"]].iloc[row] if role == "time" else None
            reason = f"time {_plain(value)!r} is missing or not a number" if role == "time" else f"empty {role}"
            raise DataError(f"{path}: row {first_row + row + 1}: {reason}{SKIP_HINT}")
        skipped.add(path, [(first_row + int(r) + 1, first_row + int(r) + 1) for r in rows], unit="row")
        df = df[~bad].reset_index(drop=True)
    return _tidy(df)


def _plain(value: object) -> object:
    """A NumPy scalar as the Python value it holds, so a message shows ``nan``, not ``np.float64(nan)``."""
    return value.item() if isinstance(value, np.generic) else value


def _as_str(col: pd.Series) -> pd.Series:
    """Parquet id column -> str (integral floats print without ``.0``; missing stays missing)."""
    if pd.api.types.is_float_dtype(col) and np.all(np.isnan(col) | (col == np.round(col))):
        col = col.astype("Int64")
    return col.astype("str").where(col.notna())


def _read_sequences(path: Path, skip: bool, skipped: Skipped) -> pd.DataFrame:
    """One user per line: ``user item item ...`` (blank separated)."""
    with open_data(path) as f:
        text = f.read().decode("utf-8-sig", errors="surrogateescape")
    check_utf8 = _NOT_UTF8.search(text) is not None
    users: list[str] = []
    items: list[str] = []
    counts: list[int] = []
    dropped: list[tuple[int, int]] = []
    lost = 0  # clicks on the dropped lines
    for lineno, line in enumerate(_LINE_BREAK.split(text), start=1):
        tokens = line.split()
        if not tokens:
            continue
        if check_utf8 and _NOT_UTF8.search(line):
            problem = "not valid utf-8 text"
        elif len(tokens) == 1:
            problem = f"expected 'user item item ...', found only {tokens[0]!r}"
        else:
            users.append(tokens[0])
            items.extend(tokens[1:])
            counts.append(len(tokens) - 1)
            continue
        if not skip:
            raise _malformed(path, _Problem(lineno, lineno, lineno, problem))
        dropped.append((lineno, lineno))
        lost += len(tokens) - 1
    skipped.add(path, dropped, clicks=lost)
    return pd.DataFrame(
        {
            "user": pd.Series(np.repeat(np.asarray(users, dtype=object), counts), dtype="str"),
            "item": pd.Series(items, dtype="str"),
        }
    )


def _read_table(path: Path, layout: _Layout, skip: bool, skipped: Skipped) -> pd.DataFrame:
    """Read a delimited file: pandas' C parser with a typed time column first; a lenient
    all-text parse when that fails (date-times, short lines); the line scan only when malformed
    rows remain (dropped with ``skip``, and counted in ``skipped``)."""
    df = _parse(path, layout, typed=True)
    if df is None and "time" in layout.fields:
        df = _parse(path, layout, typed=False)
    limit = None
    if df is not None:
        bad = _any(_invalid_by_role(df, layout.required), len(df))
        if not bad.any() and not _holds_line_break(path, df, layout):
            return _tidy(df)
        if not skip and bad.any():
            limit = int(np.flatnonzero(bad)[0]) + 1  # pandas' rows are the records: the scan can stop there
    scan = _scan(path, layout, skip=skip, limit=limit)
    df, value_problems = _checked(scan, layout)
    problems = sorted(scan.problems + value_problems)
    fatal = [p for p in problems if p.fatal]
    if (problems and not skip) or fatal:
        raise _malformed(path, (fatal if skip else problems)[0])
    skipped.add(path, [(p.first, p.last) for p in problems])
    return _tidy(df)


def _parse(path: Path, layout: _Layout, *, typed: bool) -> pd.DataFrame | None:
    """The role columns of a delimited file (ids as written), or ``None`` when pandas rejects it.

    ``typed``: parse the time column as float64 in the parser (fast; fails on any non-number);
    otherwise read text and convert numbers or ISO date-times.
    """
    try:
        raw = pd.read_csv(path, **parse_options(path, layout, typed=typed))
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: no data rows") from None
    except ValueError:  # ParserError, UnicodeDecodeError, a non-number in a typed column
        return None
    df = role_columns(raw, layout)
    if df is not None and "time" in df and not typed:
        df["time"], _ = _parse_times(df["time"])
    return df


def parse_options(path: Path, layout: _Layout, *, typed: bool) -> dict[str, Any]:
    """``pd.read_csv`` options that cut ``path`` as :func:`_parse` does (``typed``: time as float64)."""
    options: dict[str, Any] = {
        "sep": layout.sep,
        "header": 0 if layout.header else None,
        "keep_default_na": False,
        "encoding": layout.encoding,
        "engine": "c",
        "compression": compression(path),  # named, not inferred: a caller may pass an open file
    }
    dtype: type | dict = str
    if typed and "time" in layout.fields:
        labels = pd.read_csv(path, nrows=0, **options).columns if layout.header else range(layout.ncols)
        dtype = {label: np.float64 if i == layout.fields["time"] else str for i, label in enumerate(labels)}
    return {**options, "dtype": dtype, "encoding_errors": "strict"}


def role_columns(raw: pd.DataFrame, layout: _Layout) -> pd.DataFrame | None:
    """The role columns of what pandas parsed (``[n]``, ids as written), or ``None`` when its shape
    shows malformed rows."""
    if raw.shape[1] != layout.ncols or not isinstance(raw.index, pd.RangeIndex):
        return None  # rows with more fields than the header: pandas made the first column the index
    return pd.DataFrame({role: raw.iloc[:, idx] for role, idx in layout.fields.items()})


def _holds_line_break(path: Path, df: pd.DataFrame, layout: _Layout) -> bool:
    """Whether an id or category field holds a line break: a quote opened in it closes only on a
    later line, which swallows the lines between (only a file with a quote can have one)."""
    return _has_quote(path) and has_line_break(df, layout)


def has_line_break(df: pd.DataFrame, layout: _Layout) -> bool:
    """Whether an id or category field of ``df`` holds a line break (see :func:`_holds_line_break`)."""
    roles = [role for role in layout.fields if role != "time"]  # a time with a line break is not a number
    return any(df[role].str.contains("[\r\n]", regex=True, na=False).any() for role in roles)


def _has_quote(path: Path) -> bool:
    """Whether the file holds a quote character anywhere (read in blocks)."""
    with open_data(path) as f:
        return any(b'"' in block for block in iter(lambda: f.read(1 << 24), b""))


def _parse_times(text: pd.Series, kind: str = "") -> tuple[pd.Series, str]:
    """Time text ``[n]`` -> ``(seconds [n] float64, NaN where unreadable; the kind read)``.

    ``kind`` ``"number"`` or ``"date-time"`` (ISO 8601, as unix seconds) fixes the reading; ``""``
    reads numbers when any value is one, else date-times, and returns ``""`` when neither reads.
    """
    if kind != "date-time":
        numbers = pd.to_numeric(text, errors="coerce")
        if kind == "number" or numbers.notna().any():
            return numbers, "number"
    seconds = _datetime_seconds(pd.to_datetime(text, format="ISO8601", utc=True, errors="coerce"))
    return seconds, "date-time" if kind or seconds.notna().any() else ""


def _datetime_seconds(col: pd.Series) -> pd.Series:
    if col.dt.tz is None:
        col = col.dt.tz_localize("UTC")
    return (col - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)


def _invalid_by_role(df: pd.DataFrame, required: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Bad-row masks ``{role: [n] bool}``: an empty or missing id, or a missing/non-finite time."""
    masks = {}
    for role in required:
        col = df[role]
        if role == "time":
            masks[role] = ~np.isfinite(col.to_numpy(np.float64, na_value=np.nan))
        else:
            masks[role] = (col.isna() | (col.str.strip() == "")).to_numpy(bool)
    return masks


def _any(masks: dict[str, np.ndarray], n: int) -> np.ndarray:
    """``[n]`` bool: rows that any mask flags."""
    return np.logical_or.reduce([*masks.values(), np.zeros(n, dtype=bool)])


@dataclass(frozen=True, order=True)
class _Problem:
    """Why a record is malformed, and where."""

    line: int  # the line named in the message
    first: int  # the record's lines (a quoted field can span several)
    last: int
    reason: str
    fatal: bool = False  # data.skip_bad_rows cannot drop it


_Record = tuple[int, int, list[str], _Problem | None]  # first line, last line, fields, what makes it unreadable


@dataclass
class _Scan:
    """What the line scan read: the well-formed records (their lines, and their role fields as
    text) and the problems of the others."""

    starts: array  # [n] int64: the first line of each well-formed record, in file order
    ends: dict[int, int]  # record index -> last line, for the records on several lines
    short: dict[int, int]  # record index -> its field count, for the records with too few fields
    problems: list[_Problem]  # the malformed records, in file order
    text: pd.DataFrame  # [n] role columns of the well-formed records, as text


def _scan(path: Path, layout: _Layout, *, skip: bool, limit: int | None = None) -> _Scan:
    """The slow path, run only when the fast one found something wrong: record by record with
    Python's csv module. It stops at the first malformed record unless ``skip`` (and at a quote
    never closed even then), and after ``limit`` well-formed records. Values are checked
    afterwards, by :func:`_checked`, with the fast path's vectorised rules."""
    parts = list(scan_parts(path, layout, skip=skip, limit=limit))
    offsets = np.cumsum([0] + [len(part.starts) for part in parts])
    return _Scan(
        starts=array("q", [line for part in parts for line in part.starts]),
        ends={int(at) + row: line for at, part in zip(offsets, parts) for row, line in part.ends.items()},
        short={int(at) + row: n for at, part in zip(offsets, parts) for row, n in part.short.items()},
        problems=[problem for part in parts for problem in part.problems],
        text=pd.concat([part.text for part in parts], ignore_index=True),
    )


def scan_parts(
    path: Path, layout: _Layout, *, skip: bool, limit: int | None = None, keep_from: int = 0
) -> Iterator[_Scan]:
    """:func:`_scan` in parts of at most ``_SCAN_CHUNK`` well-formed records each (the last may
    be empty), so a caller can check and drop each part before the next: memory stays bounded on
    a file of any size. The first ``keep_from`` well-formed records are passed over (their
    structure is still checked, their text not kept): a caller that has read them already.
    Each part's ``starts``, ``ends`` and ``short`` index its own records."""
    starts, ends, short, problems = array("q"), {}, {}, []
    kept: list[list[str]] = []  # fields of this part's well-formed records, padded to ncols
    ncols, seen = layout.ncols, 0  # well-formed records so far, passed over or kept
    with _csv_fields_unlimited(), open_data(path) as f:
        records = _records(f, layout.sep, layout.encoding)
        if layout.header:
            next(records, None)  # checked by _first_record before any reading
        for first, last, fields, problem in records:
            if (problem is None or not problem.fatal) and (last > first or len(fields) > ncols):
                structural = _structure_problem(first, last, fields, layout)
                if structural is not None and (problem is None or structural < problem):
                    problem = structural  # a quote that opens before the bytes that are not text
            if problem is not None:
                problems.append(problem)
                if problem.fatal or not skip:
                    break
                continue
            seen += 1
            if seen <= keep_from:
                continue
            if last > first:
                ends[len(starts)] = last
            if len(fields) < ncols:
                short[len(starts)] = len(fields)
                fields = fields + [""] * (ncols - len(fields))
            starts.append(first)
            kept.append(fields)
            if len(kept) == _SCAN_CHUNK:  # as pandas strings: compact, unlike Python's
                yield _Scan(starts, ends, short, problems, _text_frame(kept, layout))
                starts, ends, short, problems, kept = array("q"), {}, {}, [], []
            if seen == limit:
                break
    yield _Scan(starts, ends, short, problems, _text_frame(kept, layout))


def _text_frame(rows: list[list[str]], layout: _Layout) -> pd.DataFrame:
    """``[len(rows)]`` role columns (str) of records' fields (each padded to ``layout.ncols``)."""
    return pd.DataFrame(
        {role: pd.Series(list(map(itemgetter(idx), rows)), dtype="str") for role, idx in layout.fields.items()}
    )


def _checked(scan: _Scan, layout: _Layout, kind: str = "") -> tuple[pd.DataFrame, list[_Problem]]:
    """The scanned records' values checked as the fast path checks them: ``(the rows whose values
    are good, time in seconds; a problem for each other row)``. ``kind``: how times read
    (:func:`_parse_times`; ``""``: decided by these records)."""
    df = scan.text.copy()
    if "time" in df:
        df["time"], kind = _parse_times(scan.text["time"], kind)
    masks = _invalid_by_role(df, layout.required)
    bad = _any(masks, len(df))
    problems = []
    for row in np.flatnonzero(bad).tolist():
        role = next(role for role in layout.required if masks[role][row])
        first, idx = scan.starts[row], layout.fields[role]
        n = scan.short.get(row, layout.ncols)
        short = f" (the line has {n} of {layout.ncols} fields)" if n < layout.ncols else ""
        value = scan.text[role].iloc[row].strip()
        reason = f"time {value!r} is not a {kind or 'number'}" if role == "time" else f"empty {role} (field {idx + 1})"
        problems.append(_Problem(first, first, scan.ends.get(row, first), reason + short))
    return df[~bad].reset_index(drop=True), problems


def _structure_problem(first: int, last: int, fields: list[str], layout: _Layout) -> _Problem | None:
    """A field recsys reads that spans lines (its quote closes only on a later line), or too many fields."""
    for role, idx in sorted(layout.fields.items(), key=lambda item: item[1]):
        if idx < len(fields) and _LINE_BREAK.search(fields[idx]):
            opens = first + _line_breaks("".join(fields[:idx]))
            closes = opens + _line_breaks(fields[idx])
            return _Problem(opens, first, last, f"a quote opens the {role} field here and closes only on line {closes}")
    if len(fields) > layout.ncols:
        return _Problem(first, first, last, f"expected {layout.ncols} fields, found {len(fields)}")
    return None


def _line_breaks(text: str) -> int:
    return len(_LINE_BREAK.findall(text))


def _malformed(path: Path, problem: _Problem) -> DataError:
    return DataError(f"{path}:{problem.line}: {problem.reason}{'' if problem.fatal else SKIP_HINT}")


def _records(f: BinaryIO, sep: str, encoding: str) -> Iterator[_Record]:
    """The non-blank records of a delimited file, cut as pandas' C parser cuts them: lines end at
    ``\\r\\n``, ``\\r`` or ``\\n``, RFC 4180 quoting, a leading UTF-8 byte-order mark is dropped,
    and a blank line holds only spaces and tabs that are not ``sep``. Bytes that are not text in
    ``encoding`` make their record's problem. Run it inside :func:`_csv_fields_unlimited`."""
    check_text = not _is_text(f, encoding)  # else no record needs the check
    text = io.TextIOWrapper(
        f, encoding="utf-8-sig" if encoding == "utf-8" else encoding, errors="surrogateescape", newline=""
    )  # newline="": line ends kept, as csv wants
    ended: list[bool] = []  # holds True once every line has gone to the reader
    reader = csv.reader(_marking_the_end(text, ended), delimiter=sep)
    blank = " \t".replace(sep, "")
    last = 0
    try:
        for fields in reader:
            first, last = last + 1, reader.line_num
            if len(fields) <= 1 and not (fields and fields[0].strip(blank)):
                continue
            problem = None
            if ended or check_text:
                problem = _record_problem(first, last, fields, encoding, ended=bool(ended))
            yield first, last, fields, problem
    except csv.Error as err:
        yield (
            last + 1,
            reader.line_num,
            [],
            _Problem(last + 1, last + 1, reader.line_num, f"cannot be split into fields ({err})", fatal=True),
        )


def _marking_the_end(lines: Iterator[str], ended: list[bool]) -> Iterator[str]:
    yield from lines
    ended.append(True)


def _record_problem(first: int, last: int, fields: list[str], encoding: str, *, ended: bool) -> _Problem | None:
    """A quote never closed (the record ran to the end of the file), or bytes that are not text."""
    if ended:
        opens = first + _line_breaks("".join(fields[:-1]))
        return _Problem(
            opens,
            first,
            last,
            "a quote opens here and is never closed, so it would take in the rest of the file",
            fatal=True,
        )
    joined = "".join(fields)
    bad = None if joined.isascii() else _NOT_UTF8.search(joined)
    if bad is None:
        return None
    return _Problem(first + _line_breaks(joined[: bad.start()]), first, last, f"not valid {encoding} text")


def _is_text(f: BinaryIO, encoding: str) -> bool:
    """Whether all of ``f`` decodes in ``encoding`` (read in blocks; ``f`` is rewound)."""
    decoder = codecs.getincrementaldecoder(encoding)()
    try:
        for block in iter(lambda: f.read(1 << 24), b""):
            decoder.decode(block)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    finally:
        f.seek(0)
    return True


@contextmanager
def _csv_fields_unlimited() -> Iterator[None]:
    """Lift Python's csv field-size limit (a module-wide setting) while recsys reads, so a field
    of any length reads as pandas reads it; the previous limit comes back afterwards."""
    previous = csv.field_size_limit(_CSV_FIELD_LIMIT)
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def _first_record(path: Path, sep: str) -> tuple[int, list[str]]:
    """``(line, fields)`` of the first non-blank record of a UTF-8 delimited file: its header."""
    with _csv_fields_unlimited(), open_data(path) as f:
        record = next(_records(f, sep, "utf-8"), None)
    if record is None:
        raise DataError(f"{path}: empty file")
    first, _, fields, problem = record
    if problem is not None:
        raise DataError(f"{path}:{problem.line}: {problem.reason}")
    return first, fields


def _tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Final dtypes: str ids, float64 time, str category with empty values missing; any other
    role (the columns of an item feature file, :mod:`recsys.data.feature_readers`) as str."""
    out = pd.DataFrame({role: df[role].astype("str") for role in ("user", "item") if role in df})
    if "time" in df:
        out["time"] = df["time"].to_numpy(np.float64)
    if "category" in df:
        category = df["category"].astype("str")
        out["category"] = category.mask(category.str.strip() == "")
    for role in df.columns.difference(TIDY_COLUMNS, sort=False):
        out[role] = df[role].astype("str")
    return out


_Spans = list[tuple[int, int]]  # [(first, last)] lines (or rows) of each malformed record


@dataclass
class Skipped:
    """The malformed records dropped (``data.skip_bad_rows``) from the files of one source,
    gathered so that the source gives one warning, not one a file: a folder of a thousand parts
    would print a thousand lines."""

    spans: dict[str, _Spans] = field(default_factory=dict)  # file -> its dropped records, in order
    unit: str = "line"  # what the spans count: "line", or "row" for tables
    clicks: int | None = None  # the clicks the dropped lines held (one-user-per-line files)

    def add(self, path: str | Path, spans: _Spans, *, unit: str = "line", clicks: int | None = None) -> None:
        """Count ``spans`` dropped from ``path`` (and the ``clicks`` they held); a file's spans are
        kept in file order, whichever check dropped them first."""
        if spans:
            kept = self.spans.setdefault(str(path), [])
            kept.extend(spans)
            kept.sort()  # two sorted runs: linear
            self.unit = unit
            self.clicks = None if clicks is None else (self.clicks or 0) + clicks

    def warn(self, source: str | Path, files: int) -> None:
        """One :class:`DataWarning` for what was dropped from ``source`` (``files`` data files),
        if anything: how many records on how many lines, and where (the first files' lines when
        several files lost some)."""
        if not self.spans:
            return
        if len(self.spans) == 1:
            ((path, spans),) = self.spans.items()
            what = f"{_dropped(spans, self.unit)} ({_where(spans, self.unit)})"
        else:
            path = str(source)
            everything = [span for spans in self.spans.values() for span in spans]
            shown = [f"{_inside(name, source)} ({_where(s, self.unit)})" for name, s in self.spans.items()]
            more = "; ..." if len(shown) > _SHOWN_FILES else ""
            what = (
                f"{_dropped(everything, self.unit)} in {len(shown)} of {count(files, 'file')}: "
                + "; ".join(shown[:_SHOWN_FILES])
                + more
            )
        held = "" if self.clicks is None else f" holding {count(self.clicks, 'click')}"
        warnings.warn(f"{path}: skipped {what}{held}", DataWarning, stacklevel=3)


def _dropped(spans: _Spans, unit: str) -> str:
    """``3 malformed lines``, or ``2 malformed rows on 5 lines`` when a record spans several."""
    covered = sum(last - first + 1 for first, last in spans)
    if covered == len(spans):
        return count(len(spans), f"malformed {unit}")
    return f"{count(len(spans), 'malformed row')} on {count(covered, 'line')}"


def _where(spans: _Spans, unit: str) -> str:
    """``line 2, 5``, or ``lines 2-4, 9, ...`` when a record spans several: the first few."""
    covered = sum(last - first + 1 for first, last in spans)
    shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans[:_SHOWN_LINES])
    return f"{unit if covered == len(spans) else 'lines'} {shown}" + (", ..." if len(spans) > _SHOWN_LINES else "")


def _inside(path: str, source: str | Path) -> str:
    """``path`` within the folder ``source`` (``dt=2026-01-01/part-00000.parquet``), else whole."""
    try:
        return str(Path(path).relative_to(source))
    except ValueError:
        return path


def _first_lines(path: Path, n: int) -> list[str | None]:
    """The first ``n`` non-blank lines of a UTF-8 text file (``None`` past the end)."""
    out: list[str | None] = []
    with decoding(path), io.TextIOWrapper(open_data(path), encoding="utf-8-sig", errors="replace") as f:
        for line in f:
            if line.strip():
                out.append(line.rstrip("\r\n"))
                if len(out) == n:
                    break
    return out + [None] * (n - len(out))


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text)) and "_" not in text
    except ValueError:
        return False


def _is_int(text: str) -> bool:
    return text.strip().lstrip("-").isdigit()
