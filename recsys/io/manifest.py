"""A run directory's integrity: a manifest of the SHA-256 and size of every file the run writes.

``RUN/manifest.json`` maps each file's path (relative to the run directory, ``/``-separated)
to ``{"size": bytes, "sha256": hex}``. Writers record a file as they put it in place; readers
verify it before loading, so a flipped byte or a truncated checkpoint is an
:class:`IntegrityError` naming the file and what to do, never a wrong result or a traceback
from deep inside ``torch.load``.

Replacing a file and updating the manifest cannot be one atomic step, so a replacement is
announced first: :func:`replace_recorded` adds the new digest as ``"pending"`` beside the old
one, renames the file into place, then keeps only the new digest. A crash at any point leaves a
file that matches one of the digests the manifest accepts.

The manifest checks itself too: its own entry (under its own name, ``manifest.json``) holds the
SHA-256 of every other entry, so a changed byte in the manifest is reported as a damaged
manifest, never as a damaged file that it lists.

A file the manifest does not list (a run written before manifests existed, or a file added by
hand) is not checked: :func:`verify` says so, and the reader can check what the format itself
allows. The module is pure file handling: it knows nothing of checkpoints or
configs; :class:`recsys.run.RunDir` hooks it into every write and read of a run and passes the
advice that fits the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from recsys.io.files import atomic_write_text

__all__ = [
    "MANIFEST",
    "Digest",
    "IntegrityError",
    "file_digest",
    "read_manifest",
    "record",
    "record_tree",
    "replace_recorded",
    "verify",
    "verify_tree",
]

MANIFEST = "manifest.json"
_CHUNK = 1 << 20


class IntegrityError(ValueError):
    """A run file does not match its manifest entry (or cannot be read); the message names the
    file and what to do."""


@dataclass(frozen=True)
class Digest:
    """What the manifest keeps of one file."""

    size: int
    sha256: str


def file_digest(path: str | Path) -> Digest:
    """Size and SHA-256 of ``path``, read in 1 MiB chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return Digest(size, h.hexdigest())


def _key(root: Path, path: Path) -> str:
    try:
        return Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).as_posix()  # links not followed
    except ValueError:
        raise ValueError(f"{path} is not inside the run directory {root}") from None


def read_manifest(root: str | Path) -> dict[str, dict]:
    """``root``'s manifest as ``{relative path: {"size", "sha256"[, "pending"]}}`` (``{}`` when
    the run has none), checked against its own entry. A manifest that is not valid JSON, or whose
    entries do not match their recorded SHA-256, is an :class:`IntegrityError` naming it."""
    path = Path(root) / MANIFEST
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise IntegrityError(f"{path}: damaged manifest ({err}); {_DAMAGED_ADVICE}") from None
    if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
        raise IntegrityError(f"{path}: damaged manifest (not an object of file entries); {_DAMAGED_ADVICE}")
    own = entries.pop(MANIFEST, None)
    if own is not None and own.get("sha256") != _entries_digest(entries):
        raise IntegrityError(
            f"{path}: damaged manifest (its entries do not match its own SHA-256, so it cannot "
            f"tell which file changed); {_DAMAGED_ADVICE}"
        )
    return entries


_DAMAGED_ADVICE = (
    f"the run's files cannot be verified: re-train the run, or delete {MANIFEST} to read them "
    "unverified (checkpoints still get their format's own checks)"
)


def _entries_digest(entries: dict[str, dict]) -> str:
    """SHA-256 of the entries in a canonical JSON form (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(entries, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def _write_manifest(root: Path, entries: dict[str, dict]) -> None:
    own = {MANIFEST: {"sha256": _entries_digest(entries)}}
    atomic_write_text(root / MANIFEST, json.dumps({**entries, **own}, indent=2, sort_keys=True) + "\n")


def record(root: str | Path, path: str | Path, digest: Digest | None = None) -> Digest:
    """Set ``path``'s manifest entry to its current content (or to ``digest``)."""
    root, path = Path(root), Path(path)
    digest = digest or file_digest(path)
    entries = read_manifest(root)
    entries[_key(root, path)] = asdict(digest)
    _write_manifest(root, entries)
    return digest


