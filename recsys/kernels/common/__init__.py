"""What every op shares: the backend choice (:mod:`~recsys.kernels.common.backend`), the launch
path of the Triton kernels (:mod:`~recsys.kernels.common.launch`) and the PyTorch helpers of the
twins (:mod:`~recsys.kernels.common.reference`)."""
