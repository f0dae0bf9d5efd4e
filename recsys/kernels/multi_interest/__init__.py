"""ComiRec-SA self-attentive multi-interest extraction: ``K`` attention-pooled interests per sequence.

:func:`~recsys.kernels.multi_interest.op.multi_interest` (public) checks its arguments
(:mod:`~recsys.kernels.multi_interest.checks`) and runs the fused Triton kernels
(:mod:`~recsys.kernels.multi_interest.triton`) or the PyTorch twin
(:mod:`~recsys.kernels.multi_interest.reference`).
"""

from recsys.kernels.multi_interest.op import multi_interest
from recsys.kernels.multi_interest.reference import cap_scores, multi_interest_ref

__all__ = ["cap_scores", "multi_interest", "multi_interest_ref"]
