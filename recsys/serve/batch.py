"""Batch top-N for many users (``recsys recommend``): raw user ids in, a table of raw item ids out.

Each user's input is their last ``max_len`` clicks in the run's dataset (or, for
``Run.recommend(sequences=...)``, the last ``max_len`` clicks of a given sequence). Rows are processed
in batches (one model call and one index search per batch; with exact search on the GPU the
batches are queued without waiting for it and the results come back once); the output has one
row per ``(user, rank)``::

    user  rank  item  score  interest
    "17"     1  "50"  4.21          2     rank 1 = best; interest = which of the K interests found it

Users with fewer than ``n`` retrievable items get fewer rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from recsys.data.batches import gather_rows, pad_sequences
from recsys.data.ids import canonical_id
from recsys.extras import install_hint
from recsys.io import atomic_save
from recsys.progress import progress_bar
from recsys.serve.recommender import CSR, Recommendations, Recommender

__all__ = ["output_format", "read_user_file", "recommend_table", "resolve_users", "write_recommendations"]

COLUMNS = ("user", "rank", "item", "score", "interest")


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


def resolve_users(
    rec: Recommender, raw: list[str] | None, *, strict: bool = False, what: str = "--users"
) -> tuple[np.ndarray, list[str]]:
    """User indices to recommend for, and the unknown raw ids.

    ``raw = None`` means every user of the dataset. Duplicates are recommended for once (first
    occurrence kept). With ``strict``, any unknown user is an error naming ``what``.
    """
    if raw is None:
        return np.arange(rec.dataset.num_users, dtype=np.int64), []
    raw = list(dict.fromkeys(canonical_id(u) for u in raw))  # one id, one answer (recsys.data.ids)
    if strict:
        return rec.dataset.user_map.require(raw, what), []
    return rec.dataset.user_map.encode(raw)


def recommend_table(
    rec: Recommender,
    rows: np.ndarray,
    n: int,
    *,
    sequences: CSR | None = None,
    exclude_seen: bool = True,
    diversity_lambda: float = 0.0,
    batch_size: int = 1024,
    progress: bool = False,
) -> pd.DataFrame:
    """Top ``n`` for each of ``rows [R]``, as a table with columns ``user, rank, item, score,
    interest`` (one row per input row and rank, in input order).

    ``rows`` are user indices of the run's dataset (``user`` = their raw id), or, with
    ``sequences`` (CSR ``(indptr [S + 1], items)`` of internal ids, oldest first, rows
    non-empty), positions of those sequences (``user`` = the position). ``exclude_seen`` (the
    default) drops every item of the row's clicks; ``progress`` shows a bar over the rows (on a terminal).
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size: must be > 0, got {batch_size}")
    rows = np.asarray(rows, dtype=np.int64)
    ds = rec.dataset
    indptr, items = sequences if sequences is not None else (ds.indptr, ds.items)
    labels = rows if sequences is not None else ds.user_raw[rows]
    if not len(rows):
        return pd.DataFrame(
            {c: pd.Series(dtype=t) for c, t in zip(COLUMNS, (str, np.int64, str, np.float32, np.int64))}
        )
    with progress_bar(len(rows), "recommend", enabled=progress, unit="users") as bar:  # closed on errors too
        parts = []
        for start in range(0, len(rows), batch_size):  # on the GPU: queued, read back once below
            batch = rows[start : start + batch_size]
            inputs, lengths = pad_sequences(indptr, items, batch, rec.max_len)
            exclude = gather_rows(items, indptr[batch], indptr[batch + 1]) if exclude_seen else None
            parts.append(
                rec.recommend(inputs, lengths, n, exclude=exclude, diversity_lambda=diversity_lambda, on_device=True)
            )
            bar.update(len(batch))
    recs = Recommendations.concat(parts)
    row, col = np.nonzero(recs.ids > 0)
    return pd.DataFrame(
        {
            "user": labels[row],
            "rank": (col + 1).astype(np.int64),
            "item": ds.item_map.decode(recs.ids[row, col]),
            "score": recs.scores[row, col],
            "interest": recs.interest_of[row, col],
        }
    )


def output_format(path: str | Path) -> str:
    """``"parquet"``, ``"csv"`` or ``"tsv"`` for an output file name; an unknown suffix, or
    Parquet without pyarrow, is an error (call it before computing anything)."""
    name = Path(path).name.lower()
    if name.endswith(".parquet"):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ImportError(f"--out: writing Parquet needs pyarrow: {install_hint('parquet')}") from None
        return "parquet"
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    if name.endswith(".tsv"):
        return "tsv"
    raise ValueError(f"--out: {path} must end in .parquet, .csv, .csv.gz or .tsv")


def write_recommendations(table: pd.DataFrame, path: str | Path) -> Path:
    """Write ``table`` as Parquet (``.parquet``) or CSV (``.csv``, ``.csv.gz``, ``.tsv``), whole or
    not at all (:func:`recsys.io.atomic_save`: a full disk leaves no cut file, a
    :class:`~recsys.io.DiskFull` naming ``path``)."""
    path = Path(path)
    fmt = output_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        atomic_save(path, lambda tmp: table.to_parquet(tmp, index=False))
    else:  # the temporary file's name has no .gz for pandas to infer the compression from
        gz = path.name.lower().endswith(".gz")
        sep = "\t" if fmt == "tsv" else ","
        atomic_save(path, lambda tmp: table.to_csv(tmp, index=False, sep=sep, compression="gzip" if gz else None))
    return path
