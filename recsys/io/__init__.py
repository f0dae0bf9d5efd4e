"""The ground floor for files: every module that writes a file goes through here.

- :mod:`recsys.io.files`: atomic writes (temporary file, fsync, rename), a full disk as one
  :class:`~recsys.io.files.DiskFull` line naming the path, and the check that a checkpoint loads
  with ``torch.load(weights_only=True)``;
- :mod:`recsys.io.manifest`: the SHA-256 and size of every file of a directory, recorded on
  write and verified on read (:class:`~recsys.io.manifest.IntegrityError`).

It imports nothing else of recsys, so the data pipeline and the run directory use it alike.
"""

from recsys.io.files import (
    DiskFull,
    atomic_save,
    atomic_torch_save,
    atomic_write,
    atomic_write_text,
    check_plain,
    default_file_mode,
    full_disk,
    naming_full_disk,
)
from recsys.io.manifest import IntegrityError

__all__ = [
    "DiskFull",
    "IntegrityError",
    "atomic_save",
    "atomic_torch_save",
    "atomic_write",
    "atomic_write_text",
    "check_plain",
    "default_file_mode",
    "full_disk",
    "naming_full_disk",
]
