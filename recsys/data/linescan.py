"""The line scan: a delimited text file read record by record with Python's csv module, cut
exactly as pandas' C parser cuts it, so that a malformed record is named by its line.

It is the slow path behind :mod:`recsys.data.tables`, run only when pandas found something
wrong: it names the first malformed record (``file:line: reason``), or with
``data.skip_bad_rows`` drops exactly the malformed ones, in parts of bounded memory. Values are
checked by the rules of :mod:`recsys.data.rows`, the ones the fast path applies.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pandas as pd

from recsys.data.errors import DataError
from recsys.data.rows import SKIP_HINT, flagged, invalid_by_role, parse_times
from recsys.data.sources import open_data

_SCAN_CHUNK = 65_536  # records the line scan holds as Python strings before it stores them as pandas strings
LINE_BREAK = re.compile(r"\r\n|\r|\n")  # line ends, as pandas' C parser splits lines
NOT_UTF8 = re.compile("[\udc80-\udcff]")  # bytes that were not UTF-8, as errors="surrogateescape" keeps them
_CSV_FIELD_LIMIT = 2**31 - 1  # Python's csv module refuses fields over 131,072 characters; pandas has no limit


@dataclass(frozen=True)
class Layout:
    """How to cut a delimited text file into fields."""

    sep: str
    header: bool  # the first non-blank line names the columns (and is not data)
    ncols: int  # fields per line
    fields: dict[str, int]  # role (user, item, time, category) -> column index
    required: tuple[str, ...]  # roles that must not be empty
    encoding: str = "utf-8"


@dataclass(frozen=True, order=True)
class Problem:
    """Why a record is malformed, and where."""

    line: int  # the line named in the message
    first: int  # the record's lines (a quoted field can span several)
    last: int
    reason: str
    fatal: bool = False  # data.skip_bad_rows cannot drop it


_Record = tuple[int, int, list[str], Problem | None]  # first line, last line, fields, what makes it unreadable


@dataclass
class Scan:
    """What the line scan read: the well-formed records (their lines, and their role fields as
    text) and the problems of the others."""

    starts: array  # [n] int64: the first line of each well-formed record, in file order
    ends: dict[int, int]  # record index -> last line, for the records on several lines
    short: dict[int, int]  # record index -> its field count, for the records with too few fields
    problems: list[Problem]  # the malformed records, in file order
    text: pd.DataFrame  # [n] role columns of the well-formed records, as text


def scan_file(path: Path, layout: Layout, *, skip: bool, limit: int | None = None) -> Scan:
    """The slow path, run only when the fast one found something wrong: record by record with
    Python's csv module. It stops at the first malformed record unless ``skip`` (and at a quote
    never closed even then), and after ``limit`` well-formed records. Values are checked
    afterwards, by :func:`checked`, with the fast path's vectorised rules."""
    parts = list(scan_parts(path, layout, skip=skip, limit=limit))
    offsets = np.cumsum([0] + [len(part.starts) for part in parts])
    return Scan(
        starts=array("q", [line for part in parts for line in part.starts]),
        ends={int(at) + row: line for at, part in zip(offsets, parts) for row, line in part.ends.items()},
        short={int(at) + row: n for at, part in zip(offsets, parts) for row, n in part.short.items()},
        problems=[problem for part in parts for problem in part.problems],
        text=pd.concat([part.text for part in parts], ignore_index=True),
    )


def scan_parts(
    path: Path, layout: Layout, *, skip: bool, limit: int | None = None, keep_from: int = 0
) -> Iterator[Scan]:
    """:func:`scan_file` in parts of at most ``_SCAN_CHUNK`` well-formed records each (the last may
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
            next(records, None)  # checked by first_record before any reading
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
                yield Scan(starts, ends, short, problems, _text_frame(kept, layout))
                starts, ends, short, problems, kept = array("q"), {}, {}, [], []
            if seen == limit:
                break
    yield Scan(starts, ends, short, problems, _text_frame(kept, layout))


def _text_frame(rows: list[list[str]], layout: Layout) -> pd.DataFrame:
    """``[len(rows)]`` role columns (str) of records' fields (each padded to ``layout.ncols``)."""
    return pd.DataFrame(
        {role: pd.Series(list(map(itemgetter(idx), rows)), dtype="str") for role, idx in layout.fields.items()}
    )


