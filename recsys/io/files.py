"""Atomic file writes: the one helper every file of recsys goes through.

A file is written to a temporary file in the same directory, flushed and ``fsync``-ed to disk,
then renamed over the target (``os.replace``), so a crash leaves either the old file or the
new one, never half of one. Every file gets the mode a plain ``open`` would give it
(:func:`default_file_mode`), checkpoints and metrics alike. A run directory passes ``replace``
(:func:`recsys.io.manifest.replace_recorded`) so the rename also records the file's digest in
the run's manifest. This module imports nothing else of recsys, so the data pipeline
(:meth:`recsys.data.Dataset.save`) uses it too.

A write that finds the disk (or the account's quota) full is a :class:`DiskFull`: one line naming
the file or folder being written, whatever the writer wrapped the system's error in (torch's zip
writer raises a ``RuntimeError``, DuckDB an ``IOException``); the target keeps its old content and
no temporary file stays.

Checkpoints hold only tensors and Python primitives and load with
``torch.load(weights_only=True)``; :func:`check_plain` enforces that at save time.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = [
    "DiskFull",
    "atomic_folder",
    "atomic_save",
    "atomic_torch_save",
    "atomic_write",
    "atomic_write_text",
    "check_plain",
    "default_file_mode",
    "full_disk",
    "link_or_copy",
    "naming_full_disk",
    "one_at_a_time",
    "save_npy",
]

Replace = Callable[[Path, Path], None]  # (complete temporary file, target): move it into place

# what a write that found no room fails with: the disk is full, or the account's quota is spent
NO_ROOM = {errno.ENOSPC: "no space left on device"} | (
    {errno.EDQUOT: "disk quota exceeded"} if hasattr(errno, "EDQUOT") else {}  # EDQUOT: not on Windows
)
RUN_AGAIN = "free some space and run it again"


class DiskFull(OSError):
    """A write found no room (``errno`` ENOSPC or EDQUOT): ``filename`` is the file or folder being
    written and ``advice`` what to do; ``str()`` is the one line ``PATH: no space left on device; ADVICE``.

    Made by :func:`full_disk` (it keeps OSError's own constructor, so the error pickles across
    processes, e.g. from a ``recsys tune --jobs`` worker)."""

    advice: str = RUN_AGAIN

    def __str__(self) -> str:
        where = f"{self.filename}: " if self.filename else ""
        return f"{where}{NO_ROOM.get(self.errno or 0, self.strerror)}; {self.advice}"


def full_disk(err: BaseException, path: str | Path | None = None, advice: str | None = None) -> DiskFull | None:
    """``err`` as a :class:`DiskFull` when it, or an error it was raised from, is a write that found
    no room; else None.

    Writers wrap the system's error: torch's zip writer raises a ``RuntimeError`` whose context is
    the ``OSError``, DuckDB an ``IOException`` that carries only the system's message, so both the
    chain and the messages are read. The path named is the innermost :class:`DiskFull`'s (the file
    that was being written), else ``path``, else the ``OSError``'s own file name; ``advice``
    replaces the advice (default: a DiskFull's own, else :data:`RUN_AGAIN`). A DiskFull that
    changes in nothing is returned as it is."""
    code, inner, named = None, None, None
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, DiskFull):
            inner = inner or cause
        if isinstance(cause, OSError) and cause.errno in NO_ROOM:
            code, named = code or cause.errno, named or cause.filename
        elif isinstance(cause, Exception) and code is None:  # not KeyboardInterrupt, whose text means nothing
            code = next((c for c in NO_ROOM if os.strerror(c) in str(cause)), None)
        cause = cause.__cause__ or cause.__context__
    if code is None:
        return None
    if isinstance(err, DiskFull) and advice in (None, err.advice):
        return err
    where = inner.filename if inner is not None else path if path is not None else named
    full = DiskFull(code, os.strerror(code), None if where is None else str(where))
    full.advice = advice if advice is not None else inner.advice if inner is not None else RUN_AGAIN
    return full


@contextmanager
def naming_full_disk(path: str | Path, advice: str | None = None) -> Iterator[None]:
    """Inside the block, a write that finds no room becomes a :class:`DiskFull` naming ``path``
    (see :func:`full_disk`); every other error passes unchanged."""
    try:
        yield
    except BaseException as err:
        full = full_disk(err, path, advice)
        if full is None or full is err:
            raise
        raise full from err


def default_file_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file (0666 minus the umask).

    Run files hold no secrets and are read by other accounts (a service, a CI job), so every
    file gets this mode; the run directory's own permissions restrict access."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_save(path: str | Path, save: Callable[[Path], object], *, replace: Replace = os.replace) -> None:
    """Call ``save(tmp)`` with a temporary path next to ``path`` (for writers that want a file
    name, e.g. FAISS; what it returns is ignored), flush it to disk, then ``replace(tmp, path)`` (a rename by default).

    If anything raises, the temporary file is removed and ``path`` keeps its old content; a full
    disk is a :class:`DiskFull` naming ``path``.
    """
    path = Path(path)
    with naming_full_disk(path):
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        tmp = Path(name)
        try:
            save(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(tmp, default_file_mode())  # mkstemp creates 0600
            replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


@contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path`` to write into; when the block ends without
    an error its files are flushed to disk and the folder is renamed to ``path`` (an old ``path``
    is moved aside first, then removed). On an error the temporary folder is removed (a full disk,
    in the block too, is a :class:`DiskFull` naming ``path``); after a killed process it stays under
    a name no reader opens (``.NAME.tmp-PID``) until the next :func:`atomic_folder` for ``path``
    removes it."""
    path = Path(path)
    with naming_full_disk(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(path)
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            yield tmp
            for file in tmp.rglob("*"):  # a saved dataset's features/ folder too
                if file.is_file():
                    with open(file, "rb+") as f:
                        os.fsync(f.fileno())
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            if path.exists():
                os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


@contextmanager
def one_at_a_time(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (a folder or file yet to be published) inside the block:
    a second process entering it for the same ``path`` (another rank of a torchrun job, a run
    started beside this one) waits until the first leaves, and then finds what it published.

    The lock is ``flock`` on ``.NAME.lock`` beside ``path``, removed on leaving (so it leaves
    nothing behind; a waiter that then holds a removed file locks the new one). A process that
    dies releases its lock. Where ``fcntl`` does not exist (Windows) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.parent / f".{path.name}.lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, default_file_mode())
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # its holder removed it on leaving: lock the file there now
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


def _remove_abandoned(path: Path) -> None:
    """Remove the temporary folders of ``path`` left by processes that no longer run."""
    for leftover in [*path.parent.glob(f".{path.name}.tmp-*"), *path.parent.glob(f".{path.name}.old-*")]:
        pid = leftover.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another account's process
    return True


class _PythonWrites:
    """A file numpy writes through ``write`` (it calls ``tofile`` on a real file object)."""

    def __init__(self, file: IO[bytes]) -> None:
        self.write = file.write


def save_npy(path: str | Path, array: Any) -> None:
    """``np.save(path, array, allow_pickle=False)``, in pieces of 16 MiB through Python's ``write``,
    so a full disk is an ``OSError`` with its errno (a :class:`DiskFull` in the atomic writers):
    numpy's own ``tofile`` reported it as "8016 requested and 2016 written" on a full tmpfs, and
    not at all on ``/dev/full``."""
    import numpy as np  # here, not at the top: the command line starts without numpy

    with open(path, "wb") as f:
        np.save(_PythonWrites(f), array, allow_pickle=False)


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` as ``dst`` (no copy: for files that are never changed in place), or copy
    it where a link cannot be made (another file system)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], object], *, replace: Replace = os.replace) -> None:
    """Call ``write(f)`` on a temporary binary file next to ``path`` (what it returns is ignored),
    then move it to ``path`` (as :func:`atomic_save`)."""

    def save(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            write(f)

    atomic_save(path, save, replace=replace)


def atomic_write_text(path: str | Path, text: str, *, replace: Replace = os.replace) -> None:
    """Atomically replace ``path`` with ``text`` (UTF-8)."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")), replace=replace)


def atomic_torch_save(obj: Any, path: str | Path, *, replace: Replace = os.replace) -> None:
    """Atomically ``torch.save`` ``obj`` to ``path``, after :func:`check_plain`."""
    import torch  # here, not at the top: the data pipeline writes files without loading torch

    check_plain(obj)
    atomic_write(path, lambda f: torch.save(obj, f), replace=replace)


_PRIMITIVES = (str, int, float, bool, type(None))


def check_plain(obj: Any, where: str = "checkpoint") -> None:
    """Raise ``TypeError`` naming the key path of the first value ``weights_only`` cannot load.

    Allowed: tensors, ``torch.dtype``/``torch.Size``, ``str``/``int``/``float``/``bool``/``None``,
    and dicts (with primitive keys), lists and tuples of these. numpy values are not allowed.
    """
    import torch

    # exact types: numpy scalars subclass float/int but do not load under weights_only
    if type(obj) in _PRIMITIVES or isinstance(obj, (torch.Tensor, torch.dtype, torch.Size)):
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            if type(key) not in _PRIMITIVES:
                raise TypeError(f"{where}: key {key!r} of type {type(key).__name__} is not plain")
            check_plain(value, f"{where}[{key!r}]")
        return
    if isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            check_plain(value, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where}: {type(obj).__name__} does not load with torch.load(weights_only=True); "
        "convert it to a tensor or a Python primitive"
    )
