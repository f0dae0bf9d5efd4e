"""The max-over-interests score kernels (``recsys.kernels.max_interest_scores``) against an fp64
reference: scores and both gradients, the winner routing, NaN, empty and bad inputs, the
registered operator and ``torch.compile``.

Accuracy rule (the other kernels'): the kernel's largest error against the fp64 twin is at most
twice the PyTorch twin's own error at that precision plus a few ulps. CPU runs use the Triton
interpreter (fp32, fp16); the ``gpu`` tests repeat the sweep on CUDA (bf16 too).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from recsys.kernels import max_interest_scores
from recsys.kernels.max_interest_scores.triton import BLOCK_B, BLOCK_S, max_interest_scores_op
from recsys.train.losses import negative_logits, sampled_softmax_loss

from kernel_accuracy import (  # tests/kernels is on sys.path
    ATOL,
    BOTH,
    DEVICES,
    GPU_MARKS,
    assert_within_twice_twin,
)

CASES = [  # (B, K, d, S): lengths 1, 7, 50, 129 on both axes, K 1..8, d 16..128, blocks crossed
    (1, 1, 16, 1),
    (7, 3, 16, 129),
    (50, 4, 40, 7),
    (129, 2, 64, 50),
    (BLOCK_B + 1, 8, 128, BLOCK_S * 2 + 3),
]


def _inputs(batch: int, k: int, d: int, s: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp64 interests ``[B, K, d]``, items ``[S, d]`` and an upstream gradient ``[B, S]``."""
    g = torch.Generator().manual_seed(seed)
    f64 = {"dtype": torch.float64, "generator": g}
    return torch.randn(batch, k, d, **f64), torch.randn(s, d, **f64) / d**0.5, torch.randn(batch, s, **f64)


def _run(v: torch.Tensor, e: torch.Tensor, grad: torch.Tensor, dtype: torch.dtype, device: str, backend: str):
    """Scores and the gradients of interests and items, as fp64 on the CPU."""
    v, e = (t.to(device, dtype).requires_grad_() for t in (v, e))
    out = max_interest_scores(v, e, backend=backend)
    dv, de = torch.autograd.grad(out, (v, e), grad.to(device, out.dtype))
    return [t.detach().double().cpu() for t in (out, dv, de)]


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("batch,k,d,s", CASES)
def test_matches_fp64_reference(device, dtype, batch, k, d, s):
    v, e, grad = _inputs(batch, k, d, s)
    # the reference at the rounded inputs: both sides then see the same maxima
    v, e = v.to(dtype).double(), e.to(dtype).double()
    ref = _run(v, e, grad, torch.float64, "cpu", "torch")
    twin = _run(v, e, grad, dtype, device, "torch")
    ours = _run(v, e, grad, dtype, device, "triton")
    assert ours[0].shape == (batch, s)
    assert_within_twice_twin(("scores", "d_interests", "d_items"), ref, twin, ours, ATOL[dtype])


@pytest.mark.parametrize("device,dtype", DEVICES[:1] + DEVICES[2:3])
def test_gradient_goes_to_the_winning_interest_only(device, dtype):
    """Interest 0 wins item 0 and interest 1 item 1 for every user: each gets its item's gradient."""
    v = torch.zeros(3, 2, 16, dtype=torch.float64)
    v[:, 0, 0], v[:, 1, 1] = 2.0, 3.0
    e = torch.zeros(2, 16, dtype=torch.float64)
    e[0, 0], e[1, 1] = 1.0, 1.0
    grad = torch.tensor([[1.0, 10.0]] * 3, dtype=torch.float64)
    out, dv, de = _run(v, e, grad, dtype, device, "triton")
    torch.testing.assert_close(out, torch.tensor([[2.0, 3.0]] * 3, dtype=torch.float64))
    torch.testing.assert_close(dv[:, 0], e[0].expand(3, 16))  # 1 * e_0, nothing from item 1
    torch.testing.assert_close(dv[:, 1], 10 * e[1].expand(3, 16))
    torch.testing.assert_close(de[0], 3 * v[0, 0])
    torch.testing.assert_close(de[1], 30 * v[0, 1])


@pytest.mark.parametrize("device,dtype", DEVICES[:1] + DEVICES[2:3])
def test_nan_in_an_interest_propagates_to_its_row_only(device, dtype):
    v, e, _ = _inputs(4, 3, 16, 9)
    v[2, 1, 5] = float("nan")
    out = max_interest_scores(v.to(device, dtype), e.to(device, dtype), backend="triton").cpu()
    assert out[2].isnan().all()
    assert torch.isfinite(out[[0, 1, 3]]).all()


