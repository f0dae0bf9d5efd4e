"""The log-partition of each row's softmax over the whole catalogue, ``logsumexp_j <u_r, e_j>``,
without the ``[R, N]`` logits.

:func:`~recsys.kernels.catalogue_logsumexp.op.catalogue_logsumexp` (public) checks its arguments
(:mod:`~recsys.kernels.catalogue_logsumexp.checks`) and runs the Triton kernels
(:mod:`~recsys.kernels.catalogue_logsumexp.triton`) or the PyTorch twin
(:mod:`~recsys.kernels.catalogue_logsumexp.reference`).
"""

from recsys.kernels.catalogue_logsumexp.op import catalogue_logsumexp, uses_kernel
from recsys.kernels.catalogue_logsumexp.reference import catalogue_logsumexp_ref

__all__ = ["catalogue_logsumexp", "catalogue_logsumexp_ref", "uses_kernel"]
