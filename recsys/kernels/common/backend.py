"""Which implementation an op runs: its Triton kernel or its PyTorch twin.

``backend="auto"`` picks Triton for CUDA tensors (and for CPU tensors when
``TRITON_INTERPRET=1`` is set, which is how the kernel tests run without a GPU) and the
PyTorch twin otherwise. ``backend="triton"`` or ``"torch"`` forces one. The accepted names are
the config's (:data:`recsys.config.KERNEL_BACKENDS`, the choices of ``model.backend``).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from recsys.config import KERNEL_BACKENDS as BACKENDS

__all__ = ["BACKENDS", "check_lengths", "product_dtype", "triton_available", "use_triton"]


def triton_available(device: torch.device) -> bool:
    """True where the Triton kernels can run on tensors of ``device``."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(backend: str, device: torch.device) -> bool:
    """Whether an op called with ``backend`` on tensors of ``device`` runs its Triton kernel.

    Raises ValueError for an unknown backend, RuntimeError for ``"triton"`` where Triton cannot run.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    if backend == "triton":
        if not triton_available(device):
            raise RuntimeError(f"backend='triton' needs CUDA tensors or TRITON_INTERPRET=1, got a {device.type} tensor")
        return True
    return triton_available(device)


def product_dtype(a: Tensor, b: Tensor) -> torch.dtype:
    """The dtype an op multiplies ``a`` and ``b`` in, as a matmul would: autocast's where it is on
    for their device, else their common dtype."""
    device_type = a.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(a.dtype, b.dtype)


def check_lengths(lengths: Tensor | None, batch: int, name: str) -> None:
    """Raise ValueError unless ``lengths`` (argument ``name``) is None or an integer ``[batch]`` tensor."""
    if lengths is None:
        return
    if lengths.shape != (batch,):
        raise ValueError(f"{name} must have shape [{batch}], got {tuple(lengths.shape)}")
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got {lengths.dtype}")
