"""Capsule routing: squash, shapes, masking, and agreement with ComiRec's routing written out."""

from __future__ import annotations

import pytest
import torch

from recsys.nn.capsule import CapsuleRouting, squash


def _comirec_routing(layer: CapsuleRouting, h, lengths, init_logits, iters):
    """ComiRec's CapsuleNetwork.call, step by step (tile/where/matmul as in the TF code)."""
    n, t, c = h.shape
    k = layer.num_interests
    mask = (torch.arange(t)[None] < lengths[:, None]).to(h.dtype)  # [N, T]
    u = h * mask[..., None]  # ComiRec masks the history embeddings
    if layer.bilinear == "per_position":
        hat = (layer.weight[None, :t] * u[:, :, None, :]).sum(-1)  # [N, T, K*C]
    else:
        hat = torch.cat([u @ layer.linear.weight.t()] * k, dim=-1)  # tf.tile([1, 1, K])
    hat = hat.reshape(n, t, k, c).permute(0, 2, 1, 3)  # [N, K, T, C]
    hat_iter = hat.detach()  # tf.stop_gradient
    weight = init_logits.clone()  # [N, K, T]
    for i in range(iters):
        atten_mask = mask[:, None, :].expand(n, k, t)
        w = torch.softmax(weight, dim=1)
        w = torch.where(atten_mask == 0, torch.zeros_like(w), w)[:, :, None, :]  # [N, K, 1, T]
        cap = w @ (hat_iter if i < iters - 1 else hat)  # [N, K, 1, C]
        norm = (cap * cap).sum(-1, keepdim=True)
        cap = norm / (1 + norm) / torch.sqrt(norm + 1e-9) * cap
        if i < iters - 1:
            weight = weight + (hat_iter @ cap.transpose(2, 3)).reshape(n, k, t)
    return cap.reshape(n, k, c)


def _layer(bilinear: str, init_logits: str, iters: int = 3, positions: str = "absolute") -> CapsuleRouting:
    torch.manual_seed(0)
    return (
        CapsuleRouting(6, 3, 5, bilinear=bilinear, init_logits=init_logits, iters=iters, positions=positions)
        .double()
        .eval()
    )


def _masked_history(lengths, seq_len=5, dim=6):
    h = torch.randn(len(lengths), seq_len, dim, dtype=torch.float64)
    return h * (torch.arange(seq_len)[None] < lengths[:, None])[..., None]


@pytest.mark.parametrize(
    "bilinear,init,iters", [("per_position", "zeros", 3), ("shared", "normal", 3), ("per_position", "zeros", 1)]
)
def test_matches_comirec_routing_values_and_gradients(bilinear, init, iters):
    layer = _layer(bilinear, init, iters)
    lengths = torch.tensor([5, 2, 1, 0])
    h = _masked_history(lengths).requires_grad_()
    init_logits = layer.initial_logits(4, 5, h).detach()
    got = layer(h, lengths)
    want = _comirec_routing(layer, h, lengths, init_logits, iters)
    torch.testing.assert_close(got, want)
    probe = torch.randn_like(got)
    params = [h, *layer.parameters()]
    grads_got = torch.autograd.grad((got * probe).sum(), params)
    grads_want = torch.autograd.grad((want * probe).sum(), params)
    for g, w in zip(grads_got, grads_want, strict=True):
        torch.testing.assert_close(g, w)


def test_recent_positions_route_the_clicks_latest_first():
    """positions="recent": ComiRec's routing applied to each row's valid clicks in reverse order."""
    layer = _layer("per_position", "zeros", positions="recent")
    lengths = torch.tensor([5, 3, 1, 0])
    h = _masked_history(lengths)
    reversed_h = torch.zeros_like(h)
    for row, n in enumerate(lengths.tolist()):
        reversed_h[row, :n] = h[row, :n].flip(0)
    want = _comirec_routing(layer, reversed_h, lengths, layer.initial_logits(4, 5, h), iters=3)
    torch.testing.assert_close(layer(h, lengths), want)
    absolute = _layer("per_position", "zeros", positions="absolute")
    assert (absolute(h, lengths) - want)[:2].abs().max() > 1e-3  # the maps read other clicks


def test_routing_shapes_and_weights():
    layer = _layer("per_position", "zeros")
    lengths = torch.tensor([5, 3, 0])
    h = _masked_history(lengths)
    hat = layer.predictions(h)
    assert hat.shape == (3, 3, 5, 6)
    w = layer.routing_weights(hat, lengths)
    assert w.shape == (3, 3, 5) and not w.requires_grad
    valid = torch.arange(5)[None] < lengths[:, None]
    torch.testing.assert_close(w.sum(dim=1)[valid], torch.ones(int(valid.sum()), dtype=w.dtype))
    assert w.permute(0, 2, 1)[~valid].abs().max() == 0  # padded positions get no weight
    assert layer(h, lengths).shape == (3, 3, 6)


@pytest.mark.parametrize("bilinear,init", [("per_position", "zeros"), ("shared", "normal")])
def test_padded_positions_do_not_matter(bilinear, init):
    layer = _layer(bilinear, init)
    lengths = torch.tensor([2, 4])
    h = _masked_history(lengths)
    garbage = h.clone()
    garbage[0, 2:] = torch.randn(3, 6, dtype=torch.float64)
    garbage[1, 4:] = torch.randn(1, 6, dtype=torch.float64)
    torch.testing.assert_close(layer(garbage, lengths), layer(h, lengths))


def test_squash_norms_below_one_and_direction_kept():
    z = torch.randn(50, 8) * torch.logspace(-3, 1, 50)[:, None]
    s = squash(z)
    norms = s.norm(dim=-1)
    assert (norms < 1).all()
    torch.testing.assert_close(norms, z.norm(dim=-1) ** 2 / (1 + z.norm(dim=-1) ** 2), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(torch.nn.functional.normalize(s, dim=-1), torch.nn.functional.normalize(z, dim=-1))
    zero = torch.zeros(2, 8, requires_grad=True)
    squash(zero).sum().backward()
    assert squash(zero).abs().max() == 0 and torch.isfinite(zero.grad).all()


def test_random_initial_logits_train_vs_eval():
    layer = _layer("shared", "normal")
    lengths = torch.tensor([5, 5])
    h = _masked_history(lengths)
    torch.testing.assert_close(layer(h, lengths), layer(h, lengths))  # eval: fixed table
    layer.train()
    torch.manual_seed(3)
    a = layer(h, lengths)
    b = layer(h, lengths)
    torch.manual_seed(3)
    torch.testing.assert_close(layer(h, lengths), a)  # reproducible under a seed
    assert (a - b).abs().max() > 0  # fresh logits per batch
    logits = layer.initial_logits(1000, 5, h)
    assert logits.abs().max() <= 2.0 and 0.7 < logits.std() < 1.0  # truncated N(0, 1) has std 0.88


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="bilinear"):
        CapsuleRouting(4, 2, 5, bilinear="dense", init_logits="zeros")
    with pytest.raises(ValueError, match="model.positions"):
        CapsuleRouting(4, 2, 5, bilinear="per_position", init_logits="zeros", positions="none")
    with pytest.raises(ValueError, match="max_len"):
        _layer("per_position", "zeros")(torch.randn(1, 6, 6, dtype=torch.float64), torch.tensor([6]))
