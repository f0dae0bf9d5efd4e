"""A click log of any size, read a chunk at a time: the rows :func:`~recsys.data.readers.read_interactions`
returns, with the same checks, errors and warnings, in bounded memory.

CSV, TSV and ComiRec files (compressed or not) go through pandas' C parser in chunks (the parser
the in-memory reader uses, so ids, quoting and numbers read identically); Parquet files through
PyArrow's record batches. A folder of parts is read file by file, in path order, each file's
rows with the columns its ``key=value`` folders give (:func:`~recsys.data.readers.partition_roles`).
A chunk with something wrong hands the rest of its file to the reader's line scan
(:func:`~recsys.data.readers.scan_parts`), which names the line as the in-memory reader does, or
with ``data.skip_bad_rows`` drops exactly the rows it would.

Each chunk is a DataFrame ``[rows]`` with ``user``, ``item`` (str), ``time`` (float64; absent when
the source has no time column: then the row order is the order) and ``category`` (when known).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd

from recsys.config import DataConfig
from recsys.data.readers import (  # the reader's own rules, shared so both paths read alike
    COMIREC_LAYOUT,
    SEPARATORS,
    DataError,
    Given,
    Skipped,
    _any,
    _category_file,
    _check_columns,
    _checked,
    _has_quote,
    _invalid_by_role,
    _Layout,
    _malformed,
    _parse_times,
    _roles,
    _tidy,
    find_source,
    from_columns,
    has_line_break,
    named_layout,
    own_columns,
    parse_options,
    partition_roles,
    read_categories,
    read_interactions,
    role_columns,
    scan_parts,
    with_partition,
)
from recsys.data.sources import decoding
from recsys.extras import install_hint

CHUNK_ROWS = 1_000_000  # rows per chunk: ~100 MB of pandas strings at a time
STREAMED_FORMATS = ("csv", "tsv", "parquet", "comirec")  # the others are read whole, as one chunk


@dataclass(frozen=True)
class ClickSource:
    """What :func:`open_source` found: the files, their format and total size (for progress)."""

    cfg: DataConfig
    format: str
    files: list[Path]
    time_is_position: bool  # times are only positions: the prepared dataset keeps none
    partitions: list[Given]  # per file: the columns its key=value folders give, by role

    @property
    def size(self) -> int:
        """Bytes of all the data files."""
        return sum(path.stat().st_size for path in self.files)


def open_source(cfg: DataConfig) -> ClickSource:
    """The data files of ``cfg.source`` and their format."""
    fmt, files = find_source(cfg)
    named = fmt in ("csv", "tsv", "parquet")
    time_is_position = fmt in ("comirec", "sequences") or (named and not cfg.time_col)
    partitions = partition_roles(Path(cfg.source), files, cfg) if named else [{} for _ in files]
    return ClickSource(cfg, fmt, files, time_is_position=time_is_position, partitions=partitions)


def read_chunks(src: ClickSource, *, advance: Callable[[int], object] = lambda n: None) -> Iterator[pd.DataFrame]:
    """The source's tidy rows in file order, chunk by chunk; ``advance(bytes)`` as the files are read."""
    cfg = src.cfg
    if src.format not in STREAMED_FORMATS:  # MovieLens 100K, one user per line: small by nature
        df = read_interactions(cfg)
        yield df
        advance(src.size)
        return
    categories = None
    category_file = _category_file(cfg, src.format, src.files)
    if category_file is not None:
        categories = read_categories(category_file, skip_bad_rows=cfg.skip_bad_rows)
    found, skipped = False, Skipped()
    for path, given in zip(src.files, src.partitions):
        own = own_columns(cfg, given)  # the columns the file holds itself
        done = 0
        with decoding(path):
            if src.format == "parquet":
                chunks = _parquet_chunks(path, own, skipped)
            else:
                layout = COMIREC_LAYOUT if src.format == "comirec" else named_layout(path, SEPARATORS[src.format], own)
                chunks = _delimited_chunks(path, layout, cfg.skip_bad_rows, skipped)
            for chunk, position in chunks:
                chunk = with_partition(chunk, given)
                if categories is not None:
                    chunk["category"] = chunk["item"].map(categories)
                found = found or len(chunk) > 0
                yield chunk
                advance(max(0, position - done))
                done = max(done, position)
        advance(path.stat().st_size - done)
    skipped.warn(cfg.source, len(src.files))
    if not found:
        raise DataError(f"{cfg.source}: no clicks found")


_Chunks = Iterator[tuple[pd.DataFrame, int]]  # tidy chunks, each with the bytes of its file read so far


