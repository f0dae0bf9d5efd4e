"""The DFT tables against torch.fft in fp64 (every exporter can write the tables' products)."""

from __future__ import annotations

import pytest
import torch

from recsys.nn.dft import dft_tables, irfft_rows, rfft_rows


@pytest.mark.parametrize("n", [1, 2, 7, 50, 51, 129])
def test_the_products_are_the_orthonormal_rfft_and_irfft(n):
    torch.manual_seed(n)
    cos, sin = dft_tables(n, torch.device("cpu"), torch.float64)
    for rows in sorted({1, (n + 1) // 2, n}):  # fewer rows than the window: the rest are zeros
        x = torch.randn(2, 3, rows, 5, dtype=torch.float64)
        real, imag = rfft_rows(x, cos, sin)
        want = torch.fft.rfft(x, n=n, dim=-2, norm="ortho")
        torch.testing.assert_close(torch.complex(real, imag), want, rtol=0, atol=1e-12)
        spectrum = torch.randn(2, 3, n // 2 + 1, 5, dtype=torch.complex128)
        back = torch.fft.irfft(spectrum, n=n, dim=-2, norm="ortho")[..., :rows, :]
        torch.testing.assert_close(irfft_rows(spectrum.real, spectrum.imag, cos, sin, rows), back, rtol=0, atol=1e-12)


def test_the_tables_stay_float32_under_bf16_autocast():
    """The filters' transforms run in float32 even inside a bf16 autocast region."""
    cos, sin = dft_tables(50, torch.device("cpu"), torch.float32)
    x = torch.randn(4, 50, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        real, imag = rfft_rows(x, cos, sin)
        back = irfft_rows(real, imag, cos, sin)
    assert real.dtype == imag.dtype == back.dtype == torch.float32
    torch.testing.assert_close(back, x, rtol=0, atol=1e-5)
