"""Frequency-domain token mixing: BSARec's low-band / high-band filter of a click sequence.

BSARec (Shin et al., AAAI 2024) mixes self-attention with a fixed split of each feature's sequence
into its lowest frequencies and the rest: ``low = irfft(rfft(x)[:c])`` along the sequence,
``high = x - low``, and the filter's output ``low + β² ⊙ high`` with a learned ``β [d]``, so the
model chooses, per feature, how much of the sequence's fast changes (the latest clicks' departures
from the user's slow trend) to keep. The transformer block (:mod:`recsys.nn.transformer`) adds the
residual, the norm, and the mix with attention.

Padding and causality. The published block filters a left-padded window of ``L = max_len`` rows,
padding rows included, and is trained on the window's last position only. The low band is a
circulant operator along the sequence (it keeps the frequencies ``0, ±1, ..., ±(c - 1)`` of a
length-``L`` DFT), so it commutes with rotations. Rotating a left-padded window by its padding puts
the clicks first and the padding rows after them, in their order: recsys's right-padded layout,
where a padding row's position counts on around the window (:func:`recsys.nn.masking.recency_index`).
So, where the rows hold the same values, filtering the right-padded window gives at every row what
the published filter gives at the same row of the left-padded one. What the padding rows hold is
one setting (``model.filter_padding``, ``pads`` here):

- ``"zero"`` (the default): padding rows are zeroed before the filter and in its output, so a
  user's representation does not depend on what sits in their padding. For a history of ``n <
  L`` clicks the low band is then mostly the clicks' mean scaled by ``n / L``.
- ``"window"``: the filter reads the rows the encoder computed at the padding, as the published
  block does: in the first block the LayerNorm'd position embedding of each padding row, in later
  blocks the previous block's output there, so a short history's low band carries learned
  position terms. What still differs from the published block is the attention branch at a
  padding row: the published one (an additive -10000 on every key) spreads it over the whole
  window by raw scores; recsys's kernels give such a row no key, so the hybrid's attention branch
  is zero there.

Like the published block, the filter is **not causal**: position ``t`` reads clicks after ``t``
within the window. Only a window's last position may be trained (``train.predict_at = "last"``,
every prefix a sample, as the published recipe does); dense training, where position ``t`` predicts
click ``t + 1``, would read its own target, and is refused (:mod:`recsys.run.settings`).

``causal=True`` (``model.filter_causal``) gives every position what the published filter gives at
the last row of the ``L``-row window that ends there: the low band at ``t`` is
``Σ_{s<L} h[s] · x[t - s]`` with ``h`` the band's circular kernel (``irfft`` of the kept bins), a
causal FIR filter, so a model can train on every position of a window. For one block this is the
published filter at every prefix exactly; in a stack the lower blocks differ, since there each
prefix's window would be filtered as a whole. It reads no padding row, so it has no ``"window"`` form.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from recsys.nn.dft import dft_tables, irfft_rows, rfft_rows
from recsys.nn.masking import length_mask


def low_band_bins(cutoff: int) -> int:
    """The rfft bins kept as the low band for BSARec's ``c`` (its ``c // 2 + 1``)."""
    if cutoff < 1:
        raise ValueError(f"model.filter_cutoff must be >= 1, got {cutoff}")
    return cutoff // 2 + 1


class FrequencyFilter(nn.Module):
    """``x [B, L, d]``, ``lengths [B]`` -> ``low + β² ⊙ (x - low)`` ``[B, L, d]``, 0 at padded rows
    (filtered there too with ``pads``).

    ``low`` keeps the lowest ``cutoff // 2 + 1`` rfft bins of each feature along the window
    (orthonormal, ``width`` rows: the model's ``data.max_len``, so a narrower batch is filtered as
    its rows zero-padded to the full window, as training saw them; the tensor's width without it);
    ``β [d]`` starts at ``N(0, 1)`` as in BSARec. Computed in at least float32 (the transforms are
    products with DFT tables, :mod:`recsys.nn.dft`), returned in ``x``'s dtype.

    Args:
        dim: width ``d``.
        cutoff: BSARec's ``c`` (its logged Amazon Beauty run: 5, i.e. 3 bins).
        causal: position ``t`` reads clicks ``<= t`` only (the module docstring).
        pads: read the padding rows as they are (``model.filter_padding = "window"``) instead of zeros.
        width: the window's rows (``data.max_len``); ``None``: each input's width.
    """

    def __init__(self, dim: int, cutoff: int, causal: bool = False, *, pads: bool = False, width: int | None = None):
        super().__init__()
        if causal and pads:
            raise ValueError("the causal filter reads no padding row: it has no filter_padding='window' form")
        self.bins = low_band_bins(cutoff)
        self.causal = causal
        self.pads = pads
        self.width = width
        self.sqrt_beta = nn.Parameter(torch.randn(dim))
        self._bands: dict[tuple[int, torch.device, torch.dtype], Tensor] = {}  # causal band per (L, device, dtype)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        seq_len = x.shape[1]
        width = seq_len if self.width is None else self.width
        if seq_len > width:
            raise ValueError(f"a window of {seq_len} rows is longer than the filter's {width} (data.max_len)")
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        mask = None if self.pads else length_mask(lengths, seq_len)[..., None]  # [B, L, 1]
        wide = wide if mask is None else wide * mask  # padding rows are zero unless they are read
        if self.causal:
            band = self._causal_band(width, wide)[:seq_len, :seq_len]
            low = torch.einsum("ts,bsd->btd", band, wide)  # [B, L, d]
        else:
            cos, sin = dft_tables(width, x.device, wide.dtype)
            real, imag = rfft_rows(wide, cos, sin)  # [B, W // 2 + 1, d] each
            kept = (torch.arange(real.shape[1], device=x.device) < self.bins)[:, None]  # [W // 2 + 1, 1]
            low = irfft_rows(real * kept, imag * kept, cos, sin, seq_len)  # [B, L, d]
        out = low + self.sqrt_beta.square() * (wide - low)
        return (out if mask is None else out * mask).to(x.dtype)

    def _causal_band(self, seq_len: int, like: Tensor) -> Tensor:
        """``[L, L]`` lower-triangular Toeplitz ``T[t, j] = h[t - j]``: the low band of the window
        ending at ``t``, read at its last row; ``h [L]`` is the band's circular kernel. A constant
        of the shape, built once per window width, device and dtype."""
        key = (seq_len, like.device, like.dtype)
        if key not in self._bands:
            self._bands[key] = self._build_band(seq_len, like)
        return self._bands[key]

    def _build_band(self, seq_len: int, like: Tensor) -> Tensor:
        cos, sin = dft_tables(seq_len, like.device, like.dtype)
        kept = (torch.arange(seq_len // 2 + 1, device=like.device) < self.bins).to(like.dtype)[:, None]
        kernel = irfft_rows(kept, torch.zeros_like(kept), cos, sin)[:, 0] / math.sqrt(seq_len)  # [L], irfft's scale
        lag = torch.arange(seq_len, device=like.device)
        lag = lag[:, None] - lag[None, :]  # [L, L] t - j
        return torch.where(lag >= 0, kernel[lag.clamp_min(0)], torch.zeros((), dtype=like.dtype, device=like.device))
