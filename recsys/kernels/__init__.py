"""Attention kernels: Triton implementations, their PyTorch twins and the dispatcher.

``attention``, ``multi_interest`` and ``max_interest_scores`` (from :mod:`recsys.kernels.dispatch`)
are the public entry points; :mod:`recsys.kernels.triton_attention`,
:mod:`recsys.kernels.triton_multi_interest` and :mod:`recsys.kernels.triton_max_scores` hold the
Triton kernels, :mod:`recsys.kernels.reference` their PyTorch twins.
"""

from recsys.kernels.dispatch import attention, max_interest_scores, multi_interest, triton_available

__all__ = ["attention", "max_interest_scores", "multi_interest", "triton_available"]
