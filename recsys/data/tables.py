"""Delimited text tables (CSV and TSV files, ComiRec's files, MovieLens' ``u.data``, category
files): the role fields of each record, read by pandas' C parser, whole or a chunk at a time,
with the line scan (:mod:`recsys.data.linescan`) behind it to name or drop what is malformed.

A :class:`~recsys.data.linescan.Layout` says how to cut a file: its separator, whether a header
row names the columns (:func:`named_layout`), and which field holds each role. The in-memory
reader (:func:`read_table`) and the chunked one (:func:`delimited_chunks`) share the parser's
options and the checks, so both read a file alike, and name or drop the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd

from recsys.config import DataConfig
from recsys.data.errors import DataError
from recsys.data.linescan import Layout, checked, first_record, malformed, scan_file, scan_parts
from recsys.data.rows import Skipped, flagged, invalid_by_role, parse_times, roles, tidy
from recsys.data.sources import compression, open_data


def named_layout(path: Path, sep: str, cfg: DataConfig) -> Layout:
    """The layout of a CSV/TSV file whose header row names the configured columns."""
    lineno, names = first_record(path, sep)
    header = [name.strip() for name in names]
    fields = {}
    for role, name in roles(cfg).items():
        if name not in header:
            raise DataError(f"{path}:{lineno}: no column {name!r} (data.{role}_col); the header has {header}")
        fields[role] = header.index(name)
    required = tuple(role for role in ("user", "item", "time") if role in fields)
    return Layout(sep=sep, header=True, ncols=len(header), fields=fields, required=required)


def read_table(path: Path, layout: Layout, skip: bool, skipped: Skipped) -> pd.DataFrame:
    """Read a delimited file: pandas' C parser with a typed time column first; a lenient
    all-text parse when that fails (date-times, short lines); the line scan only when malformed
    rows remain (dropped with ``skip``, and counted in ``skipped``)."""
    df = _parse(path, layout, typed=True)
    if df is None and "time" in layout.fields:
        df = _parse(path, layout, typed=False)
    limit = None
    if df is not None:
        bad = flagged(invalid_by_role(df, layout.required), len(df))
        if not bad.any() and not _holds_line_break(path, df, layout):
            return tidy(df)
        if not skip and bad.any():
            limit = int(np.flatnonzero(bad)[0]) + 1  # pandas' rows are the records: the scan can stop there
    scan = scan_file(path, layout, skip=skip, limit=limit)
    df, value_problems = checked(scan, layout)
    problems = sorted(scan.problems + value_problems)
    fatal = [p for p in problems if p.fatal]
    if (problems and not skip) or fatal:
        raise malformed(path, (fatal if skip else problems)[0])
    skipped.add(path, [(p.first, p.last) for p in problems])
    return tidy(df)


def _parse(path: Path, layout: Layout, *, typed: bool) -> pd.DataFrame | None:
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
        df["time"], _ = parse_times(df["time"])
    return df


def parse_options(path: Path, layout: Layout, *, typed: bool) -> dict[str, Any]:
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


def role_columns(raw: pd.DataFrame, layout: Layout) -> pd.DataFrame | None:
    """The role columns of what pandas parsed (``[n]``, ids as written), or ``None`` when its shape
    shows malformed rows."""
    if raw.shape[1] != layout.ncols or not isinstance(raw.index, pd.RangeIndex):
        return None  # rows with more fields than the header: pandas made the first column the index
    return pd.DataFrame({role: raw.iloc[:, idx] for role, idx in layout.fields.items()})


def _holds_line_break(path: Path, df: pd.DataFrame, layout: Layout) -> bool:
    """Whether an id or category field holds a line break: a quote opened in it closes only on a
    later line, which swallows the lines between (only a file with a quote can have one)."""
    return _has_quote(path) and has_line_break(df, layout)


def has_line_break(df: pd.DataFrame, layout: Layout) -> bool:
    """Whether an id or category field of ``df`` holds a line break (see :func:`_holds_line_break`)."""
    text_roles = [role for role in layout.fields if role != "time"]  # a time with a line break is not a number
    return any(df[role].str.contains("[\r\n]", regex=True, na=False).any() for role in text_roles)


def _has_quote(path: Path) -> bool:
    """Whether the file holds a quote character anywhere (read in blocks)."""
    with open_data(path) as f:
        return any(b'"' in block for block in iter(lambda: f.read(1 << 24), b""))


Chunks = Iterator[tuple[pd.DataFrame, int]]  # tidy chunks, each with the bytes of its file read so far


def delimited_chunks(
    path: Path, layout: Layout, skip: bool, skipped: Skipped, *, rows: int, typed: bool | None = None
) -> Chunks:
    """Tidy chunks of a delimited file, ``rows`` records each: pandas' parser while the rows are
    good, then the line scan from the first record of the first chunk that is not (rows it drops
    counted in ``skipped``).

    ``typed``: the parser reads times as float64 (the default when there is a time column); when
    the first chunk's times are not all numbers the file is read again as text, whose times may
    be ISO date-times (the kind fixed by the first chunk that reads)."""
    typed = "time" in layout.fields if typed is None else typed
    kind = "number" if typed else ""
    done = 0  # records yielded so far: the line scan passes over them
    limit = None  # with a bad value and no skipping, the scan can stop at it
    quoted = _has_quote(path)
    try:
        with open(path, "rb") as f:  # its bytes on disk: pandas decompresses, f.tell() counts for progress
            for raw in _pandas_chunks(f, path, layout, rows=rows, typed=typed):
                df = role_columns(raw, layout)
                if df is None:
                    break
                if "time" in df and not typed:
                    df["time"], kind = parse_times(df["time"], kind)
                bad = flagged(invalid_by_role(df, layout.required), len(df))
                if bad.any() or (quoted and has_line_break(df, layout)):
                    if bad.any() and not skip:
                        limit = done + int(np.flatnonzero(bad)[0]) + 1
                    break
                yield tidy(df), f.tell()
                done += len(df)
            else:
                return
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: no data rows") from None
    except _NotNumbers:
        yield from delimited_chunks(path, layout, skip, skipped, rows=rows, typed=False)
        return
    except ValueError:  # ParserError, UnicodeDecodeError, a non-number in a typed column
        pass
    for df in _scanned_chunks(path, layout, skipped, skip=skip, keep_from=done, limit=limit, kind=kind):
        yield df, 0


class _NotNumbers(Exception):
    """The first chunk's times are not all numbers: read the file again as text."""


