"""The public max-over-interests score op: check the arguments, then run the Triton kernels or
the PyTorch twin."""

from __future__ import annotations

import torch
from torch import Tensor

from recsys.kernels.common.backend import product_dtype, use_triton
from recsys.kernels.max_interest_scores import triton as kernel
from recsys.kernels.max_interest_scores.checks import check_max_interest_scores_args
from recsys.kernels.max_interest_scores.reference import max_interest_scores_ref

__all__ = ["max_interest_scores"]


def max_interest_scores(interests: Tensor, items: Tensor, *, backend: str = "auto") -> Tensor:
    """``out[b, s] = max_k <interests[b, k], items[s]>``: each item scored by the user's best
    matching interest (the score retrieval ranks by; ``train.negative_readout = "max"``).

    Args:
        interests: ``[B, K, d]``.
        items: ``[S, d]``, same device.
        backend: ``"auto" | "triton" | "torch"``.

    Returns:
        ``[B, S]`` float32 (float64 for float64 inputs). The inputs are multiplied in the autocast
        dtype where autocast is on for their device, else in their common dtype. The gradient of
        each score goes to its winning interest (Triton: the first of tied ones; the twin splits
        ties evenly). The Triton kernels never hold the ``[B, K, S]`` product; "auto" sends fp64,
        ``d > 256``, ``K > 127`` and fp32 on CUDA (the kernels' IEEE fp32 products spill there) to
        the twin.
    """
    check_max_interest_scores_args(interests, items)
    device_type = interests.device.type
    dtype = product_dtype(interests, items)
    interests, items = interests.to(dtype), items.to(dtype)
    if use_triton(backend, interests.device):
        # "auto" leaves fp32 on CUDA to the twin: the kernel's IEEE fp32 products spill registers
        # on sm_90 (6 KB of stack per thread, tests/kernels/sm90.py); bf16/fp16 is the fast path
        ieee_on_gpu = dtype == torch.float32 and interests.device.type == "cuda"
        if kernel.triton_supports(interests) and (backend == "triton" or not ieee_on_gpu):
            return kernel.max_interest_scores_op(interests, items)[0]
        if backend == "triton":
            raise ValueError(
                f"the Triton kernel needs fp16/bf16/fp32, d <= 256 and K <= 127; got "
                f"{dtype}, d = {interests.shape[2]}, K = {interests.shape[1]}"
            )
    with torch.autocast(device_type, enabled=False):
        return max_interest_scores_ref(interests, items)
