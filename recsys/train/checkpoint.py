"""The run directory: checkpoints, config, metrics log, test metrics; every write atomic.

A run directory is self-contained::

    runs/comirec_sa-taobao-20261201-143000/
      config.json         the resolved config (plain JSON; read back with run_config_from_dict)
      model.pt            resume checkpoint: a plain dict (see make_checkpoint)
      best.pt             best weights so far: {"model": state_dict, ...}
      metrics.jsonl       one JSON object per line, appended during training
      test_metrics.json   final test metrics
      manifest.json       SHA-256 and size of every file above (and of dataset/ and index/)

Files are written to a temporary file in the same directory, flushed to disk and renamed over
the target (``os.replace``), so a crash leaves either the old file or the new one, never half of
one. Every file written through :class:`RunDir` is recorded in the run's manifest
(:mod:`recsys.integrity`) and verified when it is loaded; all get the mode a plain ``open``
would give them (0666 minus the umask). Checkpoints hold only tensors and Python primitives and load with
``torch.load(weights_only=True)``; :func:`check_plain` enforces that at save time.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import nn

from recsys import integrity
from recsys.train.distributed import unwrap_model

CHECKPOINT = "model.pt"
BEST = "best.pt"
CONFIG = "config.json"
METRICS = "metrics.jsonl"
TEST_METRICS = "test_metrics.json"
DATASET = "dataset"

# what to do when a run file fails verification (appended to the one-line error)
ADVICE = {
    CHECKPOINT: "the run cannot be resumed from it; its best weights (best.pt) still evaluate and serve, "
                "or re-train the run",
    BEST: "if model.pt is intact, `recsys train --resume RUN` continues from the latest checkpoint "
          "(best.pt is rewritten at the next improvement); otherwise re-train the run",
}
REWRITE_ADVICE = "re-train the run (recsys train)"



def atomic_write(path: str | Path, write: Callable[[IO[bytes]], None], *, root: str | Path | None = None) -> None:
    """Call ``write(f)`` on a temporary binary file next to ``path``, then rename it to ``path``.

    If ``write`` raises, the temporary file is removed and ``path`` keeps its old content.
    With ``root`` (a run directory), ``path`` is recorded in that run's manifest.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, integrity.default_file_mode())  # mkstemp creates 0600
        if root is None:
            os.replace(tmp, path)
        else:
            integrity.replace_recorded(tmp, path, root)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str, *, root: str | Path | None = None) -> None:
    """Atomically replace ``path`` with ``text`` (UTF-8); ``root`` as in :func:`atomic_write`."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")), root=root)


def atomic_torch_save(obj: Any, path: str | Path, *, root: str | Path | None = None) -> None:
    """Atomically ``torch.save`` ``obj`` to ``path``, after :func:`check_plain`."""
    check_plain(obj)
    atomic_write(path, lambda f: torch.save(obj, f), root=root)


_PRIMITIVES = (str, int, float, bool, type(None))


def check_plain(obj: Any, where: str = "checkpoint") -> None:
    """Raise ``TypeError`` naming the key path of the first value ``weights_only`` cannot load.

    Allowed: tensors, ``torch.dtype``/``torch.Size``, ``str``/``int``/``float``/``bool``/``None``,
    and dicts (with primitive keys), lists and tuples of these. numpy values are not allowed.
    """
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


def _plain(obj: Any) -> Any:
    """numpy arrays/scalars inside nested dicts/lists -> lists/Python scalars."""
    if isinstance(obj, dict):
        return {key: _plain(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(value) for value in obj]
    if isinstance(obj, (np.ndarray, np.generic)):
        return obj.tolist()
    return obj


def capture_rng(
    numpy_generators: Mapping[str, np.random.Generator] | None = None,
    torch_generators: Mapping[str, torch.Generator] | None = None,
) -> dict[str, Any]:
    """Every random state a resumed run needs, as plain data.

    Captures torch's global CPU generator, every CUDA device's generator (when CUDA is
    available), and the named generators: ``torch_generators`` (e.g. the negative sampler's, on
    any device) and ``numpy_generators`` (e.g. the training-batch sampler's ``rng``). Restore
    with :func:`restore_rng` and the same names.
    """
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "torch_generators": {name: g.get_state() for name, g in (torch_generators or {}).items()},
        "numpy_generators": {
            name: _plain(g.bit_generator.state) for name, g in (numpy_generators or {}).items()
        },
    }


def _check_names(kind: str, saved: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    if set(saved) != set(given):
        raise KeyError(f"rng state: saved {kind} {sorted(saved)} but asked to restore {sorted(given)}")


def restore_rng(
    state: Mapping[str, Any],
    numpy_generators: Mapping[str, np.random.Generator] | None = None,
    torch_generators: Mapping[str, torch.Generator] | None = None,
) -> None:
    """Put back the states captured by :func:`capture_rng` (same generator names)."""
    numpy_generators, torch_generators = numpy_generators or {}, torch_generators or {}
    _check_names("numpy generators", state["numpy_generators"], numpy_generators)
    _check_names("torch generators", state["torch_generators"], torch_generators)
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    for name, g in torch_generators.items():
        g.set_state(state["torch_generators"][name])
    for name, g in numpy_generators.items():
        g.bit_generator.state = state["numpy_generators"][name]


def make_checkpoint(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    best: float,
    best_step: int,
    bad_evals: int,
    rng: dict[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """The resume checkpoint as a plain dict.

    Keys: ``model`` (state_dict of the unwrapped model, no DDP/compile prefixes), ``optimizer``
    (state_dict), ``step`` (optimizer steps done), ``best`` (best validation metric so far,
    ``-inf`` before the first evaluation), ``best_step``, ``bad_evals`` (evaluations since the
    last improvement: the early-stopping counter), ``rng`` (:func:`capture_rng`), and any plain
    ``extra`` entries.
    """
    state = {
        "model": unwrap_model(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": int(step),
        "best": float(best),
        "best_step": int(best_step),
        "bad_evals": int(bad_evals),
        "rng": rng,
        **extra,
    }
    check_plain(state)
    return state


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    raise TypeError(f"{type(value).__name__} {value!r} is not JSON serialisable")


class RunDir:
    """One run's directory (created if missing). File names are the module's constants."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def file(self, name: str) -> Path:
        """Path of ``name`` inside the run directory."""
        return self.path / name

    # config ---------------------------------------------------------------------------------
    def save_config(self, config: Any) -> None:
        """Write ``config.json`` from a mapping or an object with ``to_dict()`` (a ``Config``)."""
        values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        atomic_write_text(self.file(CONFIG), json.dumps(values, indent=2) + "\n", root=self.path)

    def read_config(self) -> dict[str, Any]:
        """``config.json`` as nested plain data (feed it to ``recsys.config.run_config_from_dict``)."""
        return self.read_json(CONFIG)

    # checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Atomically write ``model.pt`` (e.g. a dict from :func:`make_checkpoint`)."""
        atomic_torch_save(state, self.file(CHECKPOINT), root=self.path)

    def load_checkpoint(self, map_location: str | torch.device = "cpu") -> dict[str, Any]:
        """``model.pt`` (raises ``FileNotFoundError`` naming the path when there is none)."""
        return self.load(CHECKPOINT, map_location)

    def latest(self, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
        """The resume checkpoint (``model.pt``), or ``None`` when the run has none yet."""
        if not self.file(CHECKPOINT).exists():
            return None
        return self.load(CHECKPOINT, map_location)

    def save_best(self, state_dict: Mapping[str, torch.Tensor], **info: Any) -> None:
        """Atomically write ``best.pt``: ``{"model": state_dict, **info}`` (e.g. step, metric)."""
        atomic_torch_save({"model": dict(state_dict), **info}, self.file(BEST), root=self.path)

    def has_best(self) -> bool:
        return self.file(BEST).exists()

    def load_best(self, map_location: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """The best weights (a state_dict) from ``best.pt``."""
        return self.load(BEST, map_location)["model"]

    def load(self, name: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
        """Load checkpoint file ``name`` of this run with ``torch.load(weights_only=True)``,
        after verifying it against the manifest. A file that fails verification or that torch
        cannot read is an :class:`~recsys.integrity.IntegrityError` naming it."""
        path = self.file(name)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such checkpoint in run directory {self.path}")
        advice = ADVICE.get(name, REWRITE_ADVICE)
        self.verify(name)
        try:
            state = torch.load(path, map_location=map_location, weights_only=True)
        except Exception as err:  # truncated zip, bad pickle opcode, ...: all mean "damaged"
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise integrity.IntegrityError(f"{path}: cannot be read ({reason[:200]}); {advice}") from None
        if not isinstance(state, dict) or (name == BEST and "model" not in state):
            raise integrity.IntegrityError(f"{path}: not a recsys checkpoint; {advice}")
        return state

    # integrity ------------------------------------------------------------------------------
    def verify(self, name: str) -> None:
        """Check file ``name`` (relative to the run) against the run's manifest; raises
        :class:`~recsys.integrity.IntegrityError` with what to do when it does not match."""
        integrity.verify(self.path, self.file(name), ADVICE.get(name, REWRITE_ADVICE))

    def verify_tree(self, name: str) -> None:
        """:meth:`verify` every file the manifest lists under folder ``name`` (e.g. the dataset)."""
        integrity.verify_tree(self.path, self.file(name), ADVICE.get(name, REWRITE_ADVICE))

    def record_tree(self, name: str) -> None:
        """Record every file under folder ``name`` (written by someone else, e.g. the dataset)."""
        integrity.record_tree(self.path, self.file(name))

    # metrics --------------------------------------------------------------------------------
    def append_metrics(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` as one JSON line to ``metrics.jsonl``.

        numpy scalars and one-element tensors are converted (the latter syncs; call it only when
        logging). The file is rewritten atomically (it is small: one line per log step), so it
        is always whole and recorded in the manifest; a partial last line left by an older
        version's interrupted append is dropped.
        """
        line = json.dumps(dict(record), default=_json_default) + "\n"
        path = self.file(METRICS)
        old = path.read_bytes() if path.exists() else b""
        old = old[: old.rfind(b"\n") + 1]
        atomic_write(path, lambda out: out.write(old + line.encode("utf-8")), root=self.path)

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
        records = []
        lines = path.read_text(encoding="utf-8").split("\n")
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

    def rewind_metrics(self, step: int) -> list[dict[str, Any]]:
        """Keep only records with ``record["step"] <= step`` (for resuming from ``step``).

        Rewrites ``metrics.jsonl`` atomically and returns the kept records. Every record must
        carry an integer ``step``.
        """
        kept = []
        for i, record in enumerate(self.read_metrics(), start=1):
            if not isinstance(record.get("step"), int):
                raise ValueError(f"{self.file(METRICS)}: record {i} has no integer 'step': {record}")
            if record["step"] <= step:
                kept.append(record)
        text = "".join(json.dumps(record) + "\n" for record in kept)
        atomic_write_text(self.file(METRICS), text, root=self.path)
        return kept

    # test metrics and other JSON ------------------------------------------------------------
    def save_test_metrics(self, metrics: Mapping[str, Any]) -> None:
        """Atomically write ``test_metrics.json``."""
        self.write_json(TEST_METRICS, metrics)

    def read_test_metrics(self) -> dict[str, Any]:
        return self.read_json(TEST_METRICS)

    def write_json(self, name: str, obj: Any) -> None:
        """Atomically write ``obj`` as pretty JSON to ``name`` in the run directory."""
        atomic_write_text(self.file(name), json.dumps(obj, indent=2, default=_json_default) + "\n", root=self.path)

    def read_json(self, name: str) -> Any:
        """JSON file ``name`` of the run, verified against the manifest."""
        path = self.file(name)
        if path.exists():
            self.verify(name)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: not found in run directory {self.path}") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: invalid JSON: {err}") from None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.")


def new_run_dir(
    output_dir: str | Path,
    name: str = "",
    *,
    model: str = "",
    dataset: str = "",
    exist_ok: bool = False,
) -> Path:
    """Create the directory for a new run under ``output_dir`` and return its path.

    With no ``name`` it is ``<model>-<dataset>-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``, ... appended
    if taken; characters outside ``[A-Za-z0-9._-]`` become ``_``). A given ``name`` that already
    exists is an error unless ``exist_ok`` (to resume, open ``RunDir(path)`` instead).
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if name:
        path = output_dir / name
        if path.exists() and not exist_ok:
            raise FileExistsError(f"run directory {path} exists; pick another name or resume it")
        path.mkdir(exist_ok=True)
        return path
    parts = [_slug(part) for part in (model, dataset) if _slug(part)]
    base = "-".join(parts + [time.strftime("%Y%m%d-%H%M%S")])
    for i in range(1, 1000):
        path = output_dir / (base if i == 1 else f"{base}-{i}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{output_dir}: could not find a free run name starting with {base}")
