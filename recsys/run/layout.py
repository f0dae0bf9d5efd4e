"""The run directory: its file names and every read and write of them.

A run directory is self-contained::

    runs/comirec_sa-taobao-20261201-143000/
      config.json         the resolved config (plain JSON)
      dataset/            the prepared dataset with its id maps (recsys.data.Dataset.save)
      added_items/NNNN/   items added after training (`recsys index RUN --item-features FILE`), one
                          folder an addition in order, each a block of item feature rows
                          (recsys.data.features.new_items); applied on load (recsys.run.load_run)
      model.pt            resume checkpoint: a plain dict (recsys.train.checkpoint.make_checkpoint)
      best.pt             best weights so far: {"model": state_dict, ...}
      metrics.jsonl       one JSON object per line, appended during training
      test_metrics.json   final test metrics: the last file a run writes (without it, the run did not finish)
      init_from.json      a warm start's origin: the run it started from and what it carried (recsys train --init-from)
      tensorboard/        TensorBoard event files of the metrics.jsonl scalars (``train.tensorboard``)
      index/<slug>.faiss  saved ANN indexes (`recsys index`), with <slug>.json describing each
      export/<format>/    the exported network, item table and id maps (`recsys export`)
      manifest.json       SHA-256 and size of every file above except tensorboard/ and export/ (recsys.io.manifest)
      .lock               held (``flock``) by the process training the run: a run whose lock is held is live

Only this package knows these names. Every file is written atomically
(:mod:`recsys.io.files`), recorded in the manifest as it is put in place and verified against
it before it is read, so a flipped byte or a truncated file is a one-line
:class:`~recsys.io.manifest.IntegrityError` naming the file and what to do. Checkpoints load
with ``torch.load(weights_only=True)``.
Opening a run (:class:`RunDir`) never creates anything: a mistyped path fails naming it;
:meth:`RunDir.create` and :func:`new_run_dir` make new ones.

Claiming a run directory is atomic, so two processes never train into one folder. A new run's
folder is made under a temporary name with its ``.lock`` already held, then renamed into place
(the rename fails when the name is taken); an existing folder is claimed by taking its lock
without waiting. The lock is an OS file lock (``flock``): it is released when the process ends,
however it ends, so a folder whose lock is free has no live run, and one whose lock is held is
never replaced or resumed by another process (:class:`RunInUse`, naming the holder's pid).

A run that stopped before its end (interrupted, killed, out of disk space) resumes from its
last checkpoint (:meth:`RunDir.resume_hint` says how); :func:`unfinished_runs` finds the ones a
new unnamed run of the same config would otherwise start beside without a word.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import math
import os
import re
import shlex
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from glob import escape as glob_escape
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from recsys.config import Config, ConfigError
from recsys.io import IntegrityError, atomic_save, atomic_torch_save, atomic_write, atomic_write_text, manifest
from recsys.io.files import atomic_folder
from recsys.run import checks
from recsys.run.saved_config import run_config_from_dict

if TYPE_CHECKING:
    from recsys.data.features import ItemFeatures
    from recsys.data.prepare import Dataset

__all__ = ["RunDir", "RunInUse", "index_slug", "new_run_dir", "unfinished_runs"]

CONFIG = "config.json"
DATASET = "dataset"
ADDED_ITEMS = "added_items"
CHECKPOINT = "model.pt"
BEST = "best.pt"
METRICS = "metrics.jsonl"
TEST_METRICS = "test_metrics.json"
ORIGIN = "init_from.json"
INDEX = "index"
EXPORT = "export"
TENSORBOARD = "tensorboard"
MANIFEST = manifest.MANIFEST
LOCK = ".lock"

# what to do when a run file fails verification (the end of the one-line error)
ADVICE = {
    CHECKPOINT: f"the run cannot be resumed from it; its best weights ({BEST}) still evaluate and serve, "
    "or re-train the run",
    BEST: f"if {CHECKPOINT} is intact, delete {BEST} and `recsys train --resume RUN` restores it from the latest "
    "checkpoint; otherwise re-train the run",
    CONFIG: "a run's config cannot change after it trained: undo the edit (its budget changes with "
    "`recsys train --resume RUN --set train.max_steps=...`), or re-train the run",
}
REWRITE_ADVICE = "re-train the run (recsys train)"


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    raise TypeError(f"{type(value).__name__} {value!r} is not JSON serialisable")


def index_slug(factory: str) -> str:
    """A file-safe name for a FAISS factory string: ``"HNSW32,Flat"`` -> ``"HNSW32_Flat"``."""
    slug = re.sub(r"[^A-Za-z0-9.-]+", "_", factory.strip()).strip("_.")
    if not slug:
        raise ValueError(f"retrieval.factory: {factory!r} is empty")
    return slug


class RunInUse(FileExistsError):
    """The run directory is held by another live process (its ``.lock`` is taken)."""


_HELD: dict[Path, IO[str]] = {}  # run folder (resolved) -> its lock file, held by this process


@atexit.register
def _release_all() -> None:
    """Close the locks still held when the process ends (the OS would release them anyway)."""
    while _HELD:
        _HELD.popitem()[1].close()


def _take_lock(folder: Path) -> IO[str] | str:
    """Hold ``folder``'s lock for this process (re-entrant: a lock it holds already is kept), or
    the holder's pid (text) when another process holds it. Never waits."""
    key = folder.resolve()
    if key in _HELD:
        return _HELD[key]
    handle = open(folder / LOCK, "a+")  # noqa: SIM115 - held open for the run's lifetime
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        return holder
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _HELD[key] = handle
    return handle


