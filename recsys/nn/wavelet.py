"""WEARec's token mixer: an input-adaptive frequency filter blended with a one-level Haar wavelet.

WEARec (Xu et al., AAAI 2026) replaces self-attention with two filters of each head's features
along the sequence, blended ``α : 1 - α``:

- **global**: the window's spectrum ``X = rfft(x)`` is rescaled and shifted per head and
  frequency bin, ``X ⊙ f + b``, where ``f = f₀ ⊙ (1 + s)`` and ``b = b₀ + t`` mix learned constants
  (``f₀`` ones, ``b₀`` −0.1) with ``(s, t)`` read from the user's whole window by a small MLP of its
  mean row, so every user gets their own filter; then ``irfft``;
- **local**: a one-level Haar transform over adjacent pairs of rows ``(2j, 2j + 1)``, whose detail
  coefficients ``(x₂ⱼ - x₂ⱼ₊₁) / 2`` are rescaled by a learned weight per pair, head and feature before
  the pairs are rebuilt (the weights start at ``N(0, 0.02)``, so the branch starts as a pairwise mean).

Both are position-dependent (the additive ``b`` is a fixed wave along the window, the Haar pairs
and their weights sit at fixed rows), so the layout matters: the published block filters a
LEFT-padded window of ``max_len`` rows. recsys pads on the right; this module moves each row's
clicks to the end of a ``max_len``-row window, filters it there and moves them back, so every valid
click gets what the published block computes for it. What differs, on purpose:

- padding rows are zero (the published window carries LayerNorm'd position embeddings there), so a
  user's representation does not depend on what sits in their padding; the MLP's mean row is the
  clicks' sum over ``max_len``. ``model.filter_padding = "window"`` (``pads``) reads them as the
  published block does instead: the window's padding rows are the right-padded tensor's padding
  rows in their order (the rows the encoder computed there, positioned as in a left-padded window:
  :mod:`recsys.nn.frequency`), and the filter's output at each of them goes back there;
- an odd ``max_len`` gets one more zero row at the window's start, so the latest click is always in
  a pair (the published block drops the last row of an odd window, which left-padded is the latest click).

Not causal: position ``t`` reads every click of the window, so such a model trains on a window's
last position only (``train.predict_at = "last"``), as the published one does.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from recsys.nn.dft import dft_tables, irfft_rows, rfft_rows


class WaveletFilter(nn.Module):
    """``x [B, L, d]``, ``lengths [B]`` -> ``α · global(x) + (1 - α) · haar(x)`` ``[B, L, d]``, 0 at padding
    (filtered there too with ``pads``).

    Computed in at least float32 (DFT tables, :mod:`recsys.nn.dft`) on the left-padded window of
    ``max_len`` rows (rounded up to even), returned in ``x``'s dtype and right-padded layout.

    Args:
        dim: width ``d``, split into ``num_heads`` heads of ``d / num_heads`` features.
        num_heads: WEARec's heads: the global filter has one scale and shift per head and bin.
        max_len: the window's rows (``data.max_len``); ``L <= max_len``.
        alpha: the global branch's weight (WEARec's ``alpha``; ``model.filter_alpha``).
        pads: read the padding rows as they are (``model.filter_padding = "window"``) instead of zeros.
    """

    def __init__(self, dim: int, num_heads: int, max_len: int, alpha: float, *, pads: bool = False):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"model.dim ({dim}) must be a multiple of model.num_heads ({num_heads})")
        self.heads = num_heads
        self.width = max_len + max_len % 2  # the window's rows, even
        self.bins = self.width // 2 + 1
        self.alpha = alpha
        self.pads = pads
        head_dim = dim // num_heads
        self.detail_scale = nn.Parameter(torch.randn(num_heads, self.width // 2, head_dim) * 0.02)
        self.base_scale = nn.Parameter(torch.ones(num_heads, self.bins, 1))
        self.base_shift = nn.Parameter(torch.full((num_heads, self.bins, 1), -0.1))
        self.adapt = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, num_heads * self.bins * 2))

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        batch, seq_len, dim = x.shape
        if seq_len > self.width:
            raise ValueError(f"a window of {seq_len} rows is longer than the filter's {self.width} (data.max_len)")
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        rows = self._left_rows(lengths, seq_len)  # [B, W]: the right-padded row at each window row, -1 for none
        window = torch.where(
            rows[..., None] >= 0, wide.gather(1, rows.clamp_min(0)[..., None].expand(-1, -1, dim)), 0.0
        )  # [B, W, d]
        heads = window.view(batch, self.width, self.heads, -1).transpose(1, 2)  # [B, H, W, dh]
        mixed = self.alpha * self._global(heads, window) + (1 - self.alpha) * self._haar(heads)
        mixed = mixed.transpose(1, 2).reshape(batch, self.width, dim)  # [B, W, d]
        row = torch.arange(seq_len, device=x.device)[None]  # [1, L]
        valid = row < lengths[:, None]  # [B, L]
        back = torch.where(valid, self.width - lengths[:, None] + row, row - lengths[:, None])  # [B, L]: window row
        out = mixed.gather(1, back[..., None].expand(-1, -1, dim))  # [B, L, d]
        return (out if self.pads else torch.where(valid[..., None], out, 0.0)).to(x.dtype)

    def _left_rows(self, lengths: Tensor, seq_len: int) -> Tensor:
        """``[B, W]``: for each row ``p`` of the left-padded window, the right-padded row holding its
        click (``p - (W - length)``); at the window's padding the right-padded padding row in its
        order (``length + p``) with ``pads``, and -1 (a zero row) where there is none or without."""
        pos = torch.arange(self.width, device=lengths.device)[None]  # [1, W]
        src = pos - (self.width - lengths[:, None])
        pad = lengths[:, None] + pos if self.pads else torch.full_like(src, -1)
        return torch.where(src >= 0, src, torch.where(pad < seq_len, pad, -1))

    def _global(self, heads: Tensor, window: Tensor) -> Tensor:
        """The per-user frequency filter of ``heads [B, H, W, dh]``; ``window [B, W, d]`` feeds its MLP."""
        batch = heads.shape[0]
        cos, sin = dft_tables(self.width, heads.device, heads.dtype)
        real, imag = rfft_rows(heads, cos, sin)  # [B, H, F, dh] each
        first = self.adapt[0]
        assert isinstance(first, nn.Linear)
        adapt = self.adapt(window.mean(dim=1).to(first.weight.dtype)).to(heads.dtype)  # [B, H·F·2]
        scale, shift = adapt.view(batch, self.heads, self.bins, 2).unbind(-1)  # [B, H, F] each
        gain = self.base_scale * (1 + scale[..., None])  # [B, H, F, 1]: a real rescale of each bin
        shift = self.base_shift + shift[..., None]  # ... and a real shift
        return irfft_rows(real * gain + shift, imag * gain, cos, sin)  # [B, H, W, dh]

    def _haar(self, heads: Tensor) -> Tensor:
        """One Haar level of ``heads [B, H, W, dh]`` with learned detail weights, rebuilt."""
        even, odd = heads[:, :, 0::2], heads[:, :, 1::2]  # [B, H, W/2, dh]
        approx = (even + odd) / 2
        detail = (even - odd) / 2 * self.detail_scale
        return torch.stack([approx + detail, approx - detail], dim=3).flatten(2, 3)  # [B, H, W, dh]
