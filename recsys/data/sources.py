"""What a click source is on disk: which files of a folder hold the clicks, how they are
compressed, and the values their ``key=value`` folders give.

A folder of parts, as Spark writes one (Dask, Ray and pyarrow write the same shape with other
names)::

    clicks/
      _SUCCESS
      dt=2026-01-01/
        part-00000-<uuid>.c000.snappy.parquet
        .part-00000-<uuid>.c000.snappy.parquet.crc
        _started_<id>, _committed_<id>
      dt=2026-01-02/
        part-00000-<uuid>.c000.snappy.parquet    (the same part names in every partition)

Data files are found in the folder and in its ``key=value`` folders at any depth (Hive
partitioning), by the suffixes the formats read (:func:`recsys.data.formats.data_suffixes`);
names that start with ``_`` or ``.`` (markers, checksums, ``_temporary``) are not data, nor are
category files and READMEs. A file is known by its whole path, so parts of one name
in different partitions are different files; they are read in path order.

A ``key=value`` folder gives every row below it the column ``key`` holding the text ``value``,
unescaped as Spark and Hive escape it (``%3A`` for ``:``); Hive's ``__HIVE_DEFAULT_PARTITION__``
is a missing value.

Compressed text files end in ``.gz``, ``.bz2`` or ``.xz`` after their own suffix
(``clicks.csv.gz``) and are read through Python's decompressors, the ones pandas uses; other
compressions are refused by name rather than read as text.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
import zlib
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote

from recsys.data.errors import DataError

__all__ = [
    "HIVE_NULL",
    "compression",
    "data_files",
    "data_suffix",
    "decoding",
    "first_lines",
    "open_data",
    "partition_of",
    "written_as_parts",
]

_COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz"}  # suffix -> pandas' name for it
_OPENERS: dict[str, Callable[..., Any]] = {"gzip": gzip.open, "bz2": bz2.open, "xz": lzma.open}
_UNREAD = {".zst": "zstd", ".zip": "zip", ".lz4": "lz4", ".snappy": "snappy", ".deflate": "deflate"}
_CATEGORY_NAME = re.compile(r"item_?cate|categor", re.IGNORECASE)
_PARTITION = re.compile(r"^(?P<key>[^=]+)=(?P<value>.*)$")
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # Hive's and Spark's folder for a missing value


def compression(path: Path) -> str | None:
    """pandas' name of ``path``'s compression (``"gzip"``, ``"bz2"``, ``"xz"``), or ``None`` for a
    plain file; a compression recsys does not read is a :class:`DataError` naming the file."""
    suffix = path.suffix.lower()
    if suffix in _UNREAD:
        raise DataError(
            f"{path}: {_UNREAD[suffix]}-compressed files are not read; decompress it, or compress it "
            "with gzip (.gz), bzip2 (.bz2) or xz (.xz)"
        )
    return _COMPRESSIONS.get(suffix)


def data_suffix(path: Path) -> str:
    """The suffix of the data under any compression, lower case: ``clicks.CSV.gz`` -> ``.csv``."""
    suffix = path.suffix.lower()
    return Path(path.stem).suffix.lower() if suffix in _COMPRESSIONS or suffix in _UNREAD else suffix


def open_data(path: Path) -> BinaryIO:
    """``path`` opened for reading bytes, decompressed when its name says it is compressed."""
    name = compression(path)
    return _OPENERS[name](path, "rb") if name else open(path, "rb")


@contextmanager
def decoding(path: Path) -> Iterator[None]:
    """A compressed file that cannot be decompressed (cut short, or not what its name says) is a
    :class:`DataError` naming it; errors of the disk itself, which carry an errno, pass."""
    name = compression(path)
    try:
        yield
    except (EOFError, zlib.error, lzma.LZMAError, OSError) as err:
        if name is None or (isinstance(err, OSError) and err.errno is not None):
            raise
        raise DataError(f"{path}: not a readable {name} file ({err})") from err


def data_files(folder: Path, suffixes: Collection[str]) -> list[Path]:
    """The data files of ``folder`` and of its ``key=value`` folders at any depth, in path order:
    files whose :func:`data_suffix` is one of ``suffixes``."""
    found = []
    for path in folder.iterdir():
        if path.name.startswith((".", "_")):
            continue
        if path.is_dir() and _PARTITION.match(path.name):
            found.extend(data_files(path, suffixes))
        elif path.is_file() and _is_data(path, suffixes):
            found.append(path)
    return sorted(found)


def _is_data(path: Path, suffixes: Collection[str]) -> bool:
    suffix = data_suffix(path)
    compressed = suffix != path.suffix.lower()
    return (
        suffix in suffixes
        and not (compressed and suffix == "")  # archive.zip: not a compressed data file
        and not _CATEGORY_NAME.search(path.name)
        and path.name.lower() not in ("readme", "license")
    )


def written_as_parts(folder: Path, files: list[Path]) -> bool:
    """Whether ``files`` of ``folder`` are the parts of one table, as Spark, Dask or Ray write
    them: in ``key=value`` folders, beside Spark's ``_SUCCESS`` marker, or named ``part-*``."""
    return (
        any(path.parent != folder for path in files)
        or (folder / "_SUCCESS").is_file()
        or all(path.name.startswith("part-") for path in files)
    )


def partition_of(path: Path, root: Path) -> dict[str, tuple[str | None, Path]]:
    """``{key: (value, folder)}`` of the ``key=value`` folders between ``root`` and the file
    ``path`` (value ``None`` for Hive's missing value; ``folder`` names where it was read)."""
    values: dict[str, tuple[str | None, Path]] = {}
    if path == root:
        return values
    folder = root
    for name in path.relative_to(root).parts[:-1]:
        folder = folder / name
        match = _PARTITION.match(name)
        if match:
            value = match.group("value")
            values[unquote(match.group("key"))] = (None if value == HIVE_NULL else unquote(value), folder)
    return values


def first_lines(path: Path, n: int) -> list[str | None]:
    """The first ``n`` non-blank lines of a UTF-8 text file (``None`` past the end)."""
    out: list[str | None] = []
    with decoding(path), io.TextIOWrapper(open_data(path), encoding="utf-8-sig", errors="replace") as f:
        for line in f:
            if line.strip():
                out.append(line.rstrip("\r\n"))
                if len(out) == n:
                    break
    return out + [None] * (n - len(out))
