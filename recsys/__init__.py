"""recsys: multi-interest sequential retrieval (ComiRec-SA and baselines) with Triton kernels."""

__version__ = "0.1.0"
