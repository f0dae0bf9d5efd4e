"""The causal encoder: no look-ahead, padding ignored, finite on empty rows."""

from __future__ import annotations

import pytest
import torch

from recsys.nn.transformer import ATTENTION_MIXERS, EncoderShape, TransformerEncoder


def _encoder(dropout: float = 0.0, causal: bool = True, **shape) -> TransformerEncoder:
    torch.manual_seed(0)
    # the attention's stability switches where there is attention (the filters alone refuse them)
    switches = {"qk_norm": "rms", "softcap": 5.0} if shape.get("mixer", "attention") in ATTENTION_MIXERS else {}
    shape = {**switches, "backend": "torch", **shape}
    return TransformerEncoder(8, 2, 2, 7, dropout=dropout, causal=causal, shape=EncoderShape(**shape)).eval()


BSAREC = {"mixer": "hybrid", "block": "post_norm", "filter_cutoff": 3, "attention_dropout": 0.5}
WEAREC = {"mixer": "wavelet", "block": "post_norm", "filter_alpha": 0.2}
WINDOW = {"filter_padding": "window"}


@pytest.mark.parametrize("shape", [{}, {"mixer": "hybrid", "filter_causal": True, "block": "ligr"}])
def test_causal_encoder_never_looks_ahead(shape):
    enc = _encoder(**shape)
    h = torch.randn(2, 7, 8)
    lengths = torch.tensor([7, 5])
    base = enc(h, lengths)
    for j in range(5):
        changed = h.clone()
        changed[:, j] += torch.randn(2, 8)
        out = enc(changed, lengths)
        torch.testing.assert_close(out[:, :j], base[:, :j], rtol=0, atol=1e-6)
        assert (out[:, j] - base[:, j]).abs().max() > 1e-4


def test_bidirectional_encoder_does_look_ahead():
    enc = _encoder(causal=False)
    h = torch.randn(1, 7, 8)
    lengths = torch.tensor([7])
    changed = h.clone()
    changed[:, 6] += torch.randn(8)
    assert (enc(changed, lengths)[:, 0] - enc(h, lengths)[:, 0]).abs().max() > 1e-4


@pytest.mark.parametrize(
    ("causal", "shape"),
    [
        (True, {}),
        (False, {}),
        (True, BSAREC),
        (True, {"mixer": "frequency"}),
        (True, {"block": "post_norm"}),
        (True, WEAREC),
        (True, {**BSAREC, **WINDOW}),
        (True, {**WEAREC, **WINDOW}),
    ],
)
def test_padding_is_ignored_and_zeroed(causal, shape):
    enc = _encoder(causal=causal, **shape)
    h = torch.randn(3, 7, 8)
    lengths = torch.tensor([3, 7, 1])
    base = enc(h, lengths)
    changed = h.clone()
    changed[0, 3:] = torch.randn(4, 8)
    changed[2, 1:] = torch.randn(6, 8)
    out = enc(changed, lengths)
    torch.testing.assert_close(out, base, rtol=0, atol=1e-6)
    assert base[0, 3:].abs().max() == 0 and base[2, 1:].abs().max() == 0


@pytest.mark.parametrize(
    "shape", [{}, BSAREC, {"mixer": "frequency"}, WEAREC, {**BSAREC, **WINDOW}, {**WEAREC, **WINDOW}]
)
def test_empty_and_single_rows_have_finite_outputs_and_gradients(shape):
    enc = _encoder(dropout=0.1, **shape).train()
    h = torch.randn(2, 7, 8, requires_grad=True)
    lengths = torch.tensor([0, 1])
    out = enc(h, lengths)
    assert torch.isfinite(out).all() and out[0].abs().max() == 0
    out.pow(2).sum().backward()
    assert torch.isfinite(h.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in enc.parameters() if p.grad is not None)


def test_too_long_sequence_names_max_len():
    with pytest.raises(ValueError, match="max_len"):
        _encoder()(torch.randn(1, 8, 8), torch.tensor([8]))


@pytest.mark.parametrize("shape", [BSAREC, WEAREC])
def test_the_filter_reads_the_whole_window_so_it_is_not_causal(shape):
    """BSARec's and WEARec's filters mix later clicks into earlier positions (recsys.nn.frequency,
    recsys.nn.wavelet): only a window's last position may be trained, which the resolver enforces."""
    enc = _encoder(**shape)
    h = torch.randn(1, 7, 8)
    lengths = torch.tensor([7])
    changed = h.clone()
    changed[:, 6] += torch.randn(8)
    assert (enc(changed, lengths)[:, 0] - enc(h, lengths)[:, 0]).abs().max() > 1e-4
    assert not EncoderShape(**shape).causal_mixer and EncoderShape().causal_mixer


