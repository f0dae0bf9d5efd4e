"""Parquet files (``data.format = "parquet"``; needs pyarrow): the columns the config names, as
CSV's are, typed by the file (integral float ids read as ``3``, not ``3.0``; date-times as unix
seconds). Rows are named from 1 within their file. A folder of Parquet parts is read part by part
wherever they are, partitioned or not; out of core, record batch by record batch. Detected by
the suffix ``.parquet`` or ``.pq``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recsys.config import DataConfig
from recsys.data.errors import DataError
from recsys.data.formats.reader import Reader
from recsys.data.rows import Skipped, check_columns, from_columns, roles
from recsys.data.tables import Chunks
from recsys.extras import install_hint


class Parquet(Reader):
    name = "parquet"
    suffixes = (".parquet", ".pq")
    named_columns = True
    any_parts = True
    packed = True

    def folder(self, folder: Path, files: list[Path]) -> list[Path] | None:
        return files if len(files) > 1 and all(self.knows_name(path) for path in files) else None

    def read(self, path: Path, cfg: DataConfig, skipped: Skipped) -> pd.DataFrame:
        pq = _pyarrow_parquet(path)
        try:
            available = pq.read_schema(path).names
            raw = pd.read_parquet(path, columns=[name for name in roles(cfg).values() if name in available])
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            raise DataError(f"{path}: not a readable Parquet file ({err})") from err
        check_columns(path, cfg, available)
        return from_columns(raw, cfg, path, skipped=skipped)

    def chunks(self, path: Path, cfg: DataConfig, skipped: Skipped, rows: int) -> Chunks:
        pq = _pyarrow_parquet(path)
        try:
            parquet = pq.ParquetFile(path)
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            raise DataError(f"{path}: not a readable Parquet file ({err})") from err
        available = parquet.schema_arrow.names
        check_columns(path, cfg, available)
        columns = [name for name in roles(cfg).values() if name in available]
        size, total = path.stat().st_size, max(1, parquet.metadata.num_rows)
        float_ids = _float_ids(parquet, cfg, rows)
        row = 0
        for batch in parquet.iter_batches(batch_size=rows, columns=columns):
            raw = batch.to_pandas()
            for name, integral in float_ids.items():  # as the whole column reads: "3" or "3.0"
                raw[name] = raw[name].astype("Int64") if integral else raw[name].astype("str").where(raw[name].notna())
            df = from_columns(raw, cfg, path, first_row=row, skipped=skipped)
            row += len(raw)
            yield df, size * row // total


def _pyarrow_parquet(path: Path) -> Any:
    """``pyarrow.parquet``, or a :class:`DataError` naming ``path`` and the extra to install."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise DataError(f"{path}: reading Parquet needs pyarrow ({install_hint('parquet')})") from err
    return pq


def _float_ids(parquet: Any, cfg: DataConfig, rows: int) -> dict[str, bool]:
    """The float id columns (user, item, category) of a Parquet file -> whether every value is
    integral: the in-memory reader writes their ids as ``3`` then, else as ``3.0``; a batch alone
    cannot tell (read ``rows`` at a time)."""
    import pyarrow as pa

    schema = parquet.schema_arrow
    names = [name for role, name in roles(cfg).items() if role != "time" and name in schema.names]
    floats = [name for name in names if pa.types.is_floating(schema.field(name).type)]
    integral = dict.fromkeys(floats, True)
    for batch in parquet.iter_batches(batch_size=rows, columns=floats) if floats else ():
        for name in floats:
            values = batch.column(name).to_numpy(zero_copy_only=False)
            integral[name] &= bool(np.all(np.isnan(values) | (values == np.round(values))))
    return integral