def checked(scan: Scan, layout: Layout, kind: str = "") -> tuple[pd.DataFrame, list[Problem]]:
    """The scanned records' values checked as the fast path checks them: ``(the rows whose values
    are good, time in seconds; a problem for each other row)``. ``kind``: how times read
    (:func:`parse_times`; ``""``: decided by these records)."""
    df = scan.text.copy()
    if "time" in df:
        df["time"], kind = parse_times(scan.text["time"], kind)
    masks = invalid_by_role(df, layout.required)
    bad = flagged(masks, len(df))
    problems = []
    for row in np.flatnonzero(bad).tolist():
        role = next(role for role in layout.required if masks[role][row])
        first, idx = scan.starts[row], layout.fields[role]
        n = scan.short.get(row, layout.ncols)
        short = f" (the line has {n} of {layout.ncols} fields)" if n < layout.ncols else ""
        value = scan.text[role].iloc[row].strip()
        reason = f"time {value!r} is not a {kind or 'number'}" if role == "time" else f"empty {role} (field {idx + 1})"
        problems.append(Problem(first, first, scan.ends.get(row, first), reason + short))
    return df[~bad].reset_index(drop=True), problems


def _structure_problem(first: int, last: int, fields: list[str], layout: Layout) -> Problem | None:
    """A field recsys reads that spans lines (its quote closes only on a later line), or too many fields."""
    for role, idx in sorted(layout.fields.items(), key=lambda item: item[1]):
        if idx < len(fields) and LINE_BREAK.search(fields[idx]):
            opens = first + _line_breaks("".join(fields[:idx]))
            closes = opens + _line_breaks(fields[idx])
            return Problem(opens, first, last, f"a quote opens the {role} field here and closes only on line {closes}")
    if len(fields) > layout.ncols:
        return Problem(first, first, last, f"expected {layout.ncols} fields, found {len(fields)}")
    return None


def _line_breaks(text: str) -> int:
    return len(LINE_BREAK.findall(text))


def malformed(path: Path, problem: Problem) -> DataError:
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
            Problem(last + 1, last + 1, reader.line_num, f"cannot be split into fields ({err})", fatal=True),
        )


def _marking_the_end(lines: Iterator[str], ended: list[bool]) -> Iterator[str]:
    yield from lines
    ended.append(True)


def _record_problem(first: int, last: int, fields: list[str], encoding: str, *, ended: bool) -> Problem | None:
    """A quote never closed (the record ran to the end of the file), or bytes that are not text."""
    if ended:
        opens = first + _line_breaks("".join(fields[:-1]))
        return Problem(
            opens,
            first,
            last,
            "a quote opens here and is never closed, so it would take in the rest of the file",
            fatal=True,
        )
    joined = "".join(fields)
    bad = None if joined.isascii() else NOT_UTF8.search(joined)
    if bad is None:
        return None
    return Problem(first + _line_breaks(joined[: bad.start()]), first, last, f"not valid {encoding} text")


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


def first_record(path: Path, sep: str) -> tuple[int, list[str]]:
    """``(line, fields)`` of the first non-blank record of a UTF-8 delimited file: its header."""
    with _csv_fields_unlimited(), open_data(path) as f:
        record = next(_records(f, sep, "utf-8"), None)
    if record is None:
        raise DataError(f"{path}: empty file")
    first, _, fields, problem = record
    if problem is not None:
        raise DataError(f"{path}:{problem.line}: {problem.reason}")
    return first, fields
