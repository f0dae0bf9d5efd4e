"""Attention with key padding, causal masking and logit soft-capping.

:func:`~recsys.kernels.attention.op.attention` (public, in :mod:`~recsys.kernels.attention.op`)
checks its arguments (:mod:`~recsys.kernels.attention.checks`) and runs the Triton flash-attention
kernels (:mod:`~recsys.kernels.attention.triton`) or the PyTorch twin
(:mod:`~recsys.kernels.attention.reference`).
"""

from recsys.kernels.attention.op import attention
from recsys.kernels.attention.reference import attention_ref

__all__ = ["attention", "attention_ref"]
