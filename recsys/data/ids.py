"""The id rule: what makes two raw ids the same id, for every input.

A raw id is its text, exactly: case, spaces and leading zeros count (``"007"`` and ``"7"`` are
two ids), in a CSV, TSV, Parquet file, one-user-per-line file or DataFrame alike (a value that
is not text is read as ``str(value)``, so the number ``1`` and the text ``"1"`` are one id). One
exception, the same everywhere: a whole number written with a zero fraction (``17.0``,
``-3.00``) is that whole number (``17``, ``-3``). pandas writes integer ids so whenever a column
has a gap (it becomes float), so ``17`` and ``17.0`` in one log almost always mean one id, and
a CSV written from such a DataFrame must read back as the DataFrame did.

:func:`factorize_ids` applies the rule where raw ids get their codes
(:func:`recsys.data.prepare.prepare`), and :func:`canonical_id` where a raw id given later (a
request, ``Run.recommend(users=...)``) is looked up, so both sides agree. Where ids are numbered,
:func:`raw_order` and :func:`popularity_order` order them (numerically when every id is a
non-negative integer, otherwise as text), so a numbering never depends on the order of rows.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

__all__ = ["canonical_id", "canonical_ids", "factorize_ids", "popularity_order", "raw_order"]

_WHOLE = re.compile(r"(-?\d+)\.0+")
WHOLE_PATTERN = r"^(-?[0-9]+)\.0+$"  # the same rule in SQL (recsys.data.ondisk)


def canonical_id(raw: object) -> str:
    """The id ``raw`` stands for under the rule above (``str(raw)``, a zero fraction dropped)."""
    text = str(raw)
    match = _WHOLE.fullmatch(text) if "." in text else None
    return match.group(1) if match else text


def canonical_ids(names: np.ndarray) -> np.ndarray:
    """:func:`canonical_id` of each of ``names [n]`` (vectorised), as a str array."""
    text = pd.Series(np.asarray(names, dtype=str), dtype=object)
    return text.str.replace(WHOLE_PATTERN, r"\1", regex=True).to_numpy(dtype=str)


def factorize_ids(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``values [n]`` raw ids -> ``(codes [n] int64, names [m] str)``, ``names[codes[i]]`` being
    the id of ``values[i]`` under the rule above (``-1`` where a value is missing). The rule is
    applied to the distinct values only, so a billion clicks cost one pass of ``pd.factorize``."""
    codes, uniques = pd.factorize(values)
    merged, names = pd.factorize(canonical_ids(np.asarray(uniques, dtype=str)))
    codes = np.where(codes >= 0, merged[np.maximum(codes, 0)], -1) if len(merged) else codes
    return codes.astype(np.int64), np.asarray(names, dtype=str)


def popularity_order(raw: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Permutation ``[n]`` of raw ids ``[n]`` by falling ``counts [n]``, ties by raw id (:func:`raw_order`'s rule)."""
    return np.lexsort((*_raw_keys(raw), -counts))


def raw_order(raw: np.ndarray) -> np.ndarray:
    """Permutation ``[n]`` sorting raw ids ``[n]`` (str) numerically when all are non-negative
    integers, otherwise as text."""
    return np.lexsort(_raw_keys(raw))


def _raw_keys(raw: np.ndarray) -> tuple[np.ndarray, ...]:
    """``np.lexsort`` keys ordering raw ids numerically when all are non-negative integers
    (by length, then text), otherwise as text."""
    if len(raw) and np.char.isdigit(raw).all():
        return raw, np.char.str_len(raw)
    return (raw,)
