"""``recsys data fetch NAME``: download (or take by hand), verify, convert a registered dataset.

Layout under the data root (``recsys.data.registry.data_root()`` or ``--dest``)::

    NAME/raw/<file>          the downloaded files (``<file>.part`` while incomplete)
    NAME/clicks.csv, ...     the prepared files the dataset's config reads
    NAME/prepared.json       written last: the counts and each raw file's SHA-256

Downloads go through pooch (cache folder, hash check, temporary file removed on a mismatch)
with :class:`ResumableDownloader` (requests + tqdm): a cut connection leaves ``<file>.part``
and the next fetch asks the server for the rest with an HTTP ``Range`` request.
Needs the ``data`` extra (``pip install 'multi-interest-recsys[data]'``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from recsys.data.convert import convert
from recsys.data.readers import DataError
from recsys.data.registry import PREPARED_MARKER, REGISTRY_DIR, DatasetEntry, DatasetFile, data_root, entry
from recsys.extras import install_hint
from recsys.io import atomic_write_text, naming_full_disk


class FetchError(DataError):
    """A dataset could not be obtained or verified; the message says what to do instead."""


CHUNK = 1 << 16  # bytes per write; a cut connection loses at most the chunk being read


class ResumableDownloader:
    """A pooch downloader that keeps partial data in ``part`` across failures and resumes
    with a ``Range`` request (a server that ignores it sends the whole file again)."""

    def __init__(self, part: Path, *, progress: bool = True, timeout: float = 60.0) -> None:
        self.part, self.progress, self.timeout = part, progress, timeout

    def __call__(self, url: str, output_file: str, pooch: object, check_only: bool = False) -> None:
        import requests
        from tqdm.auto import tqdm

        done = self.part.stat().st_size if self.part.exists() else 0
        headers = {"Range": f"bytes={done}-"} if done else {}
        with requests.get(url, headers=headers, stream=True, timeout=self.timeout) as response:
            complete = done > 0 and response.status_code == 416  # the part already holds it all
            if not complete:
                response.raise_for_status()
                append = done > 0 and response.status_code == 206
                done = done if append else 0
                total = done + int(response.headers.get("Content-Length", 0)) or None
                with (
                    self.part.open("ab" if append else "wb") as out,
                    tqdm(
                        total=total,
                        initial=done,
                        unit="B",
                        unit_scale=True,
                        unit_divisor=1024,
                        desc=self.part.name.removesuffix(".part"),
                        disable=not self.progress,
                    ) as bar,
                ):
                    for chunk in response.iter_content(chunk_size=CHUNK):
                        out.write(chunk)
                        bar.update(len(chunk))
        shutil.move(str(self.part), output_file)


def _pooch() -> ModuleType:
    try:
        import pooch
    except ImportError:
        raise FetchError(f"recsys data fetch needs the data extra: {install_hint('data')}") from None
    return pooch


def sha256(path: Path) -> str:
    return _pooch().file_hash(str(path), alg="sha256")


def _verify(spec: DatasetFile, path: Path) -> str | None:
    """Why ``path`` is not ``spec``'s file (checksum, else size when no checksum is known), or None."""
    if spec.known_hash:
        alg, expected = spec.known_hash.split(":")
        actual = _pooch().file_hash(str(path), alg=alg)
        return None if actual == expected else f"{alg} {actual}, expected {expected}"
    if spec.size and path.stat().st_size != spec.size:
        return f"{path.stat().st_size:,} bytes, expected {spec.size:,}"
    return None


def _download(spec: DatasetFile, raw: Path, name: str, progress: bool, log: Callable[[str], None]) -> Path:
    """Download ``spec`` into ``raw`` from its URL or, when that cannot be reached, its
    mirrors (resuming a ``.part``), verified; errors say what to do instead."""
    pooch = _pooch()  # first: without the data extra, say which extra (requests comes with it)
    import requests

    pooch.get_logger().setLevel("WARNING")
    instead = f"download it by hand and run `recsys data fetch {name} --from FILE`"
    part = raw / f"{spec.name}.part"
    failures = []
    for url in (spec.url, *spec.mirrors):
        log(f"downloading {url}")
        try:
            path = Path(
                pooch.retrieve(
                    url,
                    spec.known_hash,
                    fname=spec.name,
                    path=raw,
                    downloader=ResumableDownloader(part, progress=progress),
                )
            )
            break
        except requests.exceptions.RequestException as err:
            failures.append(f"cannot download {url}: {type(err).__name__}: {_first_line(err)}")
        except ValueError as err:  # pooch: hash mismatch; its temporary file is already deleted
            raise FetchError(
                f"checksum mismatch for {url}: {_first_line(err)}; the bad download was deleted; try again or {instead}"
            ) from None
    else:
        kept = " (the partial download is kept and resumed next time)" if part.exists() else ""
        raise FetchError("; ".join(failures) + f"{kept}; offline? {instead}")
    problem = _verify(spec, path) if not spec.known_hash else None
    if problem:
        path.unlink()
        raise FetchError(f"{url}: the downloaded file has {problem}; the bad download was deleted")
    return path


