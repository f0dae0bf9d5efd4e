"""The tidy click rows every reader returns, and the rules every reader checks them by.

A reader's rows are a DataFrame ``[n]`` with ``user`` and ``item`` (str: the raw ids as written),
``time`` (float64; absent when the source has none, and then the row order is the click order)
and, when known, ``category`` (str, missing where unknown); :func:`tidy` gives them these dtypes.
The roles come from the columns the config names (:func:`roles`) or from a format's own layout;
every reader checks them by the same vectorised rules (:func:`invalid_by_role`,
:func:`parse_times`), so a row is bad or good whatever format it came in, and reports the rows it
drops with ``data.skip_bad_rows`` through the one :class:`Skipped` of its source.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from recsys.config import DataConfig
from recsys.data.errors import DataError, DataWarning
from recsys.text import count

TIDY_COLUMNS = ("user", "item", "time", "category")
SKIP_HINT = " (set data.skip_bad_rows=true to drop malformed rows)"
_SHOWN_LINES = 5  # line numbers listed in a skip warning
_SHOWN_FILES = 3  # files listed in a skip warning about a folder


def roles(cfg: DataConfig) -> dict[str, str]:
    """Role (user, item, time, category) -> configured column name, for the roles configured."""
    columns = {"user": cfg.user_col, "item": cfg.item_col, "time": cfg.time_col, "category": cfg.category_col}
    return {role: name for role, name in columns.items() if name}


def check_columns(where: str | Path, cfg: DataConfig, columns: list[str]) -> None:
    """Raise naming the option of the first configured column that ``columns`` lacks."""
    for role, name in roles(cfg).items():
        if name not in columns:
            raise DataError(f"{where}: no column {name!r} (data.{role}_col); the columns are {list(columns)}")


def from_columns(
    raw: pd.DataFrame, cfg: DataConfig, where: str | Path, *, skipped: Skipped, first_row: int = 0
) -> pd.DataFrame:
    """The configured columns of ``raw`` as tidy roles (ids as str, numeric times); bad rows
    raise naming ``where`` and the row, or are dropped with ``data.skip_bad_rows`` and counted
    in ``skipped``.

    ``first_row``: the row number of ``raw``'s first row minus one (``raw`` is a batch of a larger
    table)."""
    path, columns = where, roles(cfg)
    df = pd.DataFrame({role: as_str(raw[name]) if role != "time" else raw[name] for role, name in columns.items()})
    if "time" in df and pd.api.types.is_datetime64_any_dtype(df["time"]):
        df["time"] = datetime_seconds(df["time"])
    elif "time" in df:
        df["time"] = pd.to_numeric(df["time"], errors="coerce")
    required = tuple(role for role in ("user", "item", "time") if role in df)
    masks = invalid_by_role(df, required)
    bad = flagged(masks, len(df))
    if bad.any():
        rows = np.flatnonzero(bad)
        if not cfg.skip_bad_rows:
            row = int(rows[0])
            role = next(role for role in required if masks[role][row])
            value = raw[columns["time"]].iloc[row] if role == "time" else None
            reason = f"time {_plain(value)!r} is missing or not a number" if role == "time" else f"empty {role}"
            raise DataError(f"{path}: row {first_row + row + 1}: {reason}{SKIP_HINT}")
        skipped.add(path, [(first_row + int(r) + 1, first_row + int(r) + 1) for r in rows], unit="row")
        df = df[~bad].reset_index(drop=True)
    return tidy(df)


def _plain(value: object) -> object:
    """A NumPy scalar as the Python value it holds, so a message shows ``nan``, not ``np.float64(nan)``."""
    return value.item() if isinstance(value, np.generic) else value


def as_str(col: pd.Series) -> pd.Series:
    """Parquet id column -> str (integral floats print without ``.0``; missing stays missing)."""
    if pd.api.types.is_float_dtype(col) and np.all(np.isnan(col) | (col == np.round(col))):
        col = col.astype("Int64")
    return col.astype("str").where(col.notna())


def parse_times(text: pd.Series, kind: str = "") -> tuple[pd.Series, str]:
    """Time text ``[n]`` -> ``(seconds [n] float64, NaN where unreadable; the kind read)``.

    ``kind`` ``"number"`` or ``"date-time"`` (ISO 8601, as unix seconds) fixes the reading; ``""``
    reads numbers when any value is one, else date-times, and returns ``""`` when neither reads.
    """
    if kind != "date-time":
        numbers = pd.to_numeric(text, errors="coerce")
        if kind == "number" or numbers.notna().any():
            return numbers, "number"
    seconds = datetime_seconds(pd.to_datetime(text, format="ISO8601", utc=True, errors="coerce"))
    return seconds, "date-time" if kind or seconds.notna().any() else ""


def datetime_seconds(col: pd.Series) -> pd.Series:
    if col.dt.tz is None:
        col = col.dt.tz_localize("UTC")
    return (col - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)


def invalid_by_role(df: pd.DataFrame, required: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Bad-row masks ``{role: [n] bool}``: an empty or missing id, or a missing/non-finite time."""
    masks = {}
    for role in required:
        col = df[role]
        if role == "time":
            masks[role] = ~np.isfinite(col.to_numpy(np.float64, na_value=np.nan))
        else:
            masks[role] = (col.isna() | (col.str.strip() == "")).to_numpy(bool)
    return masks


