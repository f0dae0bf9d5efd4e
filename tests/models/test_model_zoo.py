"""Every learned model: shapes, padding invariance, empty rows, training steps, config switches."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from recsys.config import ModelConfig
from recsys.models import build_model, model_names, spec_for
from recsys.nn.attention import MultiHeadAttention, max_attention_logit, set_track_stats
from recsys.run.settings import resolve_model

MODELS = [name for name in model_names() if spec_for(name).trainable]  # every learned model, from the registry
MULTI = {name for name in MODELS if spec_for(name).multi_interest}
QUERY_KEY = [name for name in MODELS if "qk_norm" in spec_for(name).settings]  # query-key attention layers
NUM_ITEMS, MAX_LEN, DIM, K = 30, 6, 8, 3


def _build(name: str, **overrides):
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, dim=DIM, num_interests=K, num_layers=2, num_heads=2, backend="torch", **overrides)
    return build_model(resolve_model(cfg, NUM_ITEMS), NUM_ITEMS, MAX_LEN)


def _batch():
    """Lengths 6, 3, 1, 0; ids at padded positions are non-zero garbage on purpose."""
    gen = torch.Generator().manual_seed(1)
    seq = torch.randint(1, NUM_ITEMS, (4, MAX_LEN), generator=gen)
    return seq, torch.tensor([6, 3, 1, 0])


@pytest.mark.parametrize("name", MODELS)
def test_shapes_and_tied_embeddings(name):
    model = _build(name)
    seq, lengths = _batch()
    out = model.interests(seq, lengths)
    k = K if name in MULTI else 1
    assert model.num_interests == k
    assert out.shape == (4, k, DIM)
    emb = model.item_embeddings()
    assert emb.shape == (NUM_ITEMS, DIM)
    assert any(emb is p for p in model.parameters())  # the input table is the output table


@pytest.mark.parametrize("name", MODELS)
def test_padded_ids_do_not_matter_and_empty_rows_are_zero(name):
    model = _build(name).eval()
    seq, lengths = _batch()
    other = seq.clone()
    padded = torch.arange(MAX_LEN)[None] >= lengths[:, None]
    other[padded] = seq[padded] % (NUM_ITEMS - 1) + 1  # a different real item at every padded slot
    assert (other[padded] != seq[padded]).all()
    base = model.interests(seq, lengths)
    torch.testing.assert_close(model.interests(other, lengths), base, rtol=0, atol=1e-6)
    assert torch.isfinite(base).all() and base[3].abs().max() == 0


def _full_softmax_loss(model, seq, lengths, targets):
    """ComiRec's hard readout (the interest closest to the target), full softmax over items 1..N-1."""
    interests = model.interests(seq, lengths)  # [B, K, d]
    emb = model.item_embeddings()
    pick = torch.einsum("bkd,bd->bk", interests, emb[targets]).argmax(dim=1)
    user = interests[torch.arange(len(seq)), pick]  # [B, d]
    logits = user @ emb[1:].t()
    return F.cross_entropy(logits, targets - 1)


@pytest.mark.parametrize("name", MODELS)
def test_trains_without_nan_on_length_one_and_empty_rows(name):
    model = _build(name, dropout=0.1).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    seq, lengths = _batch()
    seq = torch.cat([seq, torch.full((4, MAX_LEN), 7)])
    lengths = torch.cat([lengths, torch.tensor([1, 0, 0, 1])])
    targets = torch.arange(1, 9) * 3 % (NUM_ITEMS - 1) + 1
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = _full_softmax_loss(model, seq, lengths, targets)
        loss.backward()
        assert torch.isfinite(loss)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("name", MODELS)
def test_bf16_autocast_forward_and_backward_are_finite(name):
    model = _build(name, **({"qk_norm": "layer", "softcap": 5.0} if name.startswith("sasrec") else {}))
    seq, lengths = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.interests(seq, lengths)
    out.float().square().sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def _positions(head, lengths: torch.Tensor) -> torch.Tensor | float:
    """What the head adds to click ``l`` of each row, written out: ``[B, L, d]`` (or 0)."""
    if head.positions == "none":
        return 0.0
    if head.positions == "absolute":
        return head.pos[None, :MAX_LEN]
    back = (lengths[:, None] - 1 - torch.arange(MAX_LEN)[None]).clamp(min=0)  # clicks back from the latest
    return head.pos[back]


def _capped(scores, cap):
    return cap * torch.tanh(scores / cap) if cap else scores


@pytest.mark.parametrize("positions", ["recent", "absolute", "none"])
@pytest.mark.parametrize("cap", [0.0, 1.0], ids=["comirec", "score_cap"])
def test_comirec_sa_equals_direct_einsum(positions, cap):
    model = _build("comirec_sa", positions=positions, score_cap=cap)
    seq, lengths = _batch()
    emb, head = model.item_embeddings(), model.head
    valid = torch.arange(MAX_LEN)[None] < lengths[:, None]  # [B, L]
    h = emb[seq] * valid[..., None]  # [B, L, d]
    x = h + _positions(head, lengths)
    scores = _capped(torch.einsum("blh,hk->bkl", torch.tanh(torch.einsum("bld,dh->blh", x, head.w1)), head.w2), cap)
    attn = torch.softmax(scores.masked_fill(~valid[:, None], float("-inf")), dim=-1).nan_to_num(0.0)
    want = torch.einsum("bkl,bld->bkd", attn, h)
    torch.testing.assert_close(model.interests(seq, lengths), want)


