"""numpy -> device tensors without a host sync.

A plain ``torch.from_numpy(a).to("cuda")`` copies from pageable memory and waits for the GPU to
finish everything queued before it, so calling it once per batch stalls the host as often. The
copies here go through pinned memory with ``non_blocking=True``: the host queues them and moves
on (the pinned buffer stays reserved until its copy has run).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["to_device"]


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
