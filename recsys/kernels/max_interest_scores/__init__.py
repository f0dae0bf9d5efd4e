"""Each item scored by a user's best matching interest, ``max_k <interests[b, k], items[s]>``,
without the ``[B, K, S]`` product.

:func:`~recsys.kernels.max_interest_scores.op.max_interest_scores` (public) checks its arguments
(:mod:`~recsys.kernels.max_interest_scores.checks`) and runs the Triton kernels
(:mod:`~recsys.kernels.max_interest_scores.triton`) or the PyTorch twin
(:mod:`~recsys.kernels.max_interest_scores.reference`).
"""

from recsys.kernels.max_interest_scores.op import max_interest_scores
from recsys.kernels.max_interest_scores.reference import max_interest_scores_ref

__all__ = ["max_interest_scores", "max_interest_scores_ref"]