@pytest.mark.parametrize("head_values", ["items", "encoded"])
def test_sasrec_mi_head_attends_from_encoder_states_and_pools_head_values(head_values):
    model = _build("sasrec_mi", head_values=head_values).eval()
    seq, lengths = _batch()
    valid = torch.arange(MAX_LEN)[None] < lengths[:, None]  # [B, L]
    h = model.embedding(seq, lengths)  # [B, L, d], zero at padded positions
    e = model.encoder(h, lengths)
    head = model.head
    scores = _capped(torch.tanh((e + _positions(head, lengths)) @ head.w1) @ head.w2, head.score_cap)  # [B, L, K]
    attn = torch.softmax(scores.masked_fill(~valid[..., None], float("-inf")), dim=1).nan_to_num(0.0)
    pooled = h if head_values == "items" else e
    torch.testing.assert_close(model.interests(seq, lengths), torch.einsum("blk,bld->bkd", attn, pooled))


def test_head_values_is_rejected_where_there_is_no_encoder_to_pool():
    with pytest.raises(ValueError, match="model.head_values"):
        _build("comirec_sa", head_values="encoded")


def test_sasrec_interest_is_the_encoder_state_at_the_last_click():
    model = _build("sasrec").eval()
    seq, lengths = _batch()
    states = model.encoder(model.embedding(seq, lengths), lengths)  # [B, L, d]
    out = model.interests(seq, lengths)
    for b, n in enumerate(lengths.tolist()):
        want = states[b, n - 1] if n else torch.zeros(DIM)
        torch.testing.assert_close(out[b, 0], want)


@pytest.mark.parametrize("name", QUERY_KEY)
def test_stability_switches_reach_every_attention_layer(name):
    # next_mi's automatic blocks (wearec's) have no attention
    attention = {"mixer": "attention"} if spec_for(name).automatic.mixer == "wavelet" else {}
    model = _build(name, qk_norm="layer", softcap=7.5, **attention)
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(layers) == 2
    assert all(m.softcap == 7.5 and isinstance(m.q_norm, torch.nn.LayerNorm) for m in layers)


@pytest.mark.parametrize("name", sorted(set(MODELS) - set(QUERY_KEY)))
def test_switches_rejected_where_there_is_no_query_key_attention(name):
    with pytest.raises(ValueError, match="model.qk_norm"):
        _build(name, qk_norm="rms")
    with pytest.raises(ValueError, match="model.softcap"):
        _build(name, softcap=10.0)


@pytest.mark.parametrize("mixer", ["frequency", "wavelet"])
@pytest.mark.parametrize("switch", [{"qk_norm": "layer"}, {"softcap": 7.5}, {"attention_dropout": 0.1}])
def test_attention_switches_refused_on_blocks_without_attention(mixer, switch):
    with pytest.raises(ValueError, match=f"model.{next(iter(switch))}: .*no attention"):
        _build("sasrec", mixer=mixer, **switch)


@pytest.mark.parametrize("name", ["comirec_sa", "sasrec", "sasrec_mi"])
def test_max_attention_logit_is_tracked_on_request(name):
    model = _build(name)
    seq, lengths = _batch()
    model.interests(seq, lengths)
    assert max_attention_logit(model) is None
    set_track_stats(model, True)
    model.interests(seq, lengths)
    value = max_attention_logit(model)
    assert value is not None and value.dim() == 0 and torch.isfinite(value) and not value.requires_grad
    if name == "comirec_sa":
        head = model.head
        h = model.embedding(seq, lengths)
        scores = _capped(torch.tanh((h + _positions(head, lengths)) @ head.w1) @ head.w2, head.score_cap)  # [B, L, K]
        valid = torch.arange(MAX_LEN)[None] < lengths[:, None]
        torch.testing.assert_close(value, scores[valid].max())


def test_mind_is_deterministic_in_eval():
    model = _build("mind").eval()
    seq, lengths = _batch()
    torch.testing.assert_close(model.interests(seq, lengths), model.interests(seq, lengths))


@pytest.mark.parametrize("name", ["comirec_sa", "comirec_dr", "sasrec"])
def test_sequences_longer_than_max_len_are_refused(name):
    model = _build(name)
    with pytest.raises(ValueError, match="max_len|L_max"):
        model.interests(torch.ones(1, MAX_LEN + 1, dtype=torch.long), torch.tensor([MAX_LEN + 1]))


def test_float_sequence_is_refused():
    with pytest.raises(ValueError, match="seq"):
        _build("gru4rec").interests(torch.ones(1, 3), torch.tensor([3]))


@pytest.mark.parametrize("name", ["mind", "comirec_dr"])
def test_capsule_models_report_their_routing_as_attention_in_click_order(name):
    """``interests_with_attention``: the same interests, and scores whose softmax over the valid
    clicks is each capsule's share of every click (``w_kl / sum_l w_kl``), in click order."""
    from recsys.kernels import length_softmax
    from recsys.nn.masking import recency_index

    model = _build(name).eval()
    seq, lengths = _batch()
    interests, scores = model.interests_with_attention(seq, lengths)
    torch.testing.assert_close(interests, model.interests(seq, lengths))
    assert not spec_for(name).self_attentive  # the routing carries no gradient: train.attention_reg does not apply
    h = model.embedding(seq, lengths)
    routing = model.routing
    if routing.bilinear == "per_position":  # routing runs on the clicks latest first
        h = h.gather(1, recency_index(lengths, MAX_LEN)[..., None].expand_as(h))
    w = routing.routing_weights(routing.predictions(h), lengths)  # [B, K, L], routing order
    if routing.bilinear == "per_position":
        w = w.gather(2, recency_index(lengths, MAX_LEN)[:, None].expand_as(w))
    share = w / w.sum(dim=2, keepdim=True).clamp_min(1e-30)
    attn = length_softmax(scores, lengths)  # [B, L, K]
    torch.testing.assert_close(attn.transpose(1, 2).to(share.dtype), share)
