"""Attention kernels: Triton implementations, their PyTorch twins and the dispatcher."""

from recsys.kernels.dispatch import attention, multi_interest, triton_available

__all__ = ["attention", "multi_interest", "triton_available"]
