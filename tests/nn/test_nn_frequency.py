"""BSARec's frequency filter against an fp64 DFT written out as a matrix, on the published layout."""

from __future__ import annotations

import math

import pytest
import torch

from recsys.nn.frequency import FrequencyFilter, low_band_bins


def _low_band_matrix(seq_len: int, bins: int) -> torch.Tensor:
    """``[L, L]`` fp64: the operator keeping DFT frequencies ``k`` with ``min(k, L - k) < bins``."""
    k = torch.arange(seq_len, dtype=torch.float64)
    keep = torch.minimum(k, seq_len - k) < bins
    t = torch.arange(seq_len, dtype=torch.float64)
    phase = 2 * math.pi * (t[:, None] - t[None, :]) * k[keep][:, None, None] / seq_len  # [K, L, L]
    return torch.cos(phase).sum(0) / seq_len


def _published(
    x: torch.Tensor, lengths: torch.Tensor, beta: torch.Tensor, bins: int, pads: bool = False
) -> torch.Tensor:
    """The published block's filter on the LEFT-padded window, then moved back to the right-padded
    layout: what BSARec computes at every valid click. Its padding rows are zero, or with ``pads``
    the right-padded tensor's padding rows in their order (and read back there too)."""
    b, seq_len, _ = x.shape
    out = torch.zeros_like(x, dtype=torch.float64)
    band = _low_band_matrix(seq_len, bins)
    for i in range(b):
        n = int(lengths[i])
        left = torch.zeros(seq_len, x.shape[2], dtype=torch.float64)
        left[seq_len - n :] = x[i, :n].double()
        if pads:
            left[: seq_len - n] = x[i, n:].double()
        low = band @ left
        filtered = low + beta.double() ** 2 * (left - low)
        out[i, :n] = filtered[seq_len - n :]
        if pads:
            out[i, n:] = filtered[: seq_len - n]
    return out


@pytest.mark.parametrize("seq_len", [1, 7, 50, 129])
@pytest.mark.parametrize("cutoff", [1, 5, 12])
@pytest.mark.parametrize("dim", [16, 64])
def test_filter_matches_the_published_left_padded_filter_in_fp64(seq_len, cutoff, dim):
    torch.manual_seed(seq_len * 100 + cutoff)
    f = FrequencyFilter(dim, cutoff)
    x = torch.randn(4, seq_len, dim)
    lengths = torch.tensor([seq_len, max(seq_len // 2, 1), 1, 0])
    out = f(x, lengths)
    ref = _published(x, lengths, f.sqrt_beta.detach(), low_band_bins(cutoff))
    assert torch.linalg.vector_norm(out.double() - ref) <= 1e-5 * torch.linalg.vector_norm(ref) + 1e-12
    assert out[3].abs().max() == 0  # a fully padded row is zero


@pytest.mark.parametrize("seq_len", [1, 7, 50, 129])
@pytest.mark.parametrize("dim", [16, 128])
def test_window_padding_is_the_published_filter_of_the_whole_left_padded_window(seq_len, dim):
    """``pads``: the padding rows are read as they are, placed as in a left-padded window."""
    torch.manual_seed(seq_len + dim)
    f = FrequencyFilter(dim, 5, pads=True)
    x = torch.randn(4, seq_len, dim)
    lengths = torch.tensor([seq_len, max(seq_len // 2, 1), 1, 0])
    out = f(x, lengths)
    ref = _published(x, lengths, f.sqrt_beta.detach(), low_band_bins(5), pads=True)
    assert torch.linalg.vector_norm(out.double() - ref) <= 1e-5 * torch.linalg.vector_norm(ref)
    if seq_len > 1:  # the padding changes what the clicks get
        zero = FrequencyFilter(dim, 5)
        zero.load_state_dict(f.state_dict())
        assert not torch.allclose(zero(x, lengths)[1, : lengths[1]], out[1, : lengths[1]])


def test_the_causal_filter_has_no_window_padding():
    with pytest.raises(ValueError, match="padding"):
        FrequencyFilter(8, 5, causal=True, pads=True)


def test_a_full_band_filter_is_a_rescaling_by_beta_squared():
    """With every frequency kept the low band is x itself: the output is x."""
    f = FrequencyFilter(8, 40)
    x = torch.randn(2, 9, 8)
    torch.testing.assert_close(f(x, torch.tensor([9, 9])), x, rtol=1e-5, atol=1e-5)


def test_gradients_are_finite_and_padding_gets_none():
    f = FrequencyFilter(16, 5)
    x = torch.randn(3, 7, 16, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([7, 3, 0])
    f.double()
    torch.autograd.gradcheck(lambda t: f(t, lengths), (x,))
    f(x, lengths).pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad[1, 3:].abs().max() == 0 and x.grad[2].abs().max() == 0


def test_bf16_input_comes_back_bf16_and_close():
    f = FrequencyFilter(16, 5)
    x = torch.randn(2, 50, 16)
    lengths = torch.tensor([50, 9])
    out = f(x.bfloat16(), lengths)
    assert out.dtype == torch.bfloat16
    assert torch.linalg.vector_norm(out.float() - f(x, lengths)) <= 2e-2 * torch.linalg.vector_norm(f(x, lengths))


def test_cutoff_below_one_is_refused():
    with pytest.raises(ValueError, match="filter_cutoff"):
        FrequencyFilter(8, 0)


@pytest.mark.parametrize("seq_len", [1, 7, 50])
@pytest.mark.parametrize("cutoff", [1, 5])
def test_the_causal_filter_gives_every_position_the_published_filter_of_its_prefix(seq_len, cutoff):
    """Position t of the causal filter = the window filter of clicks 0..t read at its last click."""
    torch.manual_seed(seq_len + cutoff)
    causal, window = FrequencyFilter(16, cutoff, causal=True), FrequencyFilter(16, cutoff)
    window.load_state_dict(causal.state_dict())
    x = torch.randn(2, seq_len, 16, dtype=torch.float64)
    causal.double(), window.double()
    lengths = torch.tensor([seq_len, max(seq_len - 3, 0)])
    out = causal(x, lengths)
    for b in range(2):
        for t in range(int(lengths[b])):
            prefix = window(x[b : b + 1], torch.tensor([t + 1]))[0, t]
            torch.testing.assert_close(out[b, t], prefix, rtol=1e-10, atol=1e-10)
    if lengths[1] < seq_len:
        assert out[1, int(lengths[1]) :].abs().max() == 0
    # and it never reads ahead
    later = x.clone()
    later[:, -1] += 1.0
    torch.testing.assert_close(causal(later, lengths)[:, :-1], out[:, :-1])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq_len", [1, 7, 29])
def test_a_narrower_batch_is_filtered_as_its_rows_in_the_whole_window(seq_len, causal):
    """With the model's window (``width``), an input narrower than it gives what its rows give
    zero-padded to the whole window, so a user's interests do not follow the batch's width."""
    torch.manual_seed(seq_len)
    width, dim = 30, 6
    f = FrequencyFilter(dim, 5, causal, width=width).double()
    x, lengths = torch.randn(3, seq_len, dim, dtype=torch.float64), torch.tensor([seq_len, 1, 0])
    wide = torch.cat([x, torch.zeros(3, width - seq_len, dim, dtype=torch.float64)], dim=1)
    torch.testing.assert_close(f(x, lengths), f(wide, lengths)[:, :seq_len])
    assert f(x, lengths)[2].abs().max() == 0  # a fully padded row stays zero
    with pytest.raises(ValueError, match="longer than the filter's 30"):
        f(torch.randn(1, 31, dim, dtype=torch.float64), torch.tensor([31]))