def _delimited_chunks(
    path: Path, layout: _Layout, skip: bool, skipped: Skipped, *, typed: bool | None = None
) -> _Chunks:
    """Tidy chunks of a delimited file: pandas' parser while the rows are good, then the line scan
    from the first record of the first chunk that is not (rows it drops counted in ``skipped``).

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
            for raw in _pandas_chunks(f, path, layout, typed=typed):
                df = role_columns(raw, layout)
                if df is None:
                    break
                if "time" in df and not typed:
                    df["time"], kind = _parse_times(df["time"], kind)
                bad = _any(_invalid_by_role(df, layout.required), len(df))
                if bad.any() or (quoted and has_line_break(df, layout)):
                    if bad.any() and not skip:
                        limit = done + int(np.flatnonzero(bad)[0]) + 1
                    break
                yield _tidy(df), f.tell()
                done += len(df)
            else:
                return
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: no data rows") from None
    except _NotNumbers:
        yield from _delimited_chunks(path, layout, skip, skipped, typed=False)
        return
    except ValueError:  # ParserError, UnicodeDecodeError, a non-number in a typed column
        pass
    for df in _scanned_chunks(path, layout, skipped, skip=skip, keep_from=done, limit=limit, kind=kind):
        yield df, 0


class _NotNumbers(Exception):
    """The first chunk's times are not all numbers: read the file again as text."""


def _pandas_chunks(f: BinaryIO, path: Path, layout: _Layout, *, typed: bool) -> Iterator[pd.DataFrame]:
    """pandas' chunks of the open file ``f`` (``typed``: time as float64; a first chunk whose
    times are not numbers raises :class:`_NotNumbers`)."""
    with pd.read_csv(f, chunksize=CHUNK_ROWS, **parse_options(path, layout, typed=typed)) as reader:
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
    path: Path, layout: _Layout, skipped: Skipped, *, skip: bool, keep_from: int, limit: int | None, kind: str
) -> Iterator[pd.DataFrame]:
    """The rest of a delimited file through the line scan: good rows in chunks; the first problem
    raised as the in-memory reader raises it, or with ``skip`` the bad rows dropped and counted
    in ``skipped``."""
    dropped: list[tuple[int, int]] = []
    for part in scan_parts(path, layout, skip=skip, limit=limit, keep_from=keep_from):
        df, value_problems = _checked(part, layout, kind)
        problems = sorted(part.problems + value_problems)
        fatal = [p for p in problems if p.fatal]
        if (problems and not skip) or fatal:
            raise _malformed(path, (fatal if skip else problems)[0])
        dropped.extend((p.first, p.last) for p in problems)
        yield _tidy(df)
    skipped.add(path, dropped)


def _parquet_chunks(path: Path, cfg: DataConfig, skipped: Skipped) -> _Chunks:
    """Tidy record batches of one Parquet file, with the in-memory reader's checks (rows named
    from 1 within the file; rows dropped counted in ``skipped``)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise DataError(f"{path}: reading Parquet needs pyarrow ({install_hint('parquet')})") from err
    try:
        parquet = pq.ParquetFile(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f"{path}: not a readable Parquet file ({err})") from err
    available = parquet.schema_arrow.names
    _check_columns(path, cfg, available)
    columns = [name for name in _roles(cfg).values() if name in available]
    size, rows = path.stat().st_size, max(1, parquet.metadata.num_rows)
    float_ids = _float_ids(parquet, cfg)
    row = 0
    for batch in parquet.iter_batches(batch_size=CHUNK_ROWS, columns=columns):
        raw = batch.to_pandas()
        for name, integral in float_ids.items():  # as the whole column reads: "3" or "3.0"
            raw[name] = raw[name].astype("Int64") if integral else raw[name].astype("str").where(raw[name].notna())
        df = from_columns(raw, cfg, path, first_row=row, skipped=skipped)
        row += len(raw)
        yield df, size * row // rows


def _float_ids(parquet: Any, cfg: DataConfig) -> dict[str, bool]:
    """The float id columns (user, item, category) of a Parquet file -> whether every value is
    integral: the in-memory reader writes their ids as ``3`` then, else as ``3.0``; a batch alone
    cannot tell."""
    import pyarrow as pa

    schema = parquet.schema_arrow
    names = [name for role, name in _roles(cfg).items() if role != "time" and name in schema.names]
    floats = [name for name in names if pa.types.is_floating(schema.field(name).type)]
    integral = dict.fromkeys(floats, True)
    for batch in parquet.iter_batches(batch_size=CHUNK_ROWS, columns=floats) if floats else ():
        for name in floats:
            values = batch.column(name).to_numpy(zero_copy_only=False)
            integral[name] &= bool(np.all(np.isnan(values) | (values == np.round(values))))
    return integral
