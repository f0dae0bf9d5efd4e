"""The real discrete Fourier transform of short windows as two matrix products.

``torch.fft.rfft``/``irfft`` with ``norm="ortho"`` along a window of ``n`` rows, written as
products with the cosine and sine tables of the ``n // 2 + 1`` bins. A window here is at most
``data.max_len`` rows (tens), where a product is as cheap as an FFT, and every exporter can write
it: ONNX opset 17 has no real FFT, so the filter blocks (:mod:`recsys.nn.frequency`,
:mod:`recsys.nn.wavelet`) export through these tables. The products run in float32 or wider with
autocast off (``torch.fft`` has no bf16 either).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor


@functools.lru_cache(maxsize=64)
def dft_tables(n: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(cos, sin)``, each ``[n // 2 + 1, n]``: ``cos(2πkt / n) / √n`` and ``sin(2πkt / n) / √n``
    for bin ``k`` and row ``t`` (the orthonormal scaling). The angle is reduced modulo ``n`` in
    integers first, so large ``k·t`` lose nothing to rounding. Constants of the shape, built once
    per window, device and dtype (outside any CUDA graph or export trace that reads them)."""
    k = torch.arange(n // 2 + 1, device=device)[:, None]
    t = torch.arange(n, device=device)[None]
    angle = (k * t % n).to(torch.float64) * (2 * math.pi / n)
    scale = 1 / math.sqrt(n)
    return (angle.cos() * scale).to(dtype), (angle.sin() * scale).to(dtype)


def rfft_rows(x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.fft.rfft(x, n, dim=-2, norm="ortho")`` as ``(real, imag)``: ``x [..., m, d]``,
    ``m <= n`` rows (the rest of the ``n``-row window zeros) -> two ``[..., n // 2 + 1, d]``
    (``cos``, ``sin`` from :func:`dft_tables`)."""
    rows = x.shape[-2]
    with torch.autocast(x.device.type, enabled=False):
        return cos[:, :rows] @ x, -(sin[:, :rows] @ x)


def irfft_rows(real: Tensor, imag: Tensor, cos: Tensor, sin: Tensor, rows: int | None = None) -> Tensor:
    """``torch.fft.irfft(real + i·imag, n, dim=-2, norm="ortho")[..., :rows, :]``: two
    ``[..., n // 2 + 1, d]`` -> ``[..., rows, d]`` (all ``n`` by default). Every bin but the
    constant one and, for even ``n``, the last counts twice (its conjugate twin); their imaginary
    parts meet a zero sine, as irfft ignores them."""
    n, k = cos.shape[1], torch.arange(cos.shape[0], device=cos.device)[:, None]
    twice = torch.where((k == 0) | (2 * k == n), 1.0, 2.0).to(cos.dtype)  # [n // 2 + 1, 1]
    back_cos, back_sin = (cos * twice).transpose(0, 1), (sin * twice).transpose(0, 1)  # [n, n // 2 + 1]
    if rows is not None:
        back_cos, back_sin = back_cos[:rows], back_sin[:rows]
    with torch.autocast(real.device.type, enabled=False):
        return back_cos @ real - back_sin @ imag
