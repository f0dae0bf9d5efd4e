"""A click log of any size, read a chunk at a time: the rows :func:`~recsys.data.readers.read_interactions`
returns, with the same checks, errors and warnings, in bounded memory.

Each file is read by its format's out-of-core form (:meth:`recsys.data.formats.Reader.chunks`):
CSV, TSV and ComiRec files (compressed or not) through pandas' C parser in chunks (the parser the
in-memory reader uses, so ids, quoting and numbers read identically, with the line scan behind it
to name or drop a malformed row), Parquet files by PyArrow's record batches, and the small formats
(MovieLens 100K, one user per line) whole. A folder of parts is read file by file, in path order,
each file's rows with the columns its ``key=value`` folders give
(:func:`~recsys.data.readers.partition_roles`).

Each chunk is a DataFrame ``[rows]`` with ``user``, ``item`` (str), ``time`` (float64; absent when
the source has no time column: then the row order is the order) and ``category`` (when known).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from recsys.config import DataConfig
from recsys.data.errors import DataError
from recsys.data.formats import Reader
from recsys.data.readers import Given, find_source, item_categories, own_columns, partition_roles, with_partition
from recsys.data.rows import Skipped
from recsys.data.sources import decoding

CHUNK_ROWS = 1_000_000  # rows per chunk: ~100 MB of pandas strings at a time


@dataclass(frozen=True)
class ClickSource:
    """What :func:`open_source` found: the files, their reader and total size (for progress)."""

    cfg: DataConfig
    reader: Reader
    files: list[Path]
    partitions: list[Given]  # per file: the columns its key=value folders give, by role

    @property
    def time_is_position(self) -> bool:
        """Times are only positions: the prepared dataset keeps none."""
        return self.reader.time_is_position(self.cfg)

    @property
    def size(self) -> int:
        """Bytes of all the data files."""
        return sum(path.stat().st_size for path in self.files)


def open_source(cfg: DataConfig) -> ClickSource:
    """The data files of ``cfg.source`` and their reader."""
    reader, files = find_source(cfg)
    return ClickSource(cfg, reader, files, partitions=partition_roles(reader, Path(cfg.source), files, cfg))


def read_chunks(src: ClickSource, *, advance: Callable[[int], object] = lambda n: None) -> Iterator[pd.DataFrame]:
    """The source's tidy rows in file order, chunk by chunk; ``advance(bytes)`` as the files are read."""
    cfg = src.cfg
    categories = item_categories(cfg, src.reader, src.files)
    found, skipped = False, Skipped()
    for path, given in zip(src.files, src.partitions):
        done = 0
        with decoding(path):
            for chunk, position in src.reader.chunks(path, own_columns(cfg, given), skipped, CHUNK_ROWS):
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
