"""Test-wide setup: run the Triton kernels in the interpreter when there is no GPU.

``TRITON_INTERPRET`` must be set before ``triton.jit`` decorates the kernels, i.e. before any
``recsys.kernels`` Triton module is imported; conftest is imported first.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
