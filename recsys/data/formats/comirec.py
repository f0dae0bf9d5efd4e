"""ComiRec's files (``data.format = "comirec"``): ``user_id,item_id,position`` lines without a
header, so the time is only each click's position.

The categories come from the ``item_id,cate_id`` file beside the data (``*item_cate*``; of
several, the one that starts with the data's prefix) unless ``data.categories`` names one. A
folder holding ``X_train.txt``, ``X_valid.txt`` and ``X_test.txt`` is read as their
concatenation (ComiRec splits users across the three). Detected by that trio, or by a first line
of three comma-separated whole numbers.
"""

from __future__ import annotations

import re
from pathlib import Path

from recsys.config import DataConfig
from recsys.data.formats.reader import TableReader
from recsys.data.linescan import Layout
from recsys.data.tables import is_int

_PART = re.compile(r"^(?P<prefix>.+)_(?:train|valid|test)\.txt$")
LAYOUT = Layout(
    sep=",", header=False, ncols=3, fields={"user": 0, "item": 1, "time": 2}, required=("user", "item", "time")
)


class Comirec(TableReader):
    name = "comirec"
    any_parts = True  # headerless parts that Spark named .csv read as ComiRec lines

    def folder(self, folder: Path, files: list[Path]) -> list[Path] | None:
        prefixes = {m.group("prefix") for path in files if (m := _PART.match(path.name))}
        if len(files) > 1 and len(prefixes) == 1 and all(_PART.match(path.name) for path in files):
            return files
        return None

    def knows_line(self, line: str) -> bool:
        fields = line.split(",")
        return len(fields) == 3 and all(is_int(field) for field in fields)

    def time_is_position(self, cfg: DataConfig) -> bool:
        return True

    def category_file(self, files: list[Path]) -> Path | None:
        folder = files[0].parent
        candidates = sorted(path for path in folder.glob("*item_cate*") if path.is_file())
        match = _PART.match(files[0].name)
        prefix = match.group("prefix") if match else files[0].stem.split("_")[0]
        preferred = [path for path in candidates if path.name.startswith(prefix)]
        if len(preferred) == 1:
            return preferred[0]
        return candidates[0] if len(candidates) == 1 else None

    def layout(self, path: Path, cfg: DataConfig) -> Layout:
        return LAYOUT
