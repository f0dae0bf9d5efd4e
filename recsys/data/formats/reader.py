"""The reader interface and registry (``data.format``).

Each input format is one :class:`Reader`, registered once: it says how to tell the format from a
file or folder, how to read a file of it in memory and out of core, whether its ``time`` is a
timestamp or only a position, and where its categories come from. Everything that depends on
the format asks its reader (:mod:`recsys.data.readers` in memory, :mod:`recsys.data.chunks` out
of core), so adding a format is one module: a subclass and a :func:`register_reader` call
(``docs/data.md``, "Your own reader").

Detection (``data.format = "auto"``) asks the readers in three rounds, the latest registered
first in each, so a reader of your own is asked before the built-in ones:

1. a folder: :meth:`Reader.folder`, whether it holds the format as a whole (MovieLens' ``u.data``,
   ComiRec's trio, parts as Spark writes them); otherwise it must hold exactly one data file;
2. a file's name: :meth:`Reader.knows_name`;
3. the file's first non-blank line: :meth:`Reader.knows_line`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from recsys.config import AUTO, ConfigError, DataConfig
from recsys.data.errors import DataError
from recsys.data.linescan import Layout
from recsys.data.rows import Skipped
from recsys.data.sources import compression, data_files, data_suffix, first_lines, written_as_parts
from recsys.data.tables import Chunks, delimited_chunks, read_table

TEXT_SUFFIXES = (".txt", ".dat", "")  # names that say only "text": the first line tells the format


class Reader:
    """One input format, ``data.format = name``. Override what differs from the defaults.

    Attributes:
        name: its ``data.format`` value.
        suffixes: data suffixes (lower case, after any compression suffix is removed) that name
            the format: a file so named is read as it, and is a data file inside a folder.
        named_columns: its fields are the columns ``data.user_col``, ``item_col``, ``time_col``
            and ``category_col`` name, so a ``key=value`` folder above a file can give one.
        any_parts: with ``data.format`` set to it, a folder is read as the data files detection
            finds there whatever format it takes them for (ComiRec lines in parts named ``.csv``).
        packed: a byte of it holds several times the clicks a byte of text does (columnar and
            compressed): ``data.prepare = "auto"`` counts its bytes so.
    """

    name: str = ""
    suffixes: tuple[str, ...] = ()
    named_columns = False
    any_parts = False
    packed = False

    def folder(self, folder: Path, files: list[Path]) -> list[Path] | None:
        """The data files of ``folder`` if it holds this format as a whole, else None (``files``:
        its data files, in path order). By default: several files that all bear this format's
        name, written as the parts of one table (:func:`~recsys.data.sources.written_as_parts`)."""
        if len(files) > 1 and all(self.knows_name(path) for path in files) and written_as_parts(folder, files):
            return files
        return None

    def knows_name(self, path: Path) -> bool:
        """Whether the name of the file ``path`` says it holds this format: by default, its data
        suffix is one of :attr:`suffixes`."""
        return data_suffix(path) in self.suffixes

    def knows_line(self, line: str) -> bool:
        """Whether a file whose name says nothing of its format (``.txt``, ``.dat``, none) holds
        this format, by its first non-blank line. By default no: the name tells."""
        return False

    def files(self, source: Path) -> list[Path]:
        """The data files of ``source`` when ``data.format`` names this format: a file is itself; a
        folder's files are detection's when it finds this format there or a single file, or when
        the reader takes :attr:`any_parts`."""
        if not source.is_dir():
            return [source]
        detected, files = detect(source)
        if detected is self or self.any_parts or len(files) == 1:
            return files
        raise DataError(f"{source}: point data.source at the {self.name} file")

    def time_is_position(self, cfg: DataConfig) -> bool:
        """Whether the rows' ``time`` is only each click's position, not a timestamp (the prepared
        dataset then keeps no times, and a time split has nothing to cut). By default ``time`` is
        the column ``cfg.time_col`` names, so it is a position exactly when that is empty."""
        return not cfg.time_col

    def category_file(self, files: list[Path]) -> Path | None:
        """An ``item,category`` file that comes with the data ``files``, read when
        ``data.categories`` names none; its categories replace the rows' own. By default none:
        the categories are those :meth:`read` gives (``data.category_col``, say)."""
        return None

    def read(self, path: Path, cfg: DataConfig, skipped: Skipped) -> pd.DataFrame:
        """The tidy rows (:mod:`recsys.data.rows`) of the data file ``path``, in file order.

        ``cfg``: the data settings, less the columns that ``key=value`` folders give the file.
        A malformed row is a :class:`~recsys.data.errors.DataError` naming ``path`` and the line
        (or row), or with ``cfg.skip_bad_rows`` it is dropped and counted in ``skipped``."""
        raise NotImplementedError

    def chunks(self, path: Path, cfg: DataConfig, skipped: Skipped, rows: int) -> Chunks:
        """:meth:`read` in chunks of about ``rows`` rows, for a log larger than memory: the same rows,
        errors and drops, each chunk with the bytes of the file read so far (for progress; 0 when
        unknown). By default the whole file is one chunk: a format that holds large logs streams."""
        yield self.read(path, cfg, skipped), 0


class TableReader(Reader):
    """A format of delimited text, cut as :meth:`layout` says: read by :mod:`recsys.data.tables`
    (pandas' parser, with the line scan behind it) whole in memory and in chunks out of core."""

    def layout(self, path: Path, cfg: DataConfig) -> Layout:
        """How to cut the file ``path`` into role fields."""
        raise NotImplementedError

    def read(self, path: Path, cfg: DataConfig, skipped: Skipped) -> pd.DataFrame:
        return read_table(path, self.layout(path, cfg), cfg.skip_bad_rows, skipped)

    def chunks(self, path: Path, cfg: DataConfig, skipped: Skipped, rows: int) -> Chunks:
        return delimited_chunks(path, self.layout(path, cfg), cfg.skip_bad_rows, skipped, rows=rows)


_READERS: dict[str, Reader] = {}  # data.format -> its reader, in the order registered


def register_reader(reader: Reader) -> None:
    """Make ``data.format = reader.name`` read with ``reader``, and detection ask it before the
    readers registered so far."""
    if not reader.name or reader.name == AUTO:
        raise ValueError(f"a reader needs a name other than {AUTO!r}, got {reader.name!r}")
    if reader.name in _READERS:
        raise ValueError(f"reader {reader.name!r} registered twice")
    _READERS[reader.name] = reader


def unregister_reader(name: str) -> None:
    """Remove a registered reader, so that a notebook or a test can register its own again."""
    _READERS.pop(name, None)


def reader_names() -> list[str]:
    """Every registered ``data.format`` (besides ``"auto"``), sorted."""
    return sorted(_READERS)


def all_readers() -> list[Reader]:
    """Every registered reader, in the order detection asks them: the latest registered first."""
    return list(reversed(_READERS.values()))


def reader_for(name: str) -> Reader:
    """The reader of ``data.format = name``; an unknown name is a :class:`ConfigError` listing the known ones."""
    if name not in _READERS:
        raise ConfigError(f"data.format: unknown format {name!r}; known: {', '.join([AUTO, *reader_names()])}")
    return _READERS[name]


def data_suffixes() -> set[str]:
    """The data suffixes of the files that hold clicks: every reader's, and plain text's."""
    return {*TEXT_SUFFIXES, *(suffix for reader in _READERS.values() for suffix in reader.suffixes)}


def detect(source: Path) -> tuple[Reader, list[Path]]:
    """The reader of the file or folder ``source`` and its data files, as the module docstring says.

    A folder that no reader takes as a whole must hold one data file (in it or in its
    ``key=value`` folders), which is then detected as a file; a folder of several is refused,
    naming them. A file's compression must be one recsys reads before its bytes are looked at."""
    if source.is_dir():
        files = data_files(source, data_suffixes())
        for reader in all_readers():
            claimed = reader.folder(source, files)
            if claimed is not None:
                return reader, claimed
        if len(files) != 1:
            names = ", ".join(str(f.relative_to(source)) for f in files) or "none"
            raise DataError(
                f"{source}: cannot tell which file holds the clicks (data files: {names}); "
                "point data.source at the file"
            )
        source = files[0]
    compression(source)  # a compression that is not read is refused before its bytes are taken for text
    named = next((reader for reader in all_readers() if reader.knows_name(source)), None)
    if named is not None:
        return named, [source]
    (first,) = first_lines(source, 1)
    if first is None:
        raise DataError(f"{source}: empty file")
    known = next((reader for reader in all_readers() if reader.knows_line(first)), None)
    if known is None:
        raise DataError(f"{source}: no reader knows a first line like {first[:80]!r}; set data.format")
    return known, [source]
