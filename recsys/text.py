"""How messages write a count: ``1 user``, ``2 users``, ``1,000 clicks``.

One helper, so every message, log line and error agrees in number ("1 users" read as a bug to the
first person who saw it) and writes large counts with thousands separators.
"""

from __future__ import annotations

__all__ = ["count"]


def count(n: int, noun: str, plural: str = "") -> str:
    """``n`` and ``noun`` in agreement: ``count(1, "user")`` is ``"1 user"``, ``count(1200, "user")``
    ``"1,200 users"``; ``plural`` where adding an ``s`` is wrong (``count(2, "process", "processes")``)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
