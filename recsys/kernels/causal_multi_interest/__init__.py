"""Causal (prefix) multi-interest extraction: ``K`` interests at every prefix of a click sequence.

:func:`causal_multi_interest` is the public entry point (:mod:`.op`); :mod:`.triton` holds the
Triton kernels, :mod:`.reference` the PyTorch twin.
"""

from recsys.kernels.causal_multi_interest.op import causal_multi_interest
from recsys.kernels.causal_multi_interest.reference import causal_multi_interest_ref

__all__ = ["causal_multi_interest", "causal_multi_interest_ref"]
