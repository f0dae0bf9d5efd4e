"""Progress bars for long work (evaluation, index builds, batch recommendations, data preparation).

One helper, :func:`progress_bar`, so every bar looks and behaves the same: it draws on stderr
only when asked (``enabled``; the CLI's ``--quiet`` turns it off) and only when stderr is a
terminal (tqdm's ``disable=None``), so logs, pipes and notebooks' captured output stay clean.

tqdm is a core dependency, not an extra: the commands that need bars are core commands (the
default install is the one whose minutes-long ``evaluate`` printed nothing), it is pure Python
with no dependencies of its own, and it replaces a hand-written progress line.
"""

from __future__ import annotations

import sys

from tqdm import tqdm

__all__ = ["progress_bar"]


def progress_bar(total: int, desc: str, *, enabled: bool = True, unit: str = "it") -> tqdm:
    """A tqdm bar over ``total`` units; call ``.update(n)`` and close it (or use ``with``).

    Disabled (every call a no-op) unless ``enabled`` and stderr is a terminal.
    """
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        dynamic_ncols=True,
        disable=None if enabled else True,
        file=sys.stderr,
        leave=False,
    )
