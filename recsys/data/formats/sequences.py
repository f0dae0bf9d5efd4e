"""One user per line (``data.format = "sequences"``): ``user item item ...`` separated by
blanks, in click order, so the time is only each click's position (a user's lines continue one
another). Read whole in memory and out of core. Detected by any first line no other reader
knows: it is asked last.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from recsys.config import DataConfig
from recsys.data.formats.reader import Reader
from recsys.data.linescan import LINE_BREAK, NOT_UTF8, Problem, malformed
from recsys.data.rows import Skipped
from recsys.data.sources import open_data


class Sequences(Reader):
    name = "sequences"

    def knows_line(self, line: str) -> bool:
        return True

    def time_is_position(self, cfg: DataConfig) -> bool:
        return True

    def read(self, path: Path, cfg: DataConfig, skipped: Skipped) -> pd.DataFrame:
        with open_data(path) as f:
            text = f.read().decode("utf-8-sig", errors="surrogateescape")
        check_utf8 = NOT_UTF8.search(text) is not None
        users: list[str] = []
        items: list[str] = []
        counts: list[int] = []
        dropped: list[tuple[int, int]] = []
        lost = 0  # clicks on the dropped lines
        for lineno, line in enumerate(LINE_BREAK.split(text), start=1):
            tokens = line.split()
            if not tokens:
                continue
            if check_utf8 and NOT_UTF8.search(line):
                problem = "not valid utf-8 text"
            elif len(tokens) == 1:
                problem = f"expected 'user item item ...', found only {tokens[0]!r}"
            else:
                users.append(tokens[0])
                items.extend(tokens[1:])
                counts.append(len(tokens) - 1)
                continue
            if not cfg.skip_bad_rows:
                raise malformed(path, Problem(lineno, lineno, lineno, problem))
            dropped.append((lineno, lineno))
            lost += len(tokens) - 1
        skipped.add(path, dropped, clicks=lost)
        return pd.DataFrame(
            {
                "user": pd.Series(np.repeat(np.asarray(users, dtype=object), counts), dtype="str"),
                "item": pd.Series(items, dtype="str"),
            }
        )