@pytest.mark.parametrize("mixer", ["frequency", "wavelet"])
def test_window_padding_gives_the_clicks_what_the_whole_left_padded_window_gives(mixer):
    """``filter_padding = "window"``: a right-padded row's clicks get what the published encoder gives
    them in its left-padded window, whose padding rows hold their positions' embeddings: here the
    same encoder on the left-padded window read as a full one (zero item rows at the padding)."""
    torch.manual_seed(3)
    shape = EncoderShape(mixer=mixer, block="post_norm", filter_padding="window", backend="torch")
    enc = TransformerEncoder(8, 2, 2, 8, causal=True, shape=shape).eval()
    lengths = torch.tensor([8, 5, 1])
    h = torch.randn(3, 8, 8) * (torch.arange(8)[None, :] < lengths[:, None])[..., None]
    out = enc(h, lengths)
    for b, n in enumerate(lengths.tolist()):
        left = torch.zeros(1, 8, 8)
        left[0, 8 - n :] = h[b, :n]
        full = enc(left, torch.tensor([8]))[0, 8 - n :]
        torch.testing.assert_close(out[b, :n], full, rtol=1e-5, atol=1e-5)
    zero = TransformerEncoder(
        8, 2, 2, 8, causal=True, shape=EncoderShape(mixer=mixer, block="post_norm", backend="torch")
    )
    zero.load_state_dict(enc.state_dict())
    assert not torch.allclose(zero.eval()(h, lengths)[1, :5], out[1, :5], atol=1e-4)


def test_window_padding_has_no_causal_form():
    with pytest.raises(ValueError, match="filter_padding"):
        EncoderShape(mixer="hybrid", filter_causal=True, filter_padding="window")


def test_pre_norm_attention_block_keeps_its_parameter_names():
    """Saved sasrec runs load: the default block's state-dict keys are the ones they were saved with."""
    keys = set(_encoder().state_dict())
    assert {"blocks.0.norm1.weight", "blocks.0.attn.qkv.weight", "blocks.0.norm2.bias", "norm.weight"} <= keys
    assert not any("filter" in k or "embed_norm" in k for k in keys)


def test_the_wavelet_mixer_has_no_causal_form():
    with pytest.raises(ValueError, match="filter_causal"):
        EncoderShape(mixer="wavelet", filter_causal=True)


@pytest.mark.parametrize("field", ["mixer", "block", "filter_padding"])
def test_unknown_shape_names_its_setting(field):
    with pytest.raises(ValueError, match=f"model.{field}"):
        EncoderShape(**{field: "bogus"})


def test_a_ligr_block_is_its_gated_formula():
    """One LiGR block by hand from its parameters: x + σ(Wa x) ⊙ attn(LN x), then the same with SwiGLU."""
    import torch.nn.functional as F

    from recsys.nn.transformer import TransformerBlock

    torch.manual_seed(0)
    block = TransformerBlock(8, 2, shape=EncoderShape(block="ligr", backend="torch")).eval()
    x = torch.randn(2, 5, 8)
    lengths = torch.tensor([5, 3])
    h = x + torch.sigmoid(block.mix_gate(x)) * block.attn(block.norm1(x), lengths, True)
    u = block.norm2(h)
    ffn = block.ffn.down(F.silu(block.ffn.gate(u)) * block.ffn.up(u))
    torch.testing.assert_close(block(x, lengths, True), h + torch.sigmoid(block.ffn_gate(h)) * ffn)


@pytest.mark.parametrize("shape", [{"block": "ligr"}, {"block": "ligr", "mixer": "hybrid"}])
def test_ligr_encoders_ignore_padding_and_stay_finite(shape):
    enc = _encoder(**shape)
    h = torch.randn(3, 7, 8)
    lengths = torch.tensor([3, 7, 0])
    changed = h.clone()
    changed[0, 3:] = torch.randn(4, 8)
    torch.testing.assert_close(enc(changed, lengths), enc(h, lengths), rtol=0, atol=1e-6)
    assert enc(h, lengths)[2].abs().max() == 0
