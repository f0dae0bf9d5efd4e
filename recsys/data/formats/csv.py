"""CSV and TSV files with a header row (``data.format = "csv"``, ``"tsv"``).

The columns are read by the names ``data.user_col``, ``data.item_col``, ``data.time_col`` (empty:
the row order within each user) and ``data.category_col`` (optional) give them; times are numbers
or ISO 8601 date-times. A folder of parts as Spark, Dask or Ray write them is read part by part,
and a configured column may be the key of the ``key=value`` folders above a part
(:func:`recsys.data.readers.partition_roles`). Detected by the suffix (``.csv``, ``.tsv``, under
any compression) or, for a name that says only text, by a first line that holds the separator
(for tabs, not only whole numbers: that is a one-user-per-line file).
"""

from __future__ import annotations

from pathlib import Path

from recsys.config import DataConfig
from recsys.data.formats.reader import TableReader
from recsys.data.linescan import Layout
from recsys.data.tables import is_int, named_layout


class NamedColumns(TableReader):
    """A delimited file whose header names the columns, ``sep`` between the fields."""

    named_columns = True

    def __init__(self, name: str, sep: str) -> None:
        self.name, self.sep, self.suffixes = name, sep, (f".{name}",)

    def knows_line(self, line: str) -> bool:
        return self.sep in line.strip() and not all(is_int(token) for token in line.split())

    def layout(self, path: Path, cfg: DataConfig) -> Layout:
        return named_layout(path, self.sep, cfg)