@pytest.mark.parametrize("device,dtype", DEVICES[:1] + DEVICES[2:3])
@pytest.mark.parametrize("batch,s", [(0, 5), (3, 0)])
def test_empty_batch_or_catalogue(device, dtype, batch, s):
    v, e, grad = _inputs(batch, 2, 16, s)
    out, dv, de = _run(v, e, grad, dtype, device, "triton")
    assert out.shape == (batch, s)
    assert (dv == 0).all() and (de == 0).all()


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=GPU_MARKS)])
def test_auto_leaves_fp32_on_cuda_to_the_twin_and_takes_bf16(device):
    """The dispatch rule: the twin's amax splits a tie evenly, the kernel gives it to one interest."""
    v = torch.ones(2, 2, 16, device=device)  # two identical interests: every score is a tie
    e = torch.ones(3, 16, device=device)
    for dtype, expected in ((torch.float32, 0.5), (torch.bfloat16, None)):
        vv = v.to(dtype).requires_grad_()
        (dv,) = torch.autograd.grad(max_interest_scores(vv, e.to(dtype)).sum(), (vv,))
        shares = dv[:, :, 0].float() / 3  # each interest's share of the 3 items' gradient
        if expected is None:
            assert sorted(shares[0].tolist()) == [0.0, 1.0]
        else:
            torch.testing.assert_close(shares, torch.full_like(shares, expected))


def test_bad_inputs_name_the_argument():
    v, e = torch.randn(2, 3, 8), torch.randn(5, 8)
    with pytest.raises(ValueError, match="interests must be"):
        max_interest_scores(v[0], e)
    with pytest.raises(ValueError, match="items must be"):
        max_interest_scores(v, torch.randn(5, 7))
    with pytest.raises(ValueError, match="floating point"):
        max_interest_scores(v, e.long())
    with pytest.raises(ValueError, match="backend"):
        max_interest_scores(v, e, backend="cuda")
    with pytest.raises(ValueError, match="d <= 256"):
        max_interest_scores(torch.randn(2, 3, 300), torch.randn(5, 300), backend="triton")


def test_autocast_multiplies_in_its_dtype():
    """Under CPU autocast (bf16) the twin's product runs in bf16 and the result is float32."""
    v, e, _ = _inputs(3, 2, 16, 5)
    v, e = v.float(), e.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = max_interest_scores(v, e, backend="torch")
    expected = torch.einsum("bkd,sd->bks", v.bfloat16(), e.bfloat16()).amax(dim=1).float()
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("device", BOTH)
def test_negative_logits_and_the_sampled_loss_take_the_kernel(device):
    """The loss with max-scored negatives gives the same value and gradients on both backends."""
    g = torch.Generator().manual_seed(3)
    interests = torch.randn(6, 3, 16, generator=g).to(device).requires_grad_()
    item_emb = torch.randn(40, 16, generator=g).to(device).requires_grad_()
    target = torch.randint(1, 40, (6,), generator=g).to(device)
    negatives = torch.randint(1, 40, (20,), generator=g).to(device)
    user = interests[:, 0]
    results = []
    for backend in ("torch", "triton"):
        loss = sampled_softmax_loss(user, target, item_emb, negatives, interests=interests, backend=backend).loss
        results.append([loss, *torch.autograd.grad(loss, (interests, item_emb))])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert negative_logits(user, item_emb, interests, backend="triton").dtype == torch.float32


@pytest.mark.parametrize("device", BOTH)
def test_opcheck(device):
    """Schema, fake shapes (the int8 winners too), autograd registration, AOT dispatch."""
    v, e, _ = _inputs(5, 3, 16, 7)
    v, e = (t.float().to(device).requires_grad_() for t in (v, e))
    torch.library.opcheck(max_interest_scores_op, (v, e))


@pytest.mark.parametrize("device", BOTH)
def test_compiles_without_graph_breaks(device):
    """``torch.compile(fullgraph=True)`` of the scores and their backward matches eager
    (``aot_eager`` on the CPU, Inductor on CUDA)."""
    v, e, grad = _inputs(9, 4, 32, 70)
    v, e, grad = (t.float().to(device) for t in (v, e, grad))

    def scores(v, e):
        return max_interest_scores(v, e, backend="triton")  # fp32 on CUDA: "auto" would take the twin

    def step(fn):
        leaves = [t.detach().requires_grad_() for t in (v, e)]
        out = fn(*leaves)
        return [out, *torch.autograd.grad(out, leaves, grad)]  # through the compiled backward graph

    torch._dynamo.reset()
    compiled = torch.compile(scores, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    for a, b in zip(step(scores), step(compiled)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
