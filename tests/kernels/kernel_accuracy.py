"""The kernels' accuracy rule (flash-attention's): against an fp64 reference, a kernel's error is
at most twice the PyTorch twin's own error at the same precision, plus a small term at the
output's scale (``atol`` times the reference's largest magnitude, at least 1): a sum over 200
positions of values up to 60, taken in another order, differs from the twin's by fp32 rounding
that an absolute epsilon made for unit-sized outputs would call an error."""

from collections.abc import Sequence

import torch


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
