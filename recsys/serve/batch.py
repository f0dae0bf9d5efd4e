"""Batch top-N for many users (``recsys recommend``): raw user ids in, a table of raw item ids out.

Each user's input is their last ``max_len`` clicks in the run's dataset. Users are processed
in batches (one model call and one index search per batch); the output has one row per
``(user, rank)``::

    user  rank  item  score  interest
    "17"     1  "50"  4.21          2     rank 1 = best; interest = which of the K interests found it

Users with fewer than ``n`` retrievable items get fewer rows.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

import numpy as np
import pandas as pd

from recsys.serve.recommender import Recommender

__all__ = ["Progress", "output_format", "read_user_file", "recommend_users", "resolve_users", "write_recommendations"]

COLUMNS = ("user", "rank", "item", "score", "interest")


class Progress:
    """A one-line progress counter on stderr (``\\r``-updated at most every ``every_s``)."""

    def __init__(self, total: int, label: str, *, stream: TextIO | None = None, every_s: float = 0.5) -> None:
        self.total, self.label, self.every_s = total, label, every_s
        self.stream = stream if stream is not None else sys.stderr
        self.start = self.last = time.perf_counter()
        self.done = 0

    def update(self, count: int) -> None:
        """Add ``count`` finished units; redraw when due or when all are done."""
        self.done += count
        now = time.perf_counter()
        if now - self.last >= self.every_s or self.done >= self.total:
            self.last = now
            rate = self.done / max(now - self.start, 1e-9)
            pct = 100.0 * self.done / max(self.total, 1)
            self.stream.write(f"\r{self.label}: {self.done:,}/{self.total:,} ({pct:.0f}%), {rate:,.0f}/s")
            if self.done >= self.total:
                self.stream.write("\n")
            self.stream.flush()


def read_user_file(path: str | Path) -> list[str]:
    """Raw user ids from a UTF-8 text file, one per line, taken exactly as written (spaces
    are part of an id, as in the data; only the line ending is removed); blank lines are
    ignored."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"--users: file not found: {path}") from None
    except UnicodeDecodeError as err:
        lineno = path.read_bytes().count(b"\n", 0, err.start) + 1
        raise ValueError(f"--users: {path}:{lineno}: not valid utf-8 text") from None
    users = [line for line in text.split("\n") if line.strip()]
    users = [line[:-1] if line.endswith("\r") else line for line in users]
    if not users:
        raise ValueError(f"--users: {path} holds no user ids")
    return users


def resolve_users(rec: Recommender, raw: list[str] | None, *, strict: bool = False) -> tuple[np.ndarray, list[str]]:
    """User indices to recommend for, and the unknown raw ids.

    ``raw = None`` means every user of the dataset. Duplicates are recommended for once (first
    occurrence kept). With ``strict``, any unknown user is an error.
    """
    if raw is None:
        return np.arange(rec.dataset.num_users, dtype=np.int64), []
    users, unknown = rec.encode_users(list(dict.fromkeys(raw)))
    if unknown and strict:
        shown = ", ".join(repr(u) for u in unknown[:10])
        raise ValueError(f"--users: {len(unknown)} unknown user ids (--strict): {shown}")
    return users, unknown


def recommend_users(
    rec: Recommender,
    users: np.ndarray,
    n: int,
    *,
    exclude_seen: bool = True,
    diversity_lambda: float = 0.0,
    batch_size: int = 1024,
    progress: bool = True,
) -> pd.DataFrame:
    """Top ``n`` for each of ``users [U]`` (dataset indices), as a table with columns
    ``user, rank, item, score, interest`` (one row per user and rank, users in input order).

    ``exclude_seen`` (the default) drops every item the user clicked in the dataset.
    """
    if batch_size <= 0:
        raise ValueError(f"--batch-size: must be > 0, got {batch_size}")
    users = np.asarray(users, dtype=np.int64)
    bar = Progress(len(users), "recommend (users)") if progress and len(users) else None
    parts = []
    for start in range(0, len(users), batch_size):
        batch = users[start : start + batch_size]
        inputs, lengths = rec.user_inputs(batch)
        exclude = rec.user_histories(batch) if exclude_seen else None
        recs = rec.recommend(inputs, lengths, n, exclude=exclude, diversity_lambda=diversity_lambda)
        row, col = np.nonzero(recs.ids > 0)
        ids = recs.ids[row, col]
        parts.append(pd.DataFrame({
            "user": rec.dataset.user_raw[batch[row]],
            "rank": (col + 1).astype(np.int64),
            "item": rec.item_raw(ids),
            "score": recs.scores[row, col],
            "interest": recs.interest_of[row, col],
        }))
        if bar is not None:
            bar.update(len(batch))
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in
                             zip(COLUMNS, (str, np.int64, str, np.float32, np.int64))})
    return pd.concat(parts, ignore_index=True)


def output_format(path: str | Path) -> str:
    """``"parquet"``, ``"csv"`` or ``"tsv"`` for an output file name; an unknown suffix, or
    Parquet without pyarrow, is an error (call it before computing anything)."""
    name = Path(path).name.lower()
    if name.endswith(".parquet"):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ImportError("--out: writing Parquet needs pyarrow: pip install 'recsys[parquet]'") from None
        return "parquet"
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    if name.endswith(".tsv"):
        return "tsv"
    raise ValueError(f"--out: {path} must end in .parquet, .csv, .csv.gz or .tsv")


def write_recommendations(table: pd.DataFrame, path: str | Path) -> Path:
    """Write ``table`` as Parquet (``.parquet``) or CSV (``.csv``, ``.csv.gz``, ``.tsv``)."""
    path = Path(path)
    fmt = output_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        table.to_parquet(path, index=False)
    else:
        table.to_csv(path, index=False, sep="\t" if fmt == "tsv" else ",")
    return path
