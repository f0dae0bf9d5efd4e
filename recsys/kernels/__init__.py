"""Attention kernels: Triton implementations, their PyTorch twins and the dispatcher.

``attention`` and ``multi_interest`` (from :mod:`recsys.kernels.dispatch`) are the public entry
points; :mod:`recsys.kernels.triton_attention` and :mod:`recsys.kernels.triton_multi_interest`
hold the Triton kernels, :mod:`recsys.kernels.reference` their PyTorch twins.
"""

from recsys.kernels.dispatch import attention, multi_interest, triton_available

__all__ = ["attention", "multi_interest", "triton_available"]
