"""WEARec's wavelet mixer against an fp64 reference written from the published block's formulas,
on its LEFT-padded window (a DFT and a Haar level written out by hand)."""

from __future__ import annotations

import math

import pytest
import torch

from recsys.nn.wavelet import WaveletFilter


def _global_branch(window: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``window [W, dh]`` fp64, ``scale, shift [W // 2 + 1]``: the orthonormal real DFT along the rows,
    each bin ``k`` times ``scale[k]`` plus ``shift[k]`` (a real number), and the real inverse."""
    rows = window.shape[0]
    t = torch.arange(rows, dtype=torch.float64)
    k = torch.arange(rows // 2 + 1, dtype=torch.float64)
    angle = 2 * math.pi * k[:, None] * t[None, :] / rows  # [F, W]
    real = torch.cos(angle) @ window / math.sqrt(rows)  # [F, dh]
    imag = -torch.sin(angle) @ window / math.sqrt(rows)
    real, imag = real * scale[:, None] + shift[:, None], imag * scale[:, None]
    # the inverse of a half spectrum: bins 1 .. W/2 - 1 count twice, DC and Nyquist once (real parts)
    weight = torch.full((rows // 2 + 1,), 2.0, dtype=torch.float64)
    weight[0] = 1.0
    weight[-1] = 1.0 if rows % 2 == 0 else 2.0
    return (torch.cos(angle).T @ (weight[:, None] * real) - torch.sin(angle).T @ (weight[:, None] * imag)) / math.sqrt(
        rows
    )


def _published(f: WaveletFilter, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """What the published block computes at every valid click: each row's clicks at the end of a
    left-padded window of ``f.width`` rows, both branches per head, read back at the clicks. The
    window's padding rows are zero, or with ``f.pads`` the right-padded tensor's padding rows in
    their order (zero past its width), read back there too."""
    b, seq_len, dim = x.shape
    heads, width = f.heads, f.width
    dh = dim // heads
    out = torch.zeros(b, seq_len, dim, dtype=torch.float64)
    mlp = [layer.double() for layer in (f.adapt[0], f.adapt[2])]
    for i in range(b):
        n = int(lengths[i])
        window = torch.zeros(width, dim, dtype=torch.float64)
        window[width - n :] = x[i, :n].double()
        if f.pads:
            window[: seq_len - n] = x[i, n:].double()
        hidden = mlp[0](window.mean(0))
        adapt = mlp[1](0.5 * hidden * (1 + torch.erf(hidden / math.sqrt(2)))).view(heads, width // 2 + 1, 2)
        mixed = torch.zeros(width, dim, dtype=torch.float64)
        for h in range(heads):
            part = window[:, h * dh : (h + 1) * dh]
            scale = f.base_scale[h, :, 0].double() * (1 + adapt[h, :, 0])
            shift = f.base_shift[h, :, 0].double() + adapt[h, :, 1]
            glob = _global_branch(part, scale, shift)
            haar = torch.zeros_like(part)
            for j in range(width // 2):
                approx = (part[2 * j] + part[2 * j + 1]) / 2
                detail = (part[2 * j] - part[2 * j + 1]) / 2 * f.detail_scale[h, j].double()
                haar[2 * j], haar[2 * j + 1] = approx + detail, approx - detail
            mixed[:, h * dh : (h + 1) * dh] = f.alpha * glob + (1 - f.alpha) * haar
        out[i, :n] = mixed[width - n :]
        if f.pads:
            out[i, n:] = mixed[: seq_len - n]
    return out


def _filter(dim: int, heads: int, max_len: int, alpha: float = 0.3, pads: bool = False) -> WaveletFilter:
    f = WaveletFilter(dim, heads, max_len, alpha, pads=pads)
    with torch.no_grad():  # away from the start's near-identity, so every parameter shows
        f.detail_scale.normal_()
        f.base_scale.uniform_(0.5, 1.5)
        f.base_shift.normal_(std=0.3)
    return f


@pytest.mark.parametrize("seq_len", [1, 7, 50, 129])
@pytest.mark.parametrize(("dim", "heads"), [(16, 1), (64, 4), (128, 8)])
def test_matches_the_published_left_padded_block_in_fp64(seq_len, dim, heads):
    torch.manual_seed(seq_len * 10 + heads)
    max_len = seq_len + (seq_len % 3)  # the window is at times wider than the batch, odd or even
    f = _filter(dim, heads, max_len).double()
    x = torch.randn(4, seq_len, dim, dtype=torch.float64)
    lengths = torch.tensor([seq_len, max(seq_len // 2, 1), 1, 0])
    out = f(x, lengths)
    ref = _published(f, x, lengths)
    assert torch.linalg.vector_norm(out - ref) <= 1e-10 * torch.linalg.vector_norm(ref)
    assert out[3].abs().max() == 0  # a fully padded row is zero


@pytest.mark.parametrize("seq_len", [1, 7, 50, 129])
@pytest.mark.parametrize(("dim", "heads"), [(16, 1), (128, 8)])
def test_window_padding_is_the_published_block_of_the_whole_left_padded_window(seq_len, dim, heads):
    """``pads``: the padding rows are read as they are, placed as in a left-padded window."""
    torch.manual_seed(seq_len * 7 + heads)
    max_len = seq_len + (seq_len % 3)
    f = _filter(dim, heads, max_len, pads=True).double()
    x = torch.randn(4, seq_len, dim, dtype=torch.float64)
    lengths = torch.tensor([seq_len, max(seq_len // 2, 1), 1, 0])
    out = f(x, lengths)
    ref = _published(f, x, lengths)
    assert torch.linalg.vector_norm(out - ref) <= 1e-10 * torch.linalg.vector_norm(ref)
    if seq_len > 1:  # the padding changes what the clicks get
        f.pads = False
        assert not torch.allclose(f(x, lengths)[1, : lengths[1]], out[1, : lengths[1]])


def test_float32_is_close_to_the_fp64_reference():
    torch.manual_seed(1)
    f = _filter(32, 4, 50)
    x = torch.randn(3, 50, 32)
    lengths = torch.tensor([50, 13, 0])
    ref = _published(f, x, lengths)
    assert torch.linalg.vector_norm(f(x, lengths).double() - ref) <= 1e-5 * torch.linalg.vector_norm(ref)


def test_an_odd_window_keeps_the_latest_click():
    """The published block drops the last row of an odd window, left-padded the latest click; here
    the window gains a zero row in front instead, so the latest click changes the output."""
    torch.manual_seed(2)
    f = _filter(8, 2, 7)
    assert f.width == 8
    x = torch.randn(1, 7, 8)
    changed = x.clone()
    changed[0, 6] += 1.0
    lengths = torch.tensor([7])
    assert (f(changed, lengths)[0, 6] - f(x, lengths)[0, 6]).abs().max() > 1e-3


def test_padding_content_is_ignored_and_gradients_stay_finite():
    torch.manual_seed(3)
    f = _filter(16, 2, 9).double()
    x = torch.randn(3, 9, 16, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([9, 4, 0])
    changed = x.detach().clone()
    changed[1, 4:] = torch.randn(5, 16, dtype=torch.float64)
    changed[2] = torch.randn(9, 16, dtype=torch.float64)
    torch.testing.assert_close(f(changed, lengths), f(x, lengths), rtol=0, atol=0)
    torch.autograd.gradcheck(lambda t: f(t, lengths), (x,))
    f(x, lengths).pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad[1, 4:].abs().max() == 0 and x.grad[2].abs().max() == 0
    assert all(torch.isfinite(p.grad).all() for p in f.parameters())


def test_bf16_input_comes_back_bf16_and_close():
    torch.manual_seed(4)
    f = _filter(16, 2, 50)
    x = torch.randn(2, 50, 16)
    lengths = torch.tensor([50, 9])
    out = f(x.bfloat16(), lengths)
    assert out.dtype == torch.bfloat16
    assert torch.linalg.vector_norm(out.float() - f(x, lengths)) <= 2e-2 * torch.linalg.vector_norm(f(x, lengths))


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="num_heads"):
        WaveletFilter(10, 4, 8, 0.5)
    with pytest.raises(ValueError, match="max_len"):
        WaveletFilter(8, 2, 6, 0.5)(torch.randn(1, 7, 8), torch.tensor([7]))
