"""MultiHeadAttention against the direct formulas for QK-norm, soft-capping, masking and stats."""

from __future__ import annotations

import math

import pytest
import torch

from recsys.nn.attention import MultiHeadAttention, max_attention_logit, set_track_stats


def _direct(mha: MultiHeadAttention, x, lengths, causal, qk_norm, softcap):
    """Attention written out from the definitions (float64, explicit loops over nothing hidden)."""
    b, seq_len, dim = x.shape
    h, dh = mha.num_heads, mha.head_dim
    qkv = x @ mha.qkv.weight.t() + mha.qkv.bias
    q, k, v = (t.reshape(b, seq_len, h, dh).transpose(1, 2) for t in qkv.split(dim, dim=-1))

    def norm(t, layer):
        if qk_norm == "rms":
            return t / torch.sqrt((t * t).mean(-1, keepdim=True) + layer.eps) * layer.weight
        if qk_norm == "layer":
            mu = t.mean(-1, keepdim=True)
            var = ((t - mu) ** 2).mean(-1, keepdim=True)
            return (t - mu) / torch.sqrt(var + layer.eps) * layer.weight + layer.bias
        return t

    q, k = norm(q, mha.q_norm), norm(k, mha.k_norm)
    s = q @ k.transpose(-1, -2) / math.sqrt(dh)  # [B, H, L, L]
    raw_max = s
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    out = torch.zeros(b, h, seq_len, dh, dtype=x.dtype)
    visible_max = torch.tensor(float("-inf"), dtype=x.dtype)
    for bi in range(b):
        for i in range(seq_len):
            n = int(lengths[bi])
            keys = [j for j in range(n) if not causal or j <= i < n]  # causal: a row past the length is padding
            if not keys:
                continue
            p = torch.softmax(s[bi, :, i, keys], dim=-1)  # [H, n]
            out[bi, :, i] = torch.einsum("hn,hnd->hd", p, v[bi, :, keys])
            visible_max = torch.maximum(visible_max, raw_max[bi, :, i, keys].max())
    o = out.transpose(1, 2).reshape(b, seq_len, dim)
    return o @ mha.out.weight.t() + mha.out.bias, visible_max


def _module(qk_norm: str, softcap: float) -> MultiHeadAttention:
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, qk_norm=qk_norm, softcap=softcap, backend="torch").double()
    with torch.no_grad():
        mha.qkv.weight.mul_(4.0)  # logits of several units, so the cap bites
        for norm in (mha.q_norm, mha.k_norm):
            if norm is not None:
                norm.weight.uniform_(0.5, 3.0)
                if getattr(norm, "bias", None) is not None:
                    norm.bias.uniform_(-0.5, 0.5)
    return mha


@pytest.mark.parametrize("qk_norm", ["", "rms", "layer"])
@pytest.mark.parametrize("softcap", [0.0, 1.5])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_direct_formula(qk_norm, softcap, causal):
    mha = _module(qk_norm, softcap)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    lengths = torch.tensor([5, 1, 0])
    mha.track_stats = True
    got = mha(x, lengths, causal=causal)
    want, want_max = _direct(mha, x, lengths, causal, qk_norm, softcap)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # the reference softmax runs in fp32
    torch.testing.assert_close(mha.last_max_logit, want_max.to(mha.last_max_logit.dtype))
    assert not mha.last_max_logit.requires_grad


def test_softcap_and_qk_norm_change_the_output():
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    lengths = torch.tensor([6, 4])
    plain = _module("", 0.0)(x, lengths)
    capped = _module("", 1.5)(x, lengths)
    normed = _module("rms", 0.0)(x, lengths)
    assert (plain - capped).abs().max() > 1e-3
    assert (plain - normed).abs().max() > 1e-3


def test_softcap_bounds_logits_seen_by_kernel(monkeypatch):
    seen = {}

    def spy(q, k, v, **kw):
        seen.update(kw)
        return torch.zeros_like(q)

    monkeypatch.setattr("recsys.nn.attention.attention", spy)
    mha = MultiHeadAttention(8, 2, softcap=30.0, backend="torch")
    mha(torch.randn(1, 3, 8), torch.tensor([3]), causal=True)
    assert seen["softcap"] == 30.0 and seen["causal"] is True and seen["backend"] == "torch"
    assert seen["key_lengths"].tolist() == [3]


def test_track_stats_switch_on_a_model():
    model = torch.nn.ModuleList([_module("", 0.0), _module("rms", 0.0)])
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    lengths = torch.tensor([4, 2])
    for m in model:
        m(x, lengths)
    assert max_attention_logit(model) is None
    set_track_stats(model, True)
    maxima = []
    for m in model:
        m(x, lengths)
        maxima.append(m.last_max_logit)
    assert max_attention_logit(model) == max(maxima)
    set_track_stats(model, False)
    assert max_attention_logit(model) is None


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="qk_norm"):
        MultiHeadAttention(8, 2, qk_norm="l2")
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(8, 3)


@pytest.mark.parametrize("qk_norm", ["rms", "layer"])
def test_qk_norm_keeps_one_dtype_under_autocast(monkeypatch, qk_norm):
    seen = {}

    def spy(q, k, v, **kw):
        seen["dtypes"] = (q.dtype, k.dtype, v.dtype)
        return torch.zeros_like(v)

    monkeypatch.setattr("recsys.nn.attention.attention", spy)
    mha = MultiHeadAttention(8, 2, qk_norm=qk_norm, backend="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mha(torch.randn(2, 3, 8), torch.tensor([3, 1]))
    assert seen["dtypes"] == (torch.bfloat16,) * 3


def test_attention_dropout_drops_probabilities_while_training_only():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, backend="torch", dropout=0.5)
    x = torch.randn(3, 7, 16)
    lengths = torch.tensor([7, 3, 0])
    plain = MultiHeadAttention(16, 2, backend="torch")
    plain.load_state_dict(mha.state_dict())
    mha.eval()
    torch.testing.assert_close(mha(x, lengths, causal=True), plain(x, lengths, causal=True))
    mha.train()
    a, b = mha(x, lengths, causal=True), mha(x, lengths, causal=True)
    assert (a - b).abs().max() > 1e-3  # a fresh mask each call
    # padded query rows see no key: still exactly the output projection's bias
    bias = mha.out.bias.detach()
    torch.testing.assert_close(a[1, 3:], bias.expand(4, 16))
    torch.testing.assert_close(a[2], bias.expand(7, 16))
    # in expectation the dropped attention is the plain one: the mean of many masks approaches it
    mean = torch.stack([mha(x, lengths, causal=True) for _ in range(400)]).mean(0)
    assert (mean - plain(x, lengths, causal=True)).abs().max() < 0.1


def test_the_triton_backend_refuses_attention_dropout():
    from recsys.kernels import attention

    q = torch.randn(1, 1, 4, 16)
    with pytest.raises(ValueError, match="no attention dropout"):
        attention(q, q, q, backend="triton", dropout=0.1)
