"""Causal (prefix) multi-interest extraction: ``K`` interests at every prefix of a click sequence.

:func:`~recsys.kernels.causal_multi_interest.op.causal_multi_interest` (public) checks its arguments
(:mod:`~recsys.kernels.causal_multi_interest.checks`) and runs the Triton kernels
(:mod:`~recsys.kernels.causal_multi_interest.triton`) or the PyTorch twin
(:mod:`~recsys.kernels.causal_multi_interest.reference`).
"""

from recsys.kernels.causal_multi_interest.op import causal_multi_interest
from recsys.kernels.causal_multi_interest.reference import causal_multi_interest_ref

__all__ = ["causal_multi_interest", "causal_multi_interest_ref"]
