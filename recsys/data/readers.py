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

Malformed input raises :class:`DataError` with ``file:line: reason`` (lines counted from 1 as
an editor shows them; Parquet names the row): too many fields, an empty user, item or (for a
category file) category, or a timestamp that is not a number. A line with too few fields reads
its missing trailing fields as empty, so it is an error exactly when a required field is
missing. With ``cfg.skip_bad_rows`` those rows are dropped instead and a :class:`DataWarning`
says how many and where. Reading is vectorised by pandas; the line-by-line scan that finds
the offending lines runs only when something is wrong.
"""

from __future__ import annotations

import csv
import math
import re
import warnings
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from recsys.config import DATA_FORMATS, DataConfig

_DATA_SUFFIXES = {".csv", ".tsv", ".parquet", ".pq", ".txt", ".dat", ""}
_CATEGORY_NAME = re.compile(r"item_?cate|categor", re.IGNORECASE)
_COMIREC_PART = re.compile(r"^(?P<prefix>.+)_(?:train|valid|test)\.txt$")
_CATEGORY_HEADER_NAMES = {"item", "item_id", "itemid", "iid", "id"}
_SHOWN_LINES = 5  # line numbers listed in a skip warning
_MOVIELENS_GENRES = 19  # genre flags in ML-100K's u.item when u.genre is absent


class DataError(ValueError):
    """Input data is missing or malformed; the message names the file (and line)."""


class DataWarning(UserWarning):
    """Malformed rows were dropped because ``data.skip_bad_rows`` is set."""


def read_interactions(cfg: DataConfig) -> pd.DataFrame:
    """Read ``cfg.source`` (a file or folder) in ``cfg.format`` into the tidy click table.

    Returns a DataFrame ``[n_clicks]`` with columns ``user``, ``item``, ``time`` and, when
    known, ``category`` (see the module docstring), in the source's row order.
    """
    if cfg.format not in ("auto", *DATA_FORMATS):
        raise DataError(f"data.format: {cfg.format!r} is not one of {['auto', *DATA_FORMATS]}")
    source = Path(cfg.source)
    if not source.exists():
        raise DataError(f"data.source: {source} does not exist")
    fmt, files = detect_format(source) if cfg.format == "auto" else (cfg.format, _files_for(source, cfg.format))
    skip = cfg.skip_bad_rows
    time_is_position = False
    if fmt in ("csv", "tsv"):
        df = _read_named_columns(files[0], "," if fmt == "csv" else "\t", cfg)
        time_is_position = not cfg.time_col
    elif fmt == "parquet":
        df = _read_parquet(files[0], cfg)
        time_is_position = not cfg.time_col
    elif fmt == "comirec":
        df = pd.concat([_read_comirec(path, skip) for path in files], ignore_index=True)
        time_is_position = True
    elif fmt == "movielens":
        df = _read_movielens(files[0], skip, with_genres=not cfg.categories)
    else:
        df = _read_sequences(files[0], skip)
        time_is_position = True
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


def read_categories(path: str | Path, *, skip_bad_rows: bool = False) -> pd.Series:
    """Read an ``item,category`` file (comma or tab separated; a header row is recognised
    when its first field is ``item``/``item_id``/``id`` or is not a number while the next
    line's is). Returns a Series ``item (str) -> category (str)``; an item listed twice keeps
    its first category.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data.categories: {path} is not a file")
    first, second = _first_lines(path, 2, "utf-8")
    if first is None:
        raise DataError(f"{path}: empty category file")
    sep = "\t" if "\t" in first else ","
    head = first.split(sep)[0].strip()
    header = head.lower() in _CATEGORY_HEADER_NAMES or (
        not _is_number(head) and second is not None and _is_number(second.split(sep)[0].strip())
    )
    ncols = len(next(csv.reader([first], delimiter=sep)))
    if ncols < 2:
        raise DataError(f"{path}:1: expected 'item{sep}category', found {first!r}")
    layout = _Layout(sep=sep, header=header, ncols=ncols, fields={"item": 0, "category": 1},
                     required=("item", "category"))
    table = _read_table(path, layout, skip_bad_rows).drop_duplicates("item", keep="first")
    return pd.Series(table["category"].to_numpy(), index=table["item"].to_numpy())


def detect_format(source: Path) -> tuple[str, list[Path]]:
    """Guess the format of a file or folder; returns ``(format, data files)``.

    A folder with ``u.data`` is MovieLens; otherwise it must hold exactly one data file (not
    counting category files), or ComiRec's ``X_train/X_valid/X_test.txt`` trio. A file is
    classified by its extension (``.csv``, ``.tsv``, ``.parquet``/``.pq``, ``u.data``) or, for
    other names, by its first line: three comma-separated integers is ComiRec, other commas
    CSV, tabs TSV, blanks one-user-per-line sequences.
    """
    if source.is_dir():
        if (source / "u.data").is_file():
            return "movielens", [source]
        files = _data_files(source)
        prefixes = {m.group("prefix") for f in files if (m := _COMIREC_PART.match(f.name))}
        if len(files) > 1 and len(prefixes) == 1 and all(_COMIREC_PART.match(f.name) for f in files):
            return "comirec", files
        if len(files) != 1:
            names = ", ".join(f.name for f in files) or "none"
            raise DataError(
                f"{source}: cannot tell which file holds the clicks (data files: {names}); "
                "point data.source at the file"
            )
        source = files[0]
    suffix = source.suffix.lower()
    if source.name == "u.data":
        return "movielens", [source.parent]
    if suffix in (".parquet", ".pq"):
        return "parquet", [source]
    if suffix in (".csv", ".tsv"):
        return suffix[1:], [source]
    (first,) = _first_lines(source, 1, "utf-8")
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
        _, files = detect_format(source)
        if fmt == "comirec" or len(files) == 1:
            return files
        raise DataError(f"{source}: point data.source at the {fmt} file")
    return [source]


def _data_files(folder: Path) -> list[Path]:
    return sorted(
        p for p in folder.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in _DATA_SUFFIXES
        and not _CATEGORY_NAME.search(p.name) and p.name.lower() not in ("readme", "license")
    )


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


def _read_named_columns(path: Path, sep: str, cfg: DataConfig) -> pd.DataFrame:
    """CSV/TSV with a header row naming the configured columns."""
    (first,) = _first_lines(path, 1, "utf-8")
    if first is None:
        raise DataError(f"{path}: empty file")
    header = [name.strip() for name in next(csv.reader([first], delimiter=sep))]
    wanted = {"user": cfg.user_col, "item": cfg.item_col, "time": cfg.time_col, "category": cfg.category_col}
    fields = {}
    for role, name in wanted.items():
        if not name:
            continue
        if name not in header:
            option = {"user": "user_col", "item": "item_col", "time": "time_col", "category": "category_col"}[role]
            raise DataError(
                f"{path}:1: no column {name!r} (data.{option}); the header has {header}"
            )
        fields[role] = header.index(name)
    required = tuple(role for role in ("user", "item", "time") if role in fields)
    layout = _Layout(sep=sep, header=True, ncols=len(header), fields=fields, required=required)
    return _read_table(path, layout, cfg.skip_bad_rows)


def _read_comirec(path: Path, skip: bool) -> pd.DataFrame:
    layout = _Layout(sep=",", header=False, ncols=3, fields={"user": 0, "item": 1, "time": 2},
                     required=("user", "item", "time"))
    return _read_table(path, layout, skip)


def _read_movielens(folder: Path, skip: bool, *, with_genres: bool) -> pd.DataFrame:
    layout = _Layout(sep="\t", header=False, ncols=4, fields={"user": 0, "item": 1, "time": 3},
                     required=("user", "item", "time"), encoding="latin-1")
    df = _read_table(folder / "u.data", layout, skip)
    if with_genres and (folder / "u.item").is_file():
        df["category"] = df["item"].map(_movielens_genres(folder))
    return df


def _movielens_genres(folder: Path) -> pd.Series:
    """``u.item`` (``id|title|date|video date|url|flags...``) -> Series item -> first genre."""
    names = None
    if (folder / "u.genre").is_file():
        rows = [line.rsplit("|", 1) for line in (folder / "u.genre").read_text("latin-1").splitlines() if line.strip()]
        names = [name for name, _ in sorted(rows, key=lambda r: int(r[1]))]
    path = folder / "u.item"
    items, genres = [], []
    for lineno, line in enumerate(path.read_text("latin-1").splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("|")
        nflags = len(names) if names else _MOVIELENS_GENRES
        flags = fields[-nflags:]
        if len(fields) < 5 + nflags or not fields[0].strip() or any(f not in ("0", "1") for f in flags):
            raise DataError(f"{path}:{lineno}: expected 'id|title|date|video date|url' and {nflags} 0/1 genre flags")
        items.append(fields[0].strip())
        first = next((i for i, flag in enumerate(flags) if flag == "1" and i > 0), None)
        genres.append(None if first is None else (names[first] if names else f"genre{first}"))
    genre = pd.Series(genres, index=items, dtype="str")
    return genre[~genre.index.duplicated(keep="first")]


def _roles(cfg: DataConfig) -> dict[str, str]:
    """Role (user, item, time, category) -> configured column name, for the roles configured."""
    columns = {"user": cfg.user_col, "item": cfg.item_col, "time": cfg.time_col, "category": cfg.category_col}
    return {role: name for role, name in columns.items() if name}


def _read_parquet(path: Path, cfg: DataConfig) -> pd.DataFrame:
    columns = _roles(cfg)
    try:
        raw = pd.read_parquet(path, columns=list(columns.values()))
    except ImportError as err:
        raise DataError(f"{path}: reading Parquet needs pyarrow (pip install 'recsys[parquet]')") from err
    except (KeyError, ValueError) as err:
        raise DataError(f"{path}: cannot read columns {list(columns.values())}: {err}") from err
    return _from_columns(raw, cfg, path)


def read_frame(raw: pd.DataFrame, cfg: DataConfig, where: str = "clicks") -> pd.DataFrame:
    """An in-memory click table (columns named by ``cfg.user_col``, ``item_col``, ``time_col``,
    optionally ``category_col``) -> the tidy click table of :func:`read_interactions`.

    Ids become strings (integral floats without ``.0``); times are numbers or date-times (empty
    ``time_col``: row order). A missing column or a bad row is a :class:`DataError` naming
    ``where``, the column and the row (``data.skip_bad_rows`` drops bad rows instead).
    """
    if not isinstance(raw, pd.DataFrame):
        raise DataError(f"{where}: expected a pandas DataFrame, got {type(raw).__name__}")
    missing = {role: name for role, name in _roles(cfg).items() if name not in raw.columns}
    if missing:
        role, name = next(iter(missing.items()))
        raise DataError(f"{where}: no column {name!r} (data.{role}_col); the columns are {list(raw.columns)}")
    df = _from_columns(raw, cfg, where)
    if "time" not in df:
        df["time"] = df.groupby("user", sort=False).cumcount().to_numpy(np.float64)
    if df.empty:
        raise DataError(f"{where}: no clicks found")
    df.attrs["time_is_position"] = not cfg.time_col
    df.attrs["source"] = where
    return df


def _from_columns(raw: pd.DataFrame, cfg: DataConfig, where: str | Path) -> pd.DataFrame:
    """The configured columns of ``raw`` as tidy roles (ids as str, numeric times); bad rows
    raise naming ``where`` and the row, or are dropped with ``data.skip_bad_rows``."""
    path, columns = where, _roles(cfg)
    df = pd.DataFrame({role: _as_str(raw[name]) if role != "time" else raw[name] for role, name in columns.items()})
    if "time" in df and pd.api.types.is_datetime64_any_dtype(df["time"]):
        df["time"] = _datetime_seconds(df["time"])
    elif "time" in df:
        df["time"] = pd.to_numeric(df["time"], errors="coerce")
    required = tuple(role for role in ("user", "item", "time") if role in df)
    bad = _invalid(df, required)
    if bad.any():
        rows = np.flatnonzero(bad)
        if not cfg.skip_bad_rows:
            raise DataError(f"{path}: row {rows[0] + 1}: {_row_problem(df, rows[0], required)}")
        _warn_skipped(path, rows + 1, "rows")
        df = df[~bad].reset_index(drop=True)
    return _tidy(df)


def _as_str(col: pd.Series) -> pd.Series:
    """Parquet id column -> str (integral floats print without ``.0``; missing stays missing)."""
    if pd.api.types.is_float_dtype(col) and np.all(np.isnan(col) | (col == np.round(col))):
        col = col.astype("Int64")
    return col.astype("str").where(col.notna())


def _read_sequences(path: Path, skip: bool) -> pd.DataFrame:
    """One user per line: ``user item item ...`` (blank separated)."""
    users: list[str] = []
    items: list[str] = []
    counts: list[int] = []
    bad: list[int] = []
    data = path.read_bytes()
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError as err:
        lineno = data.count(b"\n", 0, err.start) + 1
        raise DataError(f"{path}:{lineno}: not valid utf-8 text") from None
    for lineno, line in enumerate(lines, start=1):
        tokens = line.split()
        if len(tokens) == 1:
            if not skip:
                raise DataError(f"{path}:{lineno}: expected 'user item item ...', found only {tokens[0]!r}")
            bad.append(lineno)
        elif tokens:
            users.append(tokens[0])
            items.extend(tokens[1:])
            counts.append(len(tokens) - 1)
    if bad:
        _warn_skipped(path, np.asarray(bad), "lines")
    return pd.DataFrame({
        "user": pd.Series(np.repeat(np.asarray(users, dtype=object), counts), dtype="str"),
        "item": pd.Series(items, dtype="str"),
    })


def _read_table(path: Path, layout: _Layout, skip: bool) -> pd.DataFrame:
    """Read a delimited file: pandas' C parser with a typed time column first; a lenient
    all-text parse when that fails (date-times, short lines); a line scan only when malformed
    rows remain."""
    df = _parse(path, layout, typed=True)
    if df is None and "time" in layout.fields:
        df = _parse(path, layout, typed=False)
    if df is not None and not _invalid(df, layout.required).any():
        return _tidy(df)
    problems = _scan(path, layout, stop_at_first=not skip)
    if not problems:
        raise DataError(f"{path}: cannot be parsed as {layout.ncols} {layout.sep!r}-separated fields per line")
    if not skip:
        lineno, reason = problems[0]
        raise DataError(f"{path}:{lineno}: {reason} (set data.skip_bad_rows=true to drop malformed rows)")
    lines = np.asarray([lineno for lineno, _ in problems])
    _warn_skipped(path, lines, "lines")
    df = _parse(path, layout, typed=False, skip_lines=lines)
    if df is None or _invalid(df, layout.required).any():
        raise DataError(f"{path}: malformed rows remain after skipping {len(lines)} lines")
    return _tidy(df)


def _parse(path: Path, layout: _Layout, *, typed: bool, skip_lines: np.ndarray | None = None) -> pd.DataFrame | None:
    """The role columns of a delimited file (ids as written), or ``None`` when pandas rejects it.

    ``typed``: parse the time column as float64 in the parser (fast; fails on any non-number);
    otherwise read text and convert numbers or ISO date-times. ``skip_lines``: 1-based lines
    to leave out.
    """
    options = {"sep": layout.sep, "header": 0 if layout.header else None, "keep_default_na": False,
               "encoding": layout.encoding, "engine": "c"}
    dtype: type | dict = str
    try:
        if typed and "time" in layout.fields:
            labels = pd.read_csv(path, nrows=0, **options).columns if layout.header else range(layout.ncols)
            dtype = {label: np.float64 if i == layout.fields["time"] else str for i, label in enumerate(labels)}
        raw = pd.read_csv(path, dtype=dtype, skiprows=None if skip_lines is None else set(skip_lines - 1),
                          encoding_errors="strict" if skip_lines is None else "replace", **options)
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: no data rows") from None
    except ValueError:  # ParserError, UnicodeDecodeError, a non-number in a typed column
        return None
    if raw.shape[1] != layout.ncols:
        return None
    df = pd.DataFrame({role: raw.iloc[:, idx] for role, idx in layout.fields.items()})
    if "time" in df and not typed:
        df["time"] = _parse_times(df["time"])
    return df


def _parse_times(text: pd.Series) -> pd.Series:
    """Numbers, or ISO 8601 date-times as unix seconds when no value is a number."""
    numbers = pd.to_numeric(text, errors="coerce")
    if numbers.notna().any() or text.empty:
        return numbers
    return _datetime_seconds(pd.to_datetime(text, format="ISO8601", utc=True, errors="coerce"))


def _datetime_seconds(col: pd.Series) -> pd.Series:
    if col.dt.tz is None:
        col = col.dt.tz_localize("UTC")
    return (col - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)


def _invalid(df: pd.DataFrame, required: tuple[str, ...]) -> np.ndarray:
    """Bad-row mask ``[n]``: an empty or missing required id, or a missing/non-finite time."""
    bad = np.zeros(len(df), dtype=bool)
    for role in required:
        col = df[role]
        if role == "time":
            bad |= ~np.isfinite(col.to_numpy(np.float64, na_value=np.nan))
        else:
            bad |= (col.isna() | (col.str.strip() == "")).to_numpy(bool)
    return bad


def _row_problem(df: pd.DataFrame, row: int, required: tuple[str, ...]) -> str:
    """Why row ``row`` of a table that :func:`_invalid` flagged is bad."""
    for role in required:
        value = df[role].iloc[row]
        if role == "time" and not (pd.notna(value) and np.isfinite(float(value))):
            return f"time {value!r} is missing or not a number"
        if role != "time" and (pd.isna(value) or not value.strip()):
            return f"empty {role}"
    return "malformed"


def _scan(path: Path, layout: _Layout, *, stop_at_first: bool) -> list[tuple[int, str]]:
    """Line-by-line check with the same rules as the fast path; ``[(line, reason)]``."""
    problems: list[tuple[int, str]] = []
    header_pending = layout.header
    time_kind = ""  # decided by the first time value that is a number or a date-time
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                text = raw.decode(layout.encoding).rstrip("\r\n")
            except UnicodeDecodeError:
                text, reason = "", f"not valid {layout.encoding} text"
            else:
                if not text.strip():
                    continue
                if header_pending:
                    header_pending = False
                    continue
                fields = _fields(text, layout.sep)
                if not time_kind and "time" in layout.fields and len(fields) > layout.fields["time"]:
                    value = fields[layout.fields["time"]].strip()
                    time_kind = "number" if _is_number(value) else "date-time" if _is_iso(value) else ""
                reason = _line_problem(fields, layout, time_kind or "number")
            if reason:
                problems.append((lineno, reason))
                if stop_at_first:
                    break
    return problems


def _line_problem(fields: list[str], layout: _Layout, time_kind: str) -> str:
    """Why one line's ``fields`` are malformed, or ``""``."""
    if len(fields) > layout.ncols:
        return f"expected {layout.ncols} fields, found {len(fields)}"
    short = f" (the line has {len(fields)} of {layout.ncols} fields)" if len(fields) < layout.ncols else ""
    fields = fields + [""] * (layout.ncols - len(fields))
    for role in layout.required:
        idx = layout.fields[role]
        value = fields[idx].strip()
        if role == "time":
            if not (_is_iso(value) if time_kind == "date-time" else _is_number(value)):
                return f"time {value!r} is not a {time_kind}{short}"
        elif not value:
            return f"empty {role} (field {idx + 1}){short}"
    return ""


def _fields(text: str, sep: str) -> list[str]:
    if '"' in text:
        return next(csv.reader([text], delimiter=sep))
    return text.split(sep)


def _tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Final dtypes: str ids, float64 time, str category with empty values missing."""
    out = pd.DataFrame({role: df[role].astype("str") for role in ("user", "item") if role in df})
    if "time" in df:
        out["time"] = df["time"].to_numpy(np.float64)
    if "category" in df:
        category = df["category"].astype("str")
        out["category"] = category.mask(category.str.strip() == "")
    return out


def _warn_skipped(path: Path, where: np.ndarray, unit: str) -> None:
    shown = ", ".join(str(int(n)) for n in where[:_SHOWN_LINES])
    more = ", ..." if len(where) > _SHOWN_LINES else ""
    noun = unit if len(where) != 1 else unit[:-1]
    warnings.warn(
        f"{path}: skipped {len(where)} malformed {noun} ({unit[:-1]} {shown}{more})",
        DataWarning, stacklevel=3,
    )


def _first_lines(path: Path, n: int, encoding: str) -> list[str | None]:
    """The first ``n`` non-blank lines (``None`` past the end)."""
    out: list[str | None] = []
    with open(path, encoding=encoding, errors="replace") as f:
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


def _is_iso(text: str) -> bool:
    try:
        datetime.fromisoformat(text.strip())
    except ValueError:
        return False
    return True