def flagged(masks: dict[str, np.ndarray], n: int) -> np.ndarray:
    """``[n]`` bool: rows that any mask flags."""
    return np.logical_or.reduce([*masks.values(), np.zeros(n, dtype=bool)])


def tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Final dtypes: str ids, float64 time, str category with empty values missing; any other
    role (the columns of an item feature file, :mod:`recsys.data.feature_readers`) as str."""
    out = pd.DataFrame({role: df[role].astype("str") for role in ("user", "item") if role in df})
    if "time" in df:
        out["time"] = df["time"].to_numpy(np.float64)
    if "category" in df:
        category = df["category"].astype("str")
        out["category"] = category.mask(category.str.strip() == "")
    for role in df.columns.difference(TIDY_COLUMNS, sort=False):
        out[role] = df[role].astype("str")
    return out


_Spans = list[tuple[int, int]]  # [(first, last)] lines (or rows) of each malformed record


@dataclass
class Skipped:
    """The malformed records dropped (``data.skip_bad_rows``) from the files of one source,
    gathered so that the source gives one warning, not one a file: a folder of a thousand parts
    would print a thousand lines."""

    spans: dict[str, _Spans] = field(default_factory=dict)  # file -> its dropped records, in order
    unit: str = "line"  # what the spans count: "line", or "row" for tables
    clicks: int | None = None  # the clicks the dropped lines held (one-user-per-line files)

    def add(self, path: str | Path, spans: _Spans, *, unit: str = "line", clicks: int | None = None) -> None:
        """Count ``spans`` dropped from ``path`` (and the ``clicks`` they held); a file's spans are
        kept in file order, whichever check dropped them first."""
        if spans:
            kept = self.spans.setdefault(str(path), [])
            kept.extend(spans)
            kept.sort()  # two sorted runs: linear
            self.unit = unit
            self.clicks = None if clicks is None else (self.clicks or 0) + clicks

    def warn(self, source: str | Path, files: int) -> None:
        """One :class:`DataWarning` for what was dropped from ``source`` (``files`` data files),
        if anything: how many records on how many lines, and where (the first files' lines when
        several files lost some)."""
        if not self.spans:
            return
        if len(self.spans) == 1:
            ((path, spans),) = self.spans.items()
            what = f"{_dropped(spans, self.unit)} ({_where(spans, self.unit)})"
        else:
            path = str(source)
            everything = [span for spans in self.spans.values() for span in spans]
            shown = [f"{_inside(name, source)} ({_where(s, self.unit)})" for name, s in self.spans.items()]
            more = "; ..." if len(shown) > _SHOWN_FILES else ""
            what = (
                f"{_dropped(everything, self.unit)} in {len(shown)} of {count(files, 'file')}: "
                + "; ".join(shown[:_SHOWN_FILES])
                + more
            )
        held = "" if self.clicks is None else f" holding {count(self.clicks, 'click')}"
        warnings.warn(f"{path}: skipped {what}{held}", DataWarning, stacklevel=3)


def _dropped(spans: _Spans, unit: str) -> str:
    """``3 malformed lines``, or ``2 malformed rows on 5 lines`` when a record spans several."""
    covered = sum(last - first + 1 for first, last in spans)
    if covered == len(spans):
        return count(len(spans), f"malformed {unit}")
    return f"{count(len(spans), 'malformed row')} on {count(covered, 'line')}"


def _where(spans: _Spans, unit: str) -> str:
    """``line 2, 5``, or ``lines 2-4, 9, ...`` when a record spans several: the first few."""
    covered = sum(last - first + 1 for first, last in spans)
    shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans[:_SHOWN_LINES])
    return f"{unit if covered == len(spans) else 'lines'} {shown}" + (", ..." if len(spans) > _SHOWN_LINES else "")


def _inside(path: str, source: str | Path) -> str:
    """``path`` within the folder ``source`` (``dt=2026-01-01/part-00000.parquet``), else whole."""
    try:
        return str(Path(path).relative_to(source))
    except ValueError:
        return path
