"""The public catalogue logsumexp op: check the arguments, then run the Triton kernels or the
PyTorch twin."""

from __future__ import annotations

import torch
from torch import Tensor

from recsys.kernels.catalogue_logsumexp import triton as kernel
from recsys.kernels.catalogue_logsumexp.checks import check_catalogue_logsumexp_args
from recsys.kernels.catalogue_logsumexp.reference import catalogue_logsumexp_ref
from recsys.kernels.common.backend import product_dtype, use_triton

__all__ = ["catalogue_logsumexp", "uses_kernel"]


def uses_kernel(user: Tensor, items: Tensor, *, backend: str = "auto") -> bool:
    """Whether :func:`catalogue_logsumexp` runs its Triton kernels on these arguments (which never
    hold the ``[R, N]`` logits; the twin does). "auto" leaves fp32 on CUDA to the twin (IEEE fp32
    products spill registers on sm_90, as in :func:`recsys.kernels.max_interest_scores`) and bf16
    on the CPU (the Triton interpreter's bf16 products are wrong)."""
    if not use_triton(backend, user.device):
        return False
    dtype = product_dtype(user, items)
    supported = kernel.triton_supports(dtype, user.shape[1], items.shape[0])
    if backend == "triton":
        return supported
    on_cuda = user.device.type == "cuda"
    return supported and dtype != (torch.float32 if on_cuda else torch.bfloat16)


def catalogue_logsumexp(user: Tensor, items: Tensor, *, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """``lse[r] = log sum_j exp(<user[r], items[j]>)`` and ``row_max[r] = max_j <user[r], items[j]>``:
    the log-partition of each row's softmax over a whole catalogue (the exact softmax of
    ``train.full_softmax``) and its largest logit.

    Args:
        user: ``[R, d]``, one row per target.
        items: ``[N, d]``, same device (the catalogue without its padding row).
        backend: ``"auto" | "triton" | "torch"``.

    Returns:
        ``(lse [R], row_max [R])`` float32 (float64 for float64 inputs); ``-inf`` for ``N = 0``.
        ``lse`` is differentiable in both inputs, ``row_max`` is not. The inputs are multiplied
        in the autocast dtype where autocast is on for their device, else in their common dtype.
        The Triton kernels never hold the ``[R, N]`` logits (the twin does); "auto" sends fp64,
        ``d > 256``, an empty catalogue, fp32 on CUDA and bf16 on the CPU to the twin
        (:func:`uses_kernel`).
    """
    check_catalogue_logsumexp_args(user, items)
    if uses_kernel(user, items, backend=backend):
        dtype = product_dtype(user, items)
        return kernel.catalogue_logsumexp_op(user.to(dtype), items.to(dtype))
    if backend == "triton":
        raise ValueError(
            f"the Triton kernel needs fp16/bf16/fp32, d <= 256 and at least one item; got "
            f"{product_dtype(user, items)}, d = {user.shape[1]}, N = {items.shape[0]}"
        )
    dtype = product_dtype(user, items)
    with torch.autocast(user.device.type, enabled=False):
        return catalogue_logsumexp_ref(user.to(dtype), items.to(dtype))
