"""What a checkpoint file says about itself, beyond the run's manifest.

The manifest (:mod:`recsys.io.manifest`) tells whether a run file is the one the run wrote. Two
questions are left, and a checkpoint can answer them on its own:

- *Is the file whole?* ``torch.save`` writes a zip archive with a CRC-32 for every entry, so a
  flipped byte in a run without a manifest entry for the file is still caught
  (:func:`check_archive`), and a file that fails the manifest but is a whole archive was
  replaced by another checkpoint rather than damaged (:func:`read_whole`).
- *Does it fit the model?* The weights' names and shapes are compared with the model the run's
  config builds (:func:`check_weights`), so another model's weights are reported as such
  instead of as a truncated file or a traceback from ``load_state_dict``.

Every failure is an :class:`~recsys.io.IntegrityError`: one line naming the file, what is wrong
and the advice the caller passes.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from recsys.io import IntegrityError

__all__ = ["check_archive", "check_weights", "read_whole", "torch_load", "weights_mismatch"]

_SHOWN = 3  # names listed per kind of difference


def check_archive(path: Path, advice: str) -> None:
    """Raise :class:`IntegrityError` when ``path`` is a zip archive (the format ``torch.save``
    writes) with an entry whose CRC-32 does not match; a file that is not a zip archive at all is
    left to ``torch.load`` to judge."""
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise IntegrityError(f"{path}: cannot be read ({err}); {advice}") from None
    if bad is not None:
        raise IntegrityError(f"{path}: corrupted (its entry {bad} fails the archive's CRC-32 check); {advice}")


def torch_load(path: Path, map_location: str | torch.device, advice: str) -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``, any failure an :class:`IntegrityError`; the
    loaded object must be a dict."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001 - truncated zip, bad pickle opcode, ...: all mean "damaged"
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise IntegrityError(f"{path}: cannot be read ({reason[:200]}); {advice}") from None
    if not isinstance(state, dict):
        raise IntegrityError(f"{path}: not a recsys checkpoint; {advice}")
    return state


def read_whole(path: Path) -> dict[str, Any] | None:
    """The checkpoint in ``path`` when it is a whole archive (every CRC-32 matches) that torch
    loads as a dict, else None."""
    try:
        check_archive(path, "")
        return torch_load(path, "cpu", "") if zipfile.is_zipfile(path) else None
    except IntegrityError:
        return None


def weights_mismatch(model: nn.Module, weights: Mapping[str, Any]) -> str | None:
    """How the state_dict ``weights`` differs from ``model``'s (names missing, names not in the
    model, shapes), in a few words; None when it fits."""
    expected = model.state_dict()
    missing = [name for name in expected if name not in weights]
    unknown = [name for name in weights if name not in expected]
    shapes = [
        f"{name} is {_shape(weights[name])} where the config's model has {_shape(value)}"
        for name, value in expected.items()
        if name in weights and _shape(weights[name]) != _shape(value)
    ]
    parts = [f"{what} {_names(names)}" for what, names in (("missing", missing), ("unexpected", unknown)) if names]
    parts += shapes[:_SHOWN] + ([f"{len(shapes) - _SHOWN} more of another shape"] if len(shapes) > _SHOWN else [])
    return "; ".join(parts) or None


def check_weights(path: Path, model: nn.Module, weights: Mapping[str, Any], advice: str) -> None:
    """Raise :class:`IntegrityError` ("weights of another model: ...") when ``weights`` from
    ``path`` do not fit ``model``."""
    mismatch = weights_mismatch(model, weights)
    if mismatch is not None:
        raise IntegrityError(f"{path}: weights of another model ({mismatch}); {advice}")


def _shape(value: Any) -> list[int] | None:
    return list(value.shape) if isinstance(value, torch.Tensor) else None


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")
