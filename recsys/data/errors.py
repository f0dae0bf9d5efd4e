"""The data pipeline's error and warning, in their own module so that every reader of a source
(:mod:`recsys.data.sources`, :mod:`recsys.data.readers`) raises the same one."""

from __future__ import annotations

__all__ = ["DataError", "DataWarning"]


class DataError(ValueError):
    """Input data is missing or malformed; the message names the file (and line)."""


class DataWarning(UserWarning):
    """Something in the data the user should know: malformed rows dropped because
    ``data.skip_bad_rows`` is set, or a log that one user dominates."""
