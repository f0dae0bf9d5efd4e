"""The kernels: one folder per op, each with its public function and argument checks
(``op.py``, ``checks.py``), its Triton kernels (``triton.py``) and its PyTorch twin
(``reference.py``); :mod:`recsys.kernels.common` holds what the ops share (backend choice, the
launch path of the Triton kernels, the twins' helpers).

Ops: :func:`attention`, :func:`multi_interest` and its causal prefix form
:func:`causal_multi_interest` (dense training), :func:`max_interest_scores`,
:func:`catalogue_logsumexp` (the exact softmax's log-partition). Each takes
``backend="auto" | "triton" | "torch"`` (:func:`triton_available` says where Triton runs).

The op folders share their functions' names, so ``recsys.kernels.attention`` is the function;
reach an op's modules by ``from recsys.kernels.attention import triton``.
"""

from recsys.kernels.attention import attention, attention_ref
from recsys.kernels.catalogue_logsumexp import catalogue_logsumexp, catalogue_logsumexp_ref
from recsys.kernels.causal_multi_interest import causal_multi_interest, causal_multi_interest_ref
from recsys.kernels.common.backend import BACKENDS, triton_available
from recsys.kernels.common.reference import length_softmax
from recsys.kernels.max_interest_scores import max_interest_scores, max_interest_scores_ref
from recsys.kernels.multi_interest import cap_scores, multi_interest, multi_interest_ref

__all__ = [
    "BACKENDS",
    "attention",
    "attention_ref",
    "cap_scores",
    "catalogue_logsumexp",
    "catalogue_logsumexp_ref",
    "causal_multi_interest",
    "causal_multi_interest_ref",
    "length_softmax",
    "max_interest_scores",
    "max_interest_scores_ref",
    "multi_interest",
    "multi_interest_ref",
    "triton_available",
]
