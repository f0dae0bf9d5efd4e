"""The catalogue logsumexp kernels (``recsys.kernels.catalogue_logsumexp``) against an fp64
reference: the log-partition, the largest logit and both gradients, the catalogue slices, NaN,
empty and bad inputs, the dispatch rule, the registered operator and ``torch.compile``.

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

from recsys.kernels import catalogue_logsumexp
from recsys.kernels.catalogue_logsumexp import triton as kernel
from recsys.kernels.catalogue_logsumexp import uses_kernel
from recsys.kernels.catalogue_logsumexp.triton import BLOCK_N, BLOCK_R, catalogue_logsumexp_op
from recsys.train.losses import chunked_softmax_loss, full_softmax_loss

from kernel_accuracy import (  # tests/kernels is on sys.path
    ATOL,
    BOTH,
    CUDA,
    DEVICES,
    assert_within_twice_twin,
)

CASES = [  # (R, N, d): lengths 1, 7, 50, 129 on both axes, d 16..128, blocks crossed and sliced
    (1, 1, 16),
    (7, 129, 16),
    (50, 7, 40),
    (129, 50, 64),
    (BLOCK_R + 1, BLOCK_N * 3 + 5, 128),
]


def _inputs(rows: int, n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp64 users ``[R, d]``, items ``[N, d]`` (logits of a few units, as training's) and an
    upstream gradient ``[R]``."""
    g = torch.Generator().manual_seed(seed)
    f64 = {"dtype": torch.float64, "generator": g}
    return torch.randn(rows, d, **f64), 3 * torch.randn(n, d, **f64) / d**0.5, torch.randn(rows, **f64)


def _run(user, items, grad, dtype, device, backend):
    """``lse``, ``row_max`` and the gradients of users and items (of ``sum(grad * lse)``), as fp64 on the CPU."""
    user, items = (t.to(device, dtype).requires_grad_() for t in (user, items))
    lse, row_max = catalogue_logsumexp(user, items, backend=backend)
    d_user, d_items = torch.autograd.grad(lse, (user, items), grad.to(device, lse.dtype))
    return [t.detach().double().cpu() for t in (lse, row_max, d_user, d_items)]


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("rows,n,d", CASES)
def test_matches_fp64_reference(device, dtype, rows, n, d):
    user, items, grad = _inputs(rows, n, d)
    user, items = user.to(dtype).double(), items.to(dtype).double()  # both sides see the same inputs
    ref = _run(user, items, grad, torch.float64, "cpu", "torch")
    twin = _run(user, items, grad, dtype, device, "torch")
    ours = _run(user, items, grad, dtype, device, "triton")
    assert ours[0].shape == ours[1].shape == (rows,)
    assert_within_twice_twin(("lse", "row_max", "d_user", "d_items"), ref, twin, ours, ATOL[dtype])


@pytest.mark.parametrize("target", [1, 4, 10_000])
def test_every_way_of_slicing_the_catalogue_gives_the_same_result(monkeypatch, target):
    """The grids' slices (one program per whole axis, a few, one per block) merge to one answer."""
    user, items, grad = _inputs(BLOCK_R * 2 + 3, BLOCK_N * 4 + 9, 16, seed=1)
    user, items = user.float(), items.float()
    want = _run(user, items, grad, torch.float32, "cpu", "torch")
    monkeypatch.setattr(kernel, "TARGET_PROGRAMS", target)
    got = _run(user, items, grad, torch.float32, "cuda" if CUDA else "cpu", "triton")
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device,dtype", DEVICES[:1] + DEVICES[2:3])
def test_large_logits_do_not_overflow(device, dtype):
    """Logits in the hundreds: the running max keeps every exponential finite."""
    user, items, grad = _inputs(9, 70, 16, seed=2)
    user, items = 40 * user, 10 * items  # logits of several hundred
    ref = _run(user, items, grad, torch.float64, "cpu", "torch")
    ours = _run(user, items, grad, dtype, device, "triton")
    assert all(torch.isfinite(t).all() for t in ours)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("device,dtype", DEVICES[:1] + DEVICES[2:3])
def test_nan_in_a_user_propagates_to_its_row_only(device, dtype):
    user, items, _ = _inputs(5, 30, 16)
    user[2, 3] = float("nan")
    lse, _ = catalogue_logsumexp(user.to(device, dtype), items.to(device, dtype), backend="triton")
    assert lse[2].isnan()
    assert torch.isfinite(lse[[0, 1, 3, 4]]).all()


