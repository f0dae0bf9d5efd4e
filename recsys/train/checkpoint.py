"""What a resume checkpoint holds, as plain data: weights, optimizer, step, early-stopping
state and every random state (:func:`make_checkpoint`, :func:`capture_rng`, :func:`restore_rng`).

Where it is written, and how, is the run directory's business (:class:`recsys.run.RunDir`).
Everything here loads with ``torch.load(weights_only=True)``; :func:`check_plain` enforces it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from recsys.io import check_plain
from recsys.train.distributed import unwrap_model

__all__ = ["capture_rng", "make_checkpoint", "rank_rng", "restore_rank_rng", "restore_rng"]


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
        "numpy_generators": {name: _plain(g.bit_generator.state) for name, g in (numpy_generators or {}).items()},
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
    # a checkpoint loaded onto the training device carries its states there too; generators take
    # their state as a CPU byte tensor whatever their own device
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    for name, g in torch_generators.items():
        g.set_state(state["torch_generators"][name].cpu())
    for name, rng in numpy_generators.items():
        rng.bit_generator.state = state["numpy_generators"][name]


def rank_rng() -> dict[str, Any]:
    """This process's own torch streams (dropout draws from them, and each rank has its own): the
    CPU's and the current CUDA device's (None without CUDA). Every rank's goes into a checkpoint,
    so that each resumes its own."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return {"torch": torch.get_rng_state(), "cuda": cuda}


def restore_rank_rng(state: Mapping[str, Any]) -> None:
    """Put back :func:`rank_rng`'s streams (the CUDA one onto the current device, where there is one)."""
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def make_checkpoint(
    model: nn.Module,
    *,
    step: int,
    best: float,
    best_step: int,
    bad_evals: int,
    rng: dict[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """The resume checkpoint as a plain dict.

    Keys: ``model`` (state_dict of the unwrapped model, no DDP/compile prefixes), ``step``
    (optimizer steps done), ``best`` (best validation metric so far, ``-inf`` before the first
    evaluation), ``best_step``, ``bad_evals`` (evaluations since the last improvement: the
    early-stopping counter), ``rng`` (:func:`capture_rng`), and any plain ``extra`` entries (the
    training step's: ``optimizer``, ``average``, ``item_rows``).
    """
    state = {
        "model": unwrap_model(model).state_dict(),
        "step": int(step),
        "best": float(best),
        "best_step": int(best_step),
        "bad_evals": int(bad_evals),
        "rng": rng,
        **extra,
    }
    check_plain(state)
    return state
