"""The argument checks of :func:`recsys.kernels.multi_interest`."""

from __future__ import annotations

from torch import Tensor

from recsys.kernels.common.backend import check_lengths

__all__ = ["check_multi_interest_args"]


def check_multi_interest_args(
    h: Tensor,
    lengths: Tensor,
    w1: Tensor,
    w2: Tensor,
    pos: Tensor | None,
    values: Tensor | None,
    score_cap: float | None,
) -> None:
    """Raise ValueError unless ``h [B, L, d]``, ``lengths [B]`` int, ``w1 [d, hidden]``,
    ``w2 [hidden, K]``, ``pos [L_max >= L, d]`` (or None), ``values [B, L, d_v]`` (or None) and
    ``score_cap >= 0`` (or None) fit together."""
    if h.dim() != 3:
        raise ValueError(f"h must be [B, L, d], got {tuple(h.shape)}")
    b, seq_len, d = h.shape
    if w1.dim() != 2 or w1.shape[0] != d:
        raise ValueError(f"w1 must be [{d}, hidden], got {tuple(w1.shape)}")
    if w2.dim() != 2 or w2.shape[0] != w1.shape[1]:
        raise ValueError(f"w2 must be [{w1.shape[1]}, K], got {tuple(w2.shape)}")
    if pos is not None and (pos.dim() != 2 or pos.shape[0] < seq_len or pos.shape[1] != d):
        raise ValueError(f"pos must be [L_max >= {seq_len}, {d}], got {tuple(pos.shape)}")
    if values is not None and (values.dim() != 3 or values.shape[:2] != h.shape[:2]):
        raise ValueError(f"values must be [{b}, {seq_len}, d_v], got {tuple(values.shape)}")
    check_lengths(lengths, b, "lengths")
    if score_cap is not None and not score_cap >= 0:
        raise ValueError(f"score_cap must be >= 0 (0 or None: no cap), got {score_cap}")
