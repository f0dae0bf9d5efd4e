"""The kernels' accuracy rule (flash-attention's): against an fp64 reference, a kernel's error is
at most twice the PyTorch twin's own error at the same precision, plus a small term at the
output's scale (``atol`` times the reference's largest magnitude, at least 1): a sum over 200
positions of values up to 60, taken in another order, differs from the twin's by fp32 rounding
that an absolute epsilon made for unit-sized outputs would call an error.

Also where the single-op kernel tests run: the interpreter on a machine without a GPU, CUDA with
the ``gpu`` marker (``BOTH`` devices; ``DEVICES``: (device, dtype) pairs, bf16 on CUDA only, since
the interpreter's bf16 products are wrong), and their tolerance at each precision (``ATOL``)."""

from collections.abc import Sequence

import pytest
import torch

CUDA = torch.cuda.is_available()
needs_interpreter = pytest.mark.skipif(
    CUDA, reason="CPU interpreter tests run only where there is no GPU (the gpu tests cover CUDA)"
)
GPU_MARKS = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")]
BOTH = [pytest.param("cpu", marks=needs_interpreter), pytest.param("cuda", marks=GPU_MARKS)]
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
DEVICES = [
    pytest.param("cpu", torch.float32, marks=needs_interpreter, id="cpu-fp32"),
    pytest.param("cpu", torch.float16, marks=needs_interpreter, id="cpu-fp16"),
    *(
        pytest.param("cuda", dt, marks=GPU_MARKS, id=f"cuda-{str(dt)[6:]}")
        for dt in (torch.float32, torch.float16, torch.bfloat16)
    ),
]


def assert_within_twice_twin(
    names: Sequence[str],
    ref: Sequence[torch.Tensor],
    twin: Sequence[torch.Tensor],
    ours: Sequence[torch.Tensor],
    atol: float,
) -> None:
    """``ref`` (fp64), ``twin`` and ``ours`` list the same outputs/gradients, named by ``names``."""
    for name, r, t, o in zip(names, ref, twin, ours, strict=True):
        assert torch.isfinite(o).all(), f"{name}: non-finite values"
        ours_err = (o - r).abs().max().item()
        twin_err = (t - r).abs().max().item()
        slack = atol * max(1.0, r.abs().max().item())
        assert ours_err <= 2 * twin_err + slack, (
            f"{name}: kernel error {ours_err:.3g} > 2 x twin error {twin_err:.3g} + {slack:.3g}"
        )
