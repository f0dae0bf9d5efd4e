"""TensorBoard logging of a run's metrics (``train.tensorboard``; needs the ``track`` extra).

Every record the trainer appends to ``metrics.jsonl`` (a training log row or a validation row,
``mi_*`` health metrics included) is mirrored as TensorBoard scalars: each numeric value under
the tag ``<split>/<key>`` (``train/loss``, ``valid/recall@50``, ``valid/mi_eff_clicks``) at the
record's ``step``. The event files go to the run directory's TensorBoard folder
(:meth:`recsys.run.RunDir.tensorboard_dir`)::

    tensorboard --logdir runs/
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from recsys.extras import install_hint
from recsys.run import RunDir


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of one metrics record: ``{"<split>/<key>": value}`` for every
    int or float value except ``step`` (training rows have no ``split``: they are ``train``)."""
    split = record.get("split", "train")
    return {
        f"{split}/{key}": float(value)
        for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class TensorBoardLog:
    """Writes metrics records into ``run``'s TensorBoard folder.

    The writer opens at the first record with ``purge_step`` = that record's step, so a resumed
    run drops the events an interrupted attempt wrote after its last checkpoint (as
    ``metrics.jsonl`` is rewound).
    """

    def __init__(self, run: RunDir) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ImportError(f"train.tensorboard needs tensorboard: {install_hint('track')}") from None
        self._writer_cls = SummaryWriter
        self._folder = run.tensorboard_dir()
        self._writer: Any = None

    def write(self, record: dict[str, Any]) -> None:
        """Add the record's scalars at its ``step``."""
        step = int(record["step"])
        if self._writer is None:
            self._writer = self._writer_cls(str(self._folder), purge_step=step)
        for tag, value in scalars(record).items():
            self._writer.add_scalar(tag, value, step)

    def close(self) -> None:
        """Flush and close the event file."""
        if self._writer is not None:
            self._writer.close()


@contextlib.contextmanager
def track_metrics(run: RunDir, tensorboard: bool) -> Iterator[None]:
    """While open, every record appended to ``run``'s metrics also goes to TensorBoard (when
    ``tensorboard``); closed (flushed) on exit, also when training raises."""
    if not tensorboard:
        yield
        return
    log = TensorBoardLog(run)
    run.metric_listeners.append(log.write)
    try:
        yield
    finally:
        run.metric_listeners.remove(log.write)
        log.close()
