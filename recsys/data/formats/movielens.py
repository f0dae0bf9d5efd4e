"""A MovieLens 100K folder (``data.format = "movielens"``): ``u.data`` holds ``user, item,
rating, time``, tab separated, and every rating counts as a click at its timestamp.

The categories are the genres of ``u.item`` when it is there (and ``data.categories`` names no
file): genres are multi-label flags, so an item's category is its first flag set, in ``u.genre``
order, the ``unknown`` genre read as no category. The files are latin-1. Small by nature, so read
whole in memory and out of core. Detected by ``u.data`` in the folder, or as the file named.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from recsys.config import DataConfig
from recsys.data.errors import DataError
from recsys.data.formats.reader import Reader
from recsys.data.linescan import Layout
from recsys.data.rows import Skipped
from recsys.data.tables import read_table

_DATA = "u.data"
_GENRES = 19  # genre flags in u.item when u.genre is absent
_LAYOUT = Layout(
    sep="\t",
    header=False,
    ncols=4,
    fields={"user": 0, "item": 1, "time": 3},
    required=("user", "item", "time"),
    encoding="latin-1",
)


class MovieLens(Reader):
    name = "movielens"

    def folder(self, folder: Path, files: list[Path]) -> list[Path] | None:
        return [folder / _DATA] if (folder / _DATA).is_file() else None

    def knows_name(self, path: Path) -> bool:
        return path.name == _DATA

    def files(self, source: Path) -> list[Path]:
        folder = source if source.is_dir() else source.parent
        if not (folder / _DATA).is_file():
            raise DataError(f"{folder}: no u.data (MovieLens 100K layout expected)")
        return [folder / _DATA]

    def time_is_position(self, cfg: DataConfig) -> bool:
        return False

    def read(self, path: Path, cfg: DataConfig, skipped: Skipped) -> pd.DataFrame:
        df = read_table(path, _LAYOUT, cfg.skip_bad_rows, skipped)
        if not cfg.categories and (path.parent / "u.item").is_file():  # data.categories replaces them
            table = movielens_genres(path.parent / "u.item").drop_duplicates("item", keep="first")
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
        nflags = len(names) if names else _GENRES
        flags = fields[-nflags:]
        if len(fields) < 5 + nflags or not fields[0].strip() or any(f not in ("0", "1") for f in flags):
            raise DataError(f"{path}:{lineno}: expected 'id|title|date|video date|url' and {nflags} 0/1 genre flags")
        items.append(fields[0].strip())
        genres.append([names[i] if names else f"genre{i}" for i, flag in enumerate(flags) if flag == "1" and i > 0])
        lines.append(lineno)
    return pd.DataFrame({"item": pd.Series(items, dtype="str"), "genres": genres, "line": lines})