def _in_use(folder: Path, holder: str, what: str) -> RunInUse:
    return RunInUse(f"run directory {folder} is in use by a live run (pid {holder}); {what}")


def _release(folder: str | Path) -> None:
    """Let go of ``folder``'s lock if this process holds it (the run is finished or abandoned)."""
    handle = _HELD.pop(Path(folder).resolve(), None)
    if handle is not None:
        handle.close()


def _claim_new(path: Path) -> bool:
    """Make run folder ``path`` with its lock held, atomically: built under a temporary name,
    then renamed into place. False when ``path`` already exists (nothing is left behind)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    handle = _take_lock(tmp)
    assert not isinstance(handle, str)  # a folder made just now
    try:
        os.rename(tmp, path)  # fails on an existing non-empty folder (ours always hold their lock)
    except OSError:
        _release(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        if path.exists():
            return False
        raise
    _HELD[path.resolve()] = _HELD.pop(tmp.resolve())
    return True


class RunDir:
    """One existing run directory. ``RunDir(path)`` opens it (``FileNotFoundError`` naming
    ``path`` when it is not a directory; nothing is created); :meth:`create` makes one."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"{self.path}: no such run directory")
        # called with every record appended to metrics.jsonl (e.g. recsys.train.tracking's TensorBoard writer)
        self.metric_listeners: list[Callable[[dict[str, Any]], None]] = []

    @classmethod
    def create(cls, path: str | Path) -> RunDir:
        """Create ``path`` (and its parents) if missing and open it."""
        Path(path).mkdir(parents=True, exist_ok=True)
        return cls(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def claim(self) -> None:
        """Hold the run's lock while this process trains it; :class:`RunInUse` (naming the pid)
        when another live process holds it. Released by :meth:`release` or when the process ends."""
        held = _take_lock(self.path)
        if isinstance(held, str):
            raise _in_use(self.path, held, "wait for it to finish, or stop it first")

    def release(self) -> None:
        """Let go of the run's lock if this process holds it (training ended)."""
        _release(self.path)

    def file(self, name: str | Path) -> Path:
        """Path of ``name`` inside the run directory."""
        return self.path / name

    def require_trained(self) -> None:
        """Raise ``FileNotFoundError`` naming the path unless the run has a config and best weights."""
        if not self.file(CONFIG).is_file():
            raise FileNotFoundError(f"{self.path} is not a run directory (no {CONFIG})")
        if not self.has_best():
            raise FileNotFoundError(f"{self.path} has no trained weights ({BEST}) yet")
        self.warn_if_unverified()

    # integrity ------------------------------------------------------------------------------
    def _replace(self, tmp: Path, path: Path) -> None:
        """The last step of every write: move ``tmp`` into place, recorded in the manifest."""
        manifest.replace_recorded(tmp, path, self.path)

    def save_file(self, name: str | Path, save: Callable[[Path], None]) -> None:
        """Atomically write file ``name`` of the run with ``save(tmp_path)`` (for writers that
        want a file name, e.g. a FAISS index), recorded in the manifest."""
        atomic_save(self.file(name), save, replace=self._replace)

    def verify(self, name: str | Path, advice: str | None = None, *, text: bool = False) -> bool:
        """Check file ``name`` against the run's manifest; raises
        :class:`~recsys.io.manifest.IntegrityError` ending with ``advice`` (what to do; by
        default the advice for that file) when it does not match (a ``text`` file is reported
        as edited). Returns whether the manifest lists the file (False: nothing was checked)."""
        advice = advice or ADVICE.get(str(name), REWRITE_ADVICE)
        return manifest.verify(self.path, self.file(name), advice, text=text)

    def warn_if_unverified(self) -> None:
        """Warn (one line) when the run has no manifest: it loads, but nothing is verified.

        A run without ``manifest.json`` (written before manifests existed, copied without it, or
        the file deleted) is read rather than refused: refusing would strand every such run, and
        its checkpoints still get their format's own checks. The warning says what is not
        checked, so an answer from it is never taken as verified."""
        if not self.file(MANIFEST).is_file():
            warnings.warn(
                f"{self.path} has no {MANIFEST}: its config, weights, dataset and indexes are read without "
                "SHA-256 verification (a changed or damaged file is not detected)",
                stacklevel=2,
            )

    def verify_tree(self, name: str) -> None:
        """:meth:`verify` every file the manifest lists under folder ``name`` (e.g. the dataset)."""
        manifest.verify_tree(self.path, self.file(name), ADVICE.get(name, REWRITE_ADVICE))

    # config ---------------------------------------------------------------------------------
    def save_config(self, config: Config | Mapping[str, Any]) -> None:
        """Write ``config.json`` from a ``Config`` (the resolved one a run trains with, so the file
        records what the run used: :func:`recsys.run.settings.resolve`) or a mapping of plain data
        (written as given)."""
        values = config.to_dict() if isinstance(config, Config) else dict(config)
        atomic_write_text(self.file(CONFIG), json.dumps(values, indent=2) + "\n", replace=self._replace)

    def has_config(self) -> bool:
        """Whether the run has written its ``config.json`` yet."""
        return self.file(CONFIG).is_file()

    def read_config(self) -> Config:
        """The run's config (``config.json``, verified against the manifest), with the defaults
        the run was trained under for keys added since (:func:`recsys.run.saved_config.run_config_from_dict`).

        A damaged, unreadable or invalid file is a :class:`~recsys.config.ConfigError` naming it.
        """
        path = self.file(CONFIG)
        if not path.is_file():
            raise FileNotFoundError(f"{self.path} is not a run directory (no {CONFIG})")
        try:
            values = self.read_json(CONFIG)
        except ValueError as err:  # IntegrityError or invalid JSON, already naming the file
            raise ConfigError(str(err)) from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: not a JSON object")
        try:
            return run_config_from_dict(values)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None

    # dataset --------------------------------------------------------------------------------
    def save_dataset(self, dataset: Dataset) -> None:
        """Write the prepared dataset (with its id maps) to ``dataset/``, recorded in the manifest."""
        dataset.save(self.file(DATASET))
        manifest.record_tree(self.path, self.file(DATASET))

    def load_dataset(self) -> Dataset:
        """The prepared dataset saved with the run, verified against the manifest."""
        from recsys.data.prepare import Dataset

        self.verify_tree(DATASET)
        return Dataset.load(self.file(DATASET))

    # items added after training -------------------------------------------------------------
    def added_item_folders(self) -> list[Path]:
        """The run's additions (``added_items/NNNN/``) in the order they were made. An addition
        counts once the manifest records it (:meth:`save_added_items`' last step): a folder it does
        not list was left by an addition that stopped before that, and is passed over (a run without
        a manifest counts every folder)."""
        folder = self.file(ADDED_ITEMS)
        found = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()) if folder.is_dir() else []
        if not self.file(MANIFEST).is_file():
            return found
        listed = manifest.read_manifest(self.path)
        return [p for p in found if f"{ADDED_ITEMS}/{p.name}/features.json" in listed]

    def save_added_items(self, rows: ItemFeatures) -> None:
        """Write ``rows`` (a block of new items' feature rows, :func:`recsys.data.features.new_items`)
        as the run's next addition, ``added_items/NNNN/``: the folder atomically, then its files into
        the manifest, the step that makes it count."""
        folder = self.file(ADDED_ITEMS) / f"{len(self.added_item_folders()) + 1:04d}"
        with atomic_folder(folder) as tmp:
            rows.save(tmp)
        manifest.record_tree(self.path, folder)

    def load_added_items(self) -> list[ItemFeatures]:
        """The run's additions in order (each a block of rows to append to its dataset's features),
        verified against the manifest; ``[]`` when none."""
        from recsys.data.features import ItemFeatures

        advice = f"remove the added items with `recsys index {self.path} --remove-added-items`, then add them again"
        blocks = []
        for folder in self.added_item_folders():
            manifest.verify_tree(self.path, folder, advice)
            blocks.append(ItemFeatures.load(folder))
        return blocks

    def remove_added_items(self) -> int:
        """Remove every addition (the run's catalogue is training's again); returns how many there
        were. Their manifest entries go first, so an interrupted removal leaves additions that no
        longer count rather than missing files the manifest lists."""
        removed = len(self.added_item_folders())
        self.claim()  # not while the run trains or items are being added
        try:
            manifest.forget_tree(self.path, self.file(ADDED_ITEMS))
            shutil.rmtree(self.file(ADDED_ITEMS), ignore_errors=True)
        finally:
            self.release()
        return removed

    # checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Atomically write ``model.pt`` (e.g. a dict from ``make_checkpoint``)."""
        atomic_torch_save(state, self.file(CHECKPOINT), replace=self._replace)

    def load_checkpoint(
        self, map_location: str | torch.device = "cpu", *, model: nn.Module | None = None
    ) -> dict[str, Any]:
        """``model.pt`` (raises ``FileNotFoundError`` naming the path when there is none); with
        ``model``, its weights are checked against it and loaded into it (see :meth:`load`)."""
        return self.load(CHECKPOINT, map_location, model=model)

    def checkpoint_entry(self, key: str) -> Any:
        """One plain entry of ``model.pt`` (None where it has none), read before the run loads the
        whole checkpoint: memory-mapped, so its tensors are not read (nor verified: :meth:`load_checkpoint`
        does that when the run loads it); a damaged file is :meth:`load`'s one-line error."""
        try:
            return torch.load(self.file(CHECKPOINT), map_location="cpu", weights_only=True, mmap=True).get(key)
        except Exception:
            self.load(CHECKPOINT)
            raise

    def has_checkpoint(self) -> bool:
        """Whether the run has a resume checkpoint (``model.pt``)."""
        return self.file(CHECKPOINT).exists()

    def resume_hint(self) -> str:
        """How to continue the run from its checkpoint (call it where :meth:`has_checkpoint`):
        ``its checkpoint of step N resumes it: recsys train --resume RUN``, the command ready to paste."""
        step = self.checkpoint_entry("step")
        return f"its checkpoint of step {step} resumes it: recsys train --resume {shlex.quote(str(self.path))}"

    def is_finished(self) -> bool:
        """Whether the run trained to its end and was tested (``test_metrics.json``, its last file)."""
        return self.file(TEST_METRICS).is_file()

    def require_checkpoint(self) -> None:
        """Raise ``FileNotFoundError`` naming the run unless it has a resume checkpoint.

        A run to resume must also evaluate whenever it stops, so a missing ``best.pt`` is
        restored from the checkpoint, with a warning: exactly when the checkpoint's validation was
        the best one, else with the weights it scored (its weight average where it has one;
        ``best.pt`` is rewritten as soon as a validation beats the recorded best).
        """
        if not self.has_checkpoint():
            raise FileNotFoundError(
                f"--resume: {self.path} has no checkpoint ({CHECKPOINT}): it failed or was stopped before its "
                "first validation; start a new run instead (with the same name, it replaces this folder)"
            )
        self.warn_if_unverified()
        if not self.has_best():
            self._restore_best()

    def _restore_best(self) -> None:
        ck = self.load_checkpoint()
        if ck["best"] == -math.inf:  # no validation has scored yet: there is no best to restore
            return
        # with train.ema_decay validation scored the weight average, which the checkpoint holds beside the weights
        # (a row-sparse item table keeps its own, by the same parameter name)
        averages = [ck.get(key, {}).get("weights", {}) for key in ("average", "item_rows")]
        self.save_best({**ck["model"], **averages[0], **averages[1]})
        which = (
            f"the best weights, of step {ck['step']}"
            if ck["best_step"] == ck["step"]
            else f"the weights of step {ck['step']}; the best, of step {ck['best_step']}, are lost until a "
            "validation beats them"
        )
        warnings.warn(f"{self.file(BEST)}: missing; restored from {CHECKPOINT} ({which})", stacklevel=3)

    def save_best(self, state_dict: Mapping[str, torch.Tensor], **info: Any) -> None:
        """Atomically write ``best.pt``: ``{"model": state_dict, **info}`` (e.g. step, metric)."""
        atomic_torch_save({"model": dict(state_dict), **info}, self.file(BEST), replace=self._replace)

    def has_best(self) -> bool:
        return self.file(BEST).exists()

    def load_best(
        self, map_location: str | torch.device = "cpu", *, model: nn.Module | None = None
    ) -> dict[str, torch.Tensor]:
        """The best weights (a state_dict) from ``best.pt``; with ``model``, checked against it
        and loaded into it (see :meth:`load`)."""
        return self.load(BEST, map_location, model=model)["model"]

    def load(
        self, name: str, map_location: str | torch.device = "cpu", *, model: nn.Module | None = None
    ) -> dict[str, Any]:
        """Load checkpoint file ``name`` of this run with ``torch.load(weights_only=True)``,
        after verifying it against the manifest or, where the manifest does not list it (runs
        written before manifests existed), against the archive's own CRC-32s. With ``model``, the
        checkpoint's weights (its ``"model"`` entry) must have the model's names and shapes, and
        are loaded into it.

        Every failure is an :class:`~recsys.io.manifest.IntegrityError` naming the file, what is
        wrong (truncated, corrupted, replaced by another checkpoint, weights of another model,
        unreadable) and what to do (:mod:`recsys.run.checks`)."""
        path = self.file(name)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such checkpoint in run directory {self.path}")
        advice = ADVICE.get(name, REWRITE_ADVICE)
        try:
            listed = self.verify(name)
        except IntegrityError:  # damaged, or a whole checkpoint that is not the run's own
            whole = checks.read_whole(path)
            if whole is None:
                raise
            if model is not None:
                checks.check_weights(path, model, whole.get("model", {}), advice)
            raise IntegrityError(
                f"{path}: replaced by another checkpoint (a whole file, but not the one the run's "
                f"manifest records); {advice}"
            ) from None
        if not listed:
            checks.check_archive(path, advice)
        state = checks.torch_load(path, map_location, advice)
        if (name == BEST or model is not None) and "model" not in state:
            raise IntegrityError(f"{path}: not a recsys checkpoint; {advice}")
        if model is not None:
            checks.check_weights(path, model, state["model"], advice)
            model.load_state_dict(state["model"])
        return state

    # metrics --------------------------------------------------------------------------------
    def append_metrics(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` as one JSON line to ``metrics.jsonl``.

        numpy scalars and one-element tensors are converted (the latter syncs; call it only when
        logging). The file is rewritten atomically (it is small: one line per log step), so it
        is always whole and recorded in the manifest; a partial last line left by an older
        version's interrupted append is dropped. Then each of ``metric_listeners`` is called
        with the record as written (plain JSON values).
        """
        line = json.dumps(dict(record), default=_json_default) + "\n"
        path = self.file(METRICS)
        old = path.read_bytes() if path.exists() else b""
        old = old[: old.rfind(b"\n") + 1]
        atomic_write(path, lambda out: out.write(old + line.encode("utf-8")), replace=self._replace)
        for listener in self.metric_listeners:
            listener(json.loads(line))

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every complete record of ``metrics.jsonl`` in order (``[]`` if absent), verified
        against the manifest.

        A last line without its newline (an interrupted append) is ignored; a malformed complete
        line raises ``ValueError`` naming the file and line.
        """
        path = self.file(METRICS)
        if not path.exists():
            return []
        self.verify(METRICS)
        return _parse_metrics(path)

    def rewind_metrics(self, step: int) -> list[dict[str, Any]]:
        """Keep only records with ``record["step"] <= step`` (for resuming from ``step``).

        Rewrites ``metrics.jsonl`` atomically and returns the kept records. Every record must
        carry an integer ``step``. The log is not an input of the model, so one that fails
        verification but whose complete lines all parse (a truncated copy: a torn last line) does
        not block a resume whose checkpoints are fine: its whole records are kept, with a warning.
        """
        try:
            records = self.read_metrics()
        except IntegrityError as err:
            records = _parse_metrics(self.file(METRICS))
            warnings.warn(f"{str(err).split('; ')[0]}; the resume keeps its {len(records)} whole records", stacklevel=2)
        kept = []
        for i, record in enumerate(records, start=1):
            if not isinstance(record.get("step"), int):
                raise ValueError(f"{self.file(METRICS)}: record {i} has no integer 'step': {record}")
            if record["step"] <= step:
                kept.append(record)
        text = "".join(json.dumps(record) + "\n" for record in kept)
        atomic_write_text(self.file(METRICS), text, replace=self._replace)
        return kept

    # test metrics and other JSON ------------------------------------------------------------
    def save_test_metrics(self, metrics: Mapping[str, Any]) -> None:
        """Atomically write ``test_metrics.json``."""
        self.write_json(TEST_METRICS, metrics)

    def read_test_metrics(self) -> dict[str, Any]:
        return self.read_json(TEST_METRICS)

    def save_origin(self, origin: Mapping[str, Any]) -> None:
        """Write ``init_from.json``: where a warm-started run started (the earlier run's path) and
        what it carried from it."""
        self.write_json(ORIGIN, origin)

    def read_origin(self) -> dict[str, Any] | None:
        """The run's ``init_from.json``, or None for a run that started from fresh weights."""
        return self.read_json(ORIGIN) if self.file(ORIGIN).is_file() else None

    def write_json(self, name: str, obj: Any) -> None:
        """Atomically write ``obj`` as pretty JSON to ``name`` (a path relative to the run)."""
        path = self.file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(obj, indent=2, default=_json_default) + "\n", replace=self._replace)

    def read_json(self, name: str, advice: str | None = None) -> Any:
        """JSON file ``name`` of the run, verified against the manifest (``advice`` as in
        :meth:`verify`)."""
        path = self.file(name)
        if path.exists():
            self.verify(name, advice, text=True)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: not found in run directory {self.path}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: invalid JSON: {err}") from None

    def tensorboard_dir(self) -> Path:
        """Folder of the run's TensorBoard event files (``tensorboard/``; ``train.tensorboard``)."""
        return self.file(TENSORBOARD)

    # saved indexes and exports --------------------------------------------------------------
    def index_files(self, factory: str) -> tuple[Path, Path]:
        """``(index/<slug>.faiss, index/<slug>.json)`` for ``factory`` as asked for."""
        base = self.file(INDEX) / index_slug(factory)
        return base.with_suffix(".faiss"), base.with_suffix(".json")

    def saved_index_descriptions(self) -> list[Path]:
        """The ``index/<slug>.json`` of every saved index whose ``.faiss`` is there too, the
        most recently written first."""
        folder = self.file(INDEX)
        found = [p for p in folder.glob("*.json") if p.with_suffix(".faiss").is_file()] if folder.is_dir() else []
        return sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True)

    def export_dir(self, fmt: str) -> Path:
        """Default folder of an export in format ``fmt``: ``export/<fmt>/``."""
        return self.file(EXPORT) / fmt


def _parse_metrics(path: Path) -> list[dict[str, Any]]:
    """The complete records of a metrics log (see :meth:`RunDir.read_metrics`), unverified."""
    records = []
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    for lineno, line in enumerate(lines[:-1], start=1):  # lines[-1]: "" or a partial line
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{lineno}: malformed metrics record: {err}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{lineno}: metrics record is not a JSON object")
        records.append(record)
    return records


# what a run directory holds before its first checkpoint (and the atomic writes' temporary files)
_BEFORE_CHECKPOINT = {CONFIG, DATASET, METRICS, MANIFEST, TENSORBOARD, LOCK}


def _unfinished_start(path: Path) -> bool:
    """Whether folder ``path`` holds nothing but the start of a run that never reached its
    first checkpoint (a process killed before it; empty counts too), so a new run may take it."""
    return path.is_dir() and all(
        p.name in _BEFORE_CHECKPOINT or (p.name.startswith(".") and p.name.endswith(".tmp")) for p in path.iterdir()
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.")


def _unnamed_prefix(model: str, dataset: str) -> str:
    """The start of an unnamed run's folder name, before its time: ``<model>-<dataset>``."""
    return "-".join(slug for part in (model, dataset) if (slug := _slug(part)))


def _held_by_a_live_run(folder: Path) -> bool:
    """Whether a live process holds ``folder``'s lock (probed with a shared lock, let go at once)."""
    try:
        fd = os.open(folder / LOCK, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing lets go of the probe's lock
    return False


def unfinished_runs(output_dir: str | Path, config: Config, *, model: str = "", dataset: str = "") -> list[RunDir]:
    """The unnamed runs of ``config`` under ``output_dir`` that stopped before their end with a
    checkpoint to resume from (a killed process, a restarted machine) and that no live process
    holds, the newest first: folders named as :func:`new_run_dir` names a ``model`` run on
    ``dataset``, whose ``config.json`` is ``config`` (resolved) and that have no test metrics."""
    prefix = _unnamed_prefix(model, dataset)
    folders = Path(output_dir).glob(f"{glob_escape(prefix)}-*" if prefix else "*")
    found = []
    for folder in sorted(folders, key=lambda p: p.name, reverse=True):
        run = RunDir(folder) if folder.is_dir() else None
        if run is None or not run.has_checkpoint() or run.is_finished() or _held_by_a_live_run(folder):
            continue
        try:
            same = run.read_config().to_dict() == config.to_dict()
        except (OSError, ValueError):  # not readable as a run's config: not one to offer
            continue
        if same:
            found.append(run)
    return found


def new_run_dir(
    output_dir: str | Path,
    name: str = "",
    *,
    model: str = "",
    dataset: str = "",
    exist_ok: bool = False,
) -> Path:
    """Create and claim the directory for a new run under ``output_dir`` and return its path
    (this process holds its lock from then on; see the module docstring).

    With no ``name`` it is ``<model>-<dataset>-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``, ... appended
    if taken, also when another process takes it at the same moment; characters outside
    ``[A-Za-z0-9._-]`` become ``_``). A given ``name`` that is held by a live run is
    :class:`RunInUse`; one that exists is an error unless ``exist_ok`` (to resume, open
    ``RunDir(path)`` instead), or unless it holds only the start of a run killed before its
    first checkpoint, which has nothing to resume and is replaced (with a warning).
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if name:
        path = output_dir / name
        if _claim_new(path):
            return path
        held = _take_lock(path)
        if isinstance(held, str):
            raise _in_use(path, held, "pick another name")
        if exist_ok:
            return path
        if not _unfinished_start(path):
            _release(path)
            raise FileExistsError(f"run directory {path} exists; pick another name or resume it")
        leftovers = [p for p in path.iterdir() if p.name != LOCK]
        if leftovers:
            warnings.warn(
                f"{path}: replaced: the run there stopped before its first checkpoint, so it had nothing to resume",
                stacklevel=2,
            )
        for p in leftovers:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        return path
    prefix = _unnamed_prefix(model, dataset)
    base = f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}" if prefix else time.strftime("%Y%m%d-%H%M%S")
    for i in range(1, 1000):
        path = output_dir / (base if i == 1 else f"{base}-{i}")
        if _claim_new(path):
            return path
    raise FileExistsError(f"{output_dir}: could not find a free run name starting with {base}")
