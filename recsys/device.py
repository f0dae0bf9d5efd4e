"""Where tensors live: the one choice of device, and numpy -> device tensors without a host sync.

:func:`resolve_device` turns a setting (``train.device``, ``Run.load(device=...)``, ``recsys
serve --device``) into a ``torch.device``; a GPU asked for on a machine without one is a
:class:`~recsys.config.ConfigError` naming the setting, raised before anything is built.

A plain ``torch.from_numpy(a).to("cuda")`` copies from pageable memory and waits for the GPU to
finish everything queued before it, so calling it once per batch stalls the host as often. The
copies here go through pinned memory with ``non_blocking=True``: the host queues them and moves
on (the pinned buffer stays reserved until its copy has run).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import Tensor

from recsys.config import ConfigError

__all__ = ["model_device", "resolve_device", "to_device"]


def resolve_device(choice: str | torch.device, key: str = "device", *, index: int | None = None) -> torch.device:
    """``choice`` as a ``torch.device``: ``auto`` is CUDA when available, else the CPU;
    ``cpu``; ``cuda`` / ``cuda:N`` (``index`` picks the GPU of a bare ``cuda`` or ``auto``,
    e.g. a process's local rank). An unknown name, or a GPU this machine does not have, is a
    :class:`~recsys.config.ConfigError` naming ``key``."""
    if isinstance(choice, str) and choice.strip() == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(choice)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{key}: {choice!r} is not a device (auto, cpu, cuda or cuda:N)") from None
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        why = "this PyTorch build has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise ConfigError(f"{key}: {str(choice)!r} asks for a GPU, but {why}; use 'auto' or 'cpu'")
    device = device if device.index is not None or index is None else torch.device("cuda", index)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(
            f"{key}: {str(device)!r} asks for GPU {device.index}, but {torch.cuda.device_count()} are visible"
        )
    return device


def model_device(model: torch.nn.Module) -> torch.device:
    """Where ``model``'s first parameter (or buffer) lives; the CPU for a model without tensors."""
    tensor = next(itertools.chain(model.parameters(), model.buffers()), None)
    return torch.device("cpu") if tensor is None else tensor.device


def to_device(arrays: tuple[np.ndarray, ...], device: torch.device) -> tuple[Tensor, ...]:
    """numpy arrays -> tensors on ``device`` (through pinned memory, non-blocking, on CUDA).

    A read-only array (a memory-mapped dataset, a ``np.broadcast_to`` view) is copied first: a
    tensor may be written to, and torch warns about sharing memory it must not write.
    """
    out = []
    for a in arrays:
        x = torch.from_numpy(np.require(a, requirements=("C", "W")))  # copies only when needed
        if device.type == "cuda":
            x = x.pin_memory().to(device, non_blocking=True)
        out.append(x)
    return tuple(out)