def _pandas_chunks(f: BinaryIO, path: Path, layout: Layout, *, rows: int, typed: bool) -> Iterator[pd.DataFrame]:
    """pandas' chunks of ``rows`` records of the open file ``f`` (``typed``: time as float64; a first chunk whose
    times are not numbers raises :class:`_NotNumbers`)."""
    with pd.read_csv(f, chunksize=rows, **parse_options(path, layout, typed=typed)) as reader:
        first = True
        while True:
            try:
                raw = next(reader)
            except StopIteration:
                return
            except ValueError:
                if first and typed:
                    raise _NotNumbers from None
                raise
            first = False
            yield raw


def _scanned_chunks(
    path: Path, layout: Layout, skipped: Skipped, *, skip: bool, keep_from: int, limit: int | None, kind: str
) -> Iterator[pd.DataFrame]:
    """The rest of a delimited file through the line scan: good rows in chunks; the first problem
    raised as the in-memory reader raises it, or with ``skip`` the bad rows dropped and counted
    in ``skipped``."""
    dropped: list[tuple[int, int]] = []
    for part in scan_parts(path, layout, skip=skip, limit=limit, keep_from=keep_from):
        df, value_problems = checked(part, layout, kind)
        problems = sorted(part.problems + value_problems)
        fatal = [p for p in problems if p.fatal]
        if (problems and not skip) or fatal:
            raise malformed(path, (fatal if skip else problems)[0])
        dropped.extend((p.first, p.last) for p in problems)
        yield tidy(df)
    skipped.add(path, dropped)


def is_number(text: str) -> bool:
    """Whether ``text`` is a finite number as Python writes one (the header test of a category file)."""
    try:
        return math.isfinite(float(text)) and "_" not in text
    except ValueError:
        return False


def is_int(text: str) -> bool:
    """Whether ``text`` is a whole number, blanks around it allowed (a ComiRec line's fields)."""
    return text.strip().lstrip("-").isdigit()