def _first_line(err: Exception) -> str:
    return " ".join(str(err).split())[:300]


def _obtain(
    spec: DatasetFile, raw: Path, given: Path | None, e: DatasetEntry, progress: bool, log: Callable[[str], None]
) -> Path:
    """The verified raw file: ``given`` (``--from``), else the one in ``raw``, else downloaded."""
    if given is not None:
        if not given.is_file():
            raise FetchError(f"--from {given}: no such file")
        problem = _verify(spec, given)
        if problem:
            raise FetchError(f"--from {given}: has {problem}; is it {spec.name} of {e.homepage}?")
        return given
    path = raw / spec.name
    if path.is_file():
        problem = _verify(spec, path)
        if problem is None:
            return path
        path.unlink()
        log(f"{path}: has {problem}; deleted")
    if not spec.url:
        raise FetchError(
            f"{e.name} needs {spec.name} downloaded by hand (its host needs a login): {spec.manual}; "
            f"put it at {path} or run `recsys data fetch {e.name} --from FILE`"
        )
    return _download(spec, raw, e.name, progress, log)


def _match_given(e: DatasetEntry, given: list[Path]) -> dict[str, Path]:
    """``--from`` files by registry file name: by their own name, or the only file of a
    one-file dataset whatever its name."""
    if len(e.files) == 1 and len(given) == 1:
        return {e.files[0].name: given[0]}
    names = {f.name for f in e.files}
    unknown = [str(p) for p in given if p.name not in names]
    if unknown:
        raise FetchError(f"--from {', '.join(unknown)}: {e.name} expects files named {', '.join(sorted(names))}")
    return {p.name: p for p in given}


def fetch(
    name: str,
    *,
    dest: str | Path | None = None,
    sources: list[str | Path] | None = None,
    force: bool = False,
    progress: bool = True,
    registry_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Obtain, verify and convert dataset ``name``; returns its prepared folder.

    ``dest`` replaces the data root; ``sources`` are files downloaded by hand (``--from``);
    an already prepared dataset is left alone unless ``force`` or ``sources`` is given;
    ``registry_dir`` replaces the packaged registry (:data:`recsys.data.registry.REGISTRY_DIR`).
    """
    e = entry(name, registry_dir or REGISTRY_DIR)
    folder = Path(dest) / name if dest else data_root() / name
    marker = folder / PREPARED_MARKER
    if marker.is_file() and not force and not sources:
        log(f"{name}: already prepared in {folder} (--force prepares it again)")
        return folder
    given = _match_given(e, [Path(p) for p in sources or []])
    raw = folder / "raw"
    with naming_full_disk(folder, "free some space and run it again (a download resumes where it stopped)"):
        raw.mkdir(parents=True, exist_ok=True)
        files = [_obtain(spec, raw, given.get(spec.name), e, progress, log) for spec in e.files]
        digests = {}
        for spec, path in zip(e.files, files):
            digests[spec.name] = sha256(path)
            if not spec.sha256:
                log(f"{spec.name}: sha256 {digests[spec.name]} (not in the registry: record it in {e.config.name})")
        log(f"converting {name} ({e.convert}) into {folder}")
        marker.unlink(missing_ok=True)
        counts = convert(e.convert, files, folder)
        atomic_write_text(marker, json.dumps({"name": name, "sha256": digests, "counts": counts}, indent=2) + "\n")
    log(summary(e, counts))
    where = f"RECSYS_DATA_DIR={Path(dest)} " if dest else ""  # fetched outside the data root
    log(f"train with: {where}recsys train --config {e.config}")
    return folder


def summary(e: DatasetEntry, counts: dict[str, int]) -> str:
    """One line of counts, each compared with the owner's published raw count where there is one."""
    parts = []
    for key, value in counts.items():
        note = ""
        if key in e.published:
            note = " (as published)" if e.published[key] == value else f" (published: {e.published[key]:,})"
        parts.append(f"{value:,} {key.replace('_', ' ')}{note}")
    return f"{e.name}: " + ", ".join(parts)