def record_tree(root: str | Path, folder: str | Path) -> None:
    """Record every file under ``folder`` (e.g. a saved dataset) in one manifest update."""
    root = Path(root)
    entries = read_manifest(root)
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        entries[_key(root, path)] = asdict(file_digest(path))
    _write_manifest(root, entries)


def forget_tree(root: str | Path, folder: str | Path) -> None:
    """Drop every entry under ``folder`` from the manifest (before the folder is deleted: a listed
    file that is missing fails verification, an unlisted one is not checked)."""
    root = Path(root)
    prefix = _key(root, Path(folder)) + "/"
    entries = read_manifest(root)
    kept = {key: entry for key, entry in entries.items() if not key.startswith(prefix)}
    if len(kept) < len(entries):
        _write_manifest(root, kept)


def replace_recorded(tmp: str | Path, path: str | Path, root: str | Path) -> Digest:
    """``os.replace(tmp, path)`` with ``path``'s manifest entry moved to ``tmp``'s content,
    crash-safely (see the module docstring). ``tmp`` must be complete and flushed; this is the
    ``replace`` step :class:`recsys.run.RunDir` gives :func:`recsys.io.files.atomic_write`."""
    root, path = Path(root), Path(path)
    digest = file_digest(tmp)
    key = _key(root, path)
    entries = read_manifest(root)
    if key in entries:  # announce the new content; the old one stays valid until the rename
        entries[key] = {**{k: entries[key].get(k) for k in ("size", "sha256")}, "pending": asdict(digest)}
        _write_manifest(root, entries)
    os.replace(tmp, path)
    entries[key] = asdict(digest)
    _write_manifest(root, entries)
    return digest


def verify(root: str | Path, path: str | Path, advice: str, *, text: bool = False) -> bool:
    """Raise :class:`IntegrityError` when ``path`` is listed in ``root``'s manifest and is
    missing, or its size or SHA-256 differs from every digest the entry accepts; returns whether
    the manifest lists it (False: nothing was checked).

    The message is one line: the file, what is wrong, and ``advice`` (what to do about it). A
    ``text`` file (JSON a person may open) that differs is called edited: writes are atomic, so
    a shorter text file is one edited by hand, not one cut short.
    """
    root, path = Path(root), Path(path)
    entry = read_manifest(root).get(_key(root, path))
    if entry is None:
        return False
    accepted = [e for e in (entry, entry.get("pending")) if isinstance(e, dict)]
    if not path.is_file():
        raise IntegrityError(f"{path}: missing (the run's manifest lists it); {advice}")
    size = path.stat().st_size
    edited = "edited after the run wrote it"
    if all(size != e.get("size") for e in accepted):
        what = "truncated" if size < min(int(e.get("size") or 0) for e in accepted) else "changed"
        what = edited if text else what
        expected = " or ".join(f"{e.get('size')}" for e in accepted)
        raise IntegrityError(f"{path}: {what} ({size} bytes, the manifest says {expected}); {advice}")
    actual = file_digest(path).sha256
    if all(actual != e.get("sha256") for e in accepted):
        what = f"{edited} (its SHA-256 differs" if text else "corrupted (its SHA-256 differs"
        raise IntegrityError(f"{path}: {what} from the run's manifest); {advice}")
    return True


def verify_tree(root: str | Path, folder: str | Path, advice: str) -> None:
    """:func:`verify` every file the manifest lists under ``folder``."""
    root, folder = Path(root), Path(folder)
    prefix = _key(root, folder) + "/"
    for key in sorted(read_manifest(root)):
        if key.startswith(prefix):
            verify(root, root / key, advice)