@pytest.mark.parametrize("device,dtype", DEVICES[:1] + DEVICES[2:3])
def test_rows_with_zero_gradient_send_nothing_back(device, dtype):
    """A masked row (zero upstream gradient) adds nothing to the items' gradient and gets none."""
    user, items, grad = _inputs(7, 40, 16, seed=4)
    grad[[1, 5]] = 0.0
    _, _, d_user, d_items = _run(user, items, grad, dtype, device, "triton")
    assert (d_user[[1, 5]] == 0).all()
    keep = [0, 2, 3, 4, 6]
    _, _, _, want = _run(user[keep], items, grad[keep], dtype, device, "triton")
    torch.testing.assert_close(d_items, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device,dtype", DEVICES[:1] + DEVICES[2:3])
def test_no_rows(device, dtype):
    user, items, grad = _inputs(0, 5, 16)
    lse, row_max, d_user, d_items = _run(user, items, grad, dtype, device, "triton")
    assert lse.shape == row_max.shape == (0,)
    assert d_user.shape == (0, 16) and (d_items == 0).all()


@pytest.mark.parametrize("device", BOTH)
def test_an_empty_catalogue_goes_to_the_twin(device):
    user, items, grad = _inputs(3, 0, 16)
    lse, row_max, d_user, _ = _run(user, items, grad, torch.float16, device, "auto")
    assert (lse == float("-inf")).all() and (row_max == float("-inf")).all() and (d_user == 0).all()
    with pytest.raises(ValueError, match="at least one item"):
        catalogue_logsumexp(user.to(device), items.to(device), backend="triton")


def test_bad_inputs_name_the_argument():
    user, items = torch.randn(4, 8), torch.randn(5, 8)
    with pytest.raises(ValueError, match="user must be"):
        catalogue_logsumexp(user[0], items)
    with pytest.raises(ValueError, match="items must be"):
        catalogue_logsumexp(user, torch.randn(5, 7))
    with pytest.raises(ValueError, match="floating point"):
        catalogue_logsumexp(user, items.long())
    with pytest.raises(ValueError, match="backend"):
        catalogue_logsumexp(user, items, backend="cuda")
    where = "cuda" if CUDA else "cpu"  # where backend="triton" can run
    with pytest.raises(ValueError, match="d <= 256"):
        catalogue_logsumexp(torch.randn(2, 300, device=where), torch.randn(5, 300, device=where), backend="triton")


@pytest.mark.parametrize("device", BOTH)
def test_auto_takes_the_kernel_where_it_is_exact_enough(device):
    """fp16 everywhere; bf16 on CUDA only (the interpreter's bf16 products are wrong); fp32 on the
    interpreter only (IEEE fp32 products spill on sm_90); fp64 never."""
    user, items = torch.randn(3, 16, device=device), torch.randn(5, 16, device=device)
    want = {torch.float16: True, torch.bfloat16: device == "cuda", torch.float32: device == "cpu", torch.float64: False}
    for dtype, expected in want.items():
        assert uses_kernel(user.to(dtype), items.to(dtype)) is expected, dtype
    with torch.autocast(device, dtype=torch.bfloat16):  # autocast's dtype decides, not the inputs'
        assert uses_kernel(user, items) is (device == "cuda")
    assert not uses_kernel(user, items, backend="torch")


@pytest.mark.parametrize("device", BOTH)
def test_the_exact_softmax_loss_takes_the_kernel(device):
    """chunked_softmax_loss on the kernel (fp16 inputs) gives full_softmax_loss's value and
    gradients, masked rows exactly zero."""
    g = torch.Generator().manual_seed(5)
    user = torch.randn(40, 32, generator=g).half().to(device).requires_grad_()
    item_emb = torch.randn(150, 32, generator=g).half().to(device).requires_grad_()
    target = torch.randint(1, 150, (40,), generator=g).to(device)
    mask = torch.arange(40, device=device) % 5 != 0
    assert uses_kernel(user, item_emb[1:])
    results = []
    for fn in (chunked_softmax_loss, full_softmax_loss):
        out = fn(user, target, item_emb, mask=mask, z_loss=0.1)
        results.append([out.loss, out.max_logit, *torch.autograd.grad(out.loss, (user, item_emb))])
    for a, b in zip(*results):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-3, atol=2e-3)
    d_user = results[0][2]
    assert (d_user[~mask] == 0).all()


@pytest.mark.parametrize("device", BOTH)
def test_opcheck(device):
    """Schema, fake shapes, autograd registration, AOT dispatch."""
    user, items, _ = _inputs(9, 70, 16)
    user, items = (t.float().to(device).requires_grad_() for t in (user, items))
    torch.library.opcheck(catalogue_logsumexp_op, (user, items))


@pytest.mark.parametrize("device", BOTH)
def test_compiles_without_graph_breaks(device):
    """``torch.compile(fullgraph=True)`` of the op and its backward matches eager (``aot_eager``
    on the CPU, Inductor on CUDA)."""
    user, items, grad = _inputs(9, 70, 32)
    user, items, grad = (t.float().to(device) for t in (user, items, grad))

    def lse(user, items):
        return catalogue_logsumexp(user, items, backend="triton")[0]  # fp32 on CUDA: "auto" would take the twin

    def step(fn):
        leaves = [t.detach().requires_grad_() for t in (user, items)]
        out = fn(*leaves)
        return [out, *torch.autograd.grad(out, leaves, grad)]

    torch._dynamo.reset()
    compiled = torch.compile(lse, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    for a, b in zip(step(lse), step(compiled)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
