"""The fused multi-interest kernel against an fp64 reference, outputs and all gradients.

Acceptance rule (flash-attention's): at a given precision the kernel's largest error against
the fp64 twin is at most twice the PyTorch twin's own error at that precision, plus a tiny
absolute epsilon. CPU runs use the Triton interpreter (fp32, fp16); the ``gpu`` tests repeat
the sweep on CUDA in bf16.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # after TRITON_INTERPRET is set

from recsys.kernels import length_softmax, multi_interest, multi_interest_ref
from recsys.kernels.multi_interest import triton as tmi
from recsys.kernels.multi_interest.triton import (
    _mi_rows_kernel,
    multi_interest_backward,
    multi_interest_forward,
    triton_multi_interest,
)

from kernel_accuracy import assert_within_twice_twin  # tests/kernels is on sys.path

CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
needs_interpreter = pytest.mark.skipif(
    CUDA, reason="CPU interpreter tests run only where there is no GPU (the gpu tests cover CUDA)"
)

# Largest allowed error beyond 2x the twin's, per dtype: a few ulps at the outputs' scale.
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
NAMES = ("out", "dh", "dw1", "dw2", "dpos")

# (L, K, d): every L at one (K, d), then the other K and d values over a subset of L.
SHAPES = [(seq_len, 4, 16) for seq_len in (1, 7, 20, 50, 129)] + [
    (20, 1, 16),
    (129, 8, 16),
    (7, 8, 64),
    (50, 1, 64),
    (129, 4, 64),
]


def _problem(batch: int, seq_len: int, k: int, d: int, hidden: int, seed: int, device: str):
    """fp64 inputs, random lengths with 0 and L included, and an upstream gradient."""
    g = torch.Generator().manual_seed(seed)
    f64 = {"dtype": torch.float64, "generator": g}
    h = torch.randn(batch, seq_len, d, **f64)
    w1 = torch.randn(d, hidden, **f64) * (2.0 / d) ** 0.5
    w2 = torch.randn(hidden, k, **f64) * (2.0 / hidden) ** 0.5
    pos = torch.randn(seq_len + 3, d, **f64) * 0.5
    lengths = torch.randint(0, seq_len + 1, (batch,), generator=g)
    lengths[0], lengths[-1] = 0, seq_len
    grad = torch.randn(batch, k, d, **f64)
    return [t.to(device) for t in (h, w1, w2, pos)], lengths.to(device), grad.to(device)


def _run(fn, params, lengths, grad, dtype, with_pos=True):
    """``fn`` on ``params`` cast to ``dtype``; returns fp64 copies of (out, dh, dw1, dw2, dpos)."""
    leaves = [p.detach().to(dtype).requires_grad_() for p in params]
    h, w1, w2, pos = leaves
    out = fn(h, lengths, w1, w2, pos=pos if with_pos else None)
    out.backward(grad.to(dtype))
    grads = [t.grad for t in leaves]
    if not with_pos:
        assert grads[3] is None
        grads[3] = torch.zeros_like(pos)
    return [t.detach().double() for t in (out, *grads)]


def _check(seq_len, k, d, dtype, device, batch=6, seed=0, with_pos=True):
    params, lengths, grad = _problem(batch, seq_len, k, d, 4 * d, seed, device)
    ref = _run(multi_interest_ref, params, lengths, grad, torch.float64, with_pos)
    twin = _run(multi_interest_ref, params, lengths, grad, dtype, with_pos)
    ours = _run(triton_multi_interest, params, lengths, grad, dtype, with_pos)
    empty = lengths == 0
    assert_within_twice_twin(NAMES, ref, twin, ours, ATOL[dtype])
    assert (ours[0][empty] == 0).all() and (ours[1][empty] == 0).all()
    padded = torch.arange(seq_len, device=device)[None, :] >= lengths[:, None]  # [B, L]
    assert (ours[1][padded] == 0).all(), "padding positions must get zero gradient"


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("seq_len,k,d", SHAPES)
def test_matches_fp64_reference_cpu(seq_len, k, d, dtype):
    _check(seq_len, k, d, dtype, "cpu")


@needs_interpreter
@pytest.mark.parametrize("seq_len,k,d", [(7, 4, 16), (50, 8, 64)])
def test_fp32_weights_with_fp16_inputs_cpu(seq_len, k, d):
    """Autocast's mix: fp16 ``h`` with fp32 W1, W2, P, read in place (the weights rounded to fp16 on
    load, P added to h in fp32): within the accuracy rule, gradients in each input's dtype."""
    params, lengths, grad = _problem(6, seq_len, k, d, 4 * d, 0, "cpu")
    ref = _run(multi_interest_ref, params, lengths, grad, torch.float64)
    twin = _run(multi_interest_ref, params, lengths, grad, torch.float16)
    h = params[0].detach().half().requires_grad_()
    w1, w2, pos = (p.detach().float().requires_grad_() for p in params[1:])
    out = triton_multi_interest(h, lengths, w1, w2, pos=pos)
    out.backward(grad.half())
    assert out.dtype == h.grad.dtype == torch.float16
    assert w1.grad.dtype == w2.grad.dtype == pos.grad.dtype == torch.float32
    ours = [t.detach().double() for t in (out, h.grad, w1.grad, w2.grad, pos.grad)]
    assert_within_twice_twin(NAMES, ref, twin, ours, ATOL[torch.float16])


def _capped_with_attention_term(fn, cap: float):
    """``fn`` with a score cap, its returned scores feeding a loss on the attention: the output is
    ``interests + Σ_l A²`` (the collision term of ``train.attention_reg``) broadcast over ``d``,
    so one backward checks the kernel's extra score-gradient input and the cap's chain rule."""

    def run(h, lengths, w1, w2, pos=None):
        out, scores = fn(h, lengths, w1, w2, pos=pos, score_cap=cap, return_scores=True)
        collision = length_softmax(scores, lengths).square().sum(dim=1)  # [B, K]
        return out + collision[..., None].to(out.dtype)

    return run


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("seq_len,k,d", [(1, 4, 16), (7, 4, 16), (50, 8, 64), (129, 1, 16)])
def test_score_cap_and_attention_term_cpu(seq_len, k, d, dtype):
    params, lengths, grad = _problem(6, seq_len, k, d, 4 * d, 11, "cpu")
    params[2] = params[2] * 8.0  # large W2: scores well past the cap, where tanh bends
    ref = _run(_capped_with_attention_term(multi_interest_ref, 1.5), params, lengths, grad, torch.float64)
    twin = _run(_capped_with_attention_term(multi_interest_ref, 1.5), params, lengths, grad, dtype)
    ours = _run(_capped_with_attention_term(triton_multi_interest, 1.5), params, lengths, grad, dtype)
    assert_within_twice_twin(NAMES, ref, twin, ours, ATOL[dtype])
    padded = torch.arange(seq_len)[None, :] >= lengths[:, None]
    assert (ours[1][padded] == 0).all(), "padding positions must get zero gradient"


def test_score_cap_bounds_the_attention_cpu():
    """With a cap c the attention ratio of two valid clicks is at most e^(2c), whatever W2."""
    params, lengths, _ = _problem(8, 30, 4, 16, 64, 12, "cpu")
    h, w1, w2, pos = params
    _, scores = multi_interest(h, lengths, w1, w2 * 100.0, pos=pos, score_cap=2.0, return_scores=True, backend="torch")
    assert scores.abs().max() <= 2.0
    attn = length_softmax(scores, lengths)
    valid = torch.arange(30)[None, :, None] < lengths[:, None, None]
    lo = attn.masked_fill(~valid, float("inf")).amin(dim=1)
    hi = attn.amax(dim=1)
    ok = lengths > 0
    assert (hi[ok] / lo[ok] <= torch.exp(torch.tensor(4.0, dtype=attn.dtype)) * (1 + 1e-9)).all()
    _, raw = multi_interest(h, lengths, w1, w2 * 100.0, pos=pos, return_scores=True, backend="torch")
    assert raw.abs().max() > 10.0  # without the cap the same weights saturate the softmax


@needs_interpreter
def test_without_positions_cpu():
    _check(20, 4, 16, torch.float32, "cpu", with_pos=False)


@needs_interpreter
@pytest.mark.parametrize("d,hidden,k", [(24, 40, 3), (128, 32, 16)])
def test_odd_sizes_cpu(d, hidden, k):
    """d, hidden and K that are not powers of two, and the ends of the supported range."""
    params, lengths, grad = _problem(5, 13, k, d, hidden, 1, "cpu")
    ref = _run(multi_interest_ref, params, lengths, grad, torch.float64)
    ours = _run(triton_multi_interest, params, lengths, grad, torch.float32)
    for name, r, o in zip(NAMES, ref, ours):
        err = (o - r).abs().max().item()
        assert err < 1e-4 * max(1.0, r.abs().max().item()), f"{name}: error {err:.3g}"


@needs_interpreter
def test_all_empty_gives_zeros_cpu():
    params, _, grad = _problem(3, 9, 4, 16, 64, 2, "cpu")
    lengths = torch.zeros(3, dtype=torch.long)
    out, dh, dw1, dw2, dpos = _run(triton_multi_interest, params, lengths, grad, torch.float32)
    for name, t in zip(NAMES, (out, dh, dw1, dw2, dpos)):
        assert (t == 0).all(), f"{name} must be exactly 0 when every sequence is empty"


# Length patterns for the backward's valid-row list (B = 37, L = 13; the interpreter's tiles hold 32
# rows for dX and 16 for the weights, so tiles straddle sequence ends, and the weight kernel's one
# program per hidden slice walks every tile; dP sums chunks of 3 sequences).
LENGTH_CASES = {
    "all-empty": lambda g: torch.zeros(37, dtype=torch.long),
    "all-full": lambda g: torch.full((37,), 13),
    "one-row": lambda g: torch.zeros(37, dtype=torch.long).index_fill_(0, torch.tensor([20]), 1),
    "over-L-and-negative": lambda g: torch.randint(-5, 30, (37,), generator=g),
    "random": lambda g: torch.randint(0, 14, (37,), generator=g),
}


@needs_interpreter
@pytest.mark.parametrize("case", LENGTH_CASES)
def test_valid_row_list_cpu(case):
    """The dX, weight and dP kernels walk only the valid rows: within the accuracy rule against
    the twin (lengths clamped to [0, L] as the twin reads them), padded rows of dh and positions no
    sequence reaches (and pos's rows past L) exactly 0, and the same inputs give the same bits."""
    params, _, grad = _problem(37, 13, 4, 16, 64, 21, "cpu")
    lengths = LENGTH_CASES[case](torch.Generator().manual_seed(5))
    ref = _run(multi_interest_ref, params, lengths, grad, torch.float64)
    twin = _run(multi_interest_ref, params, lengths, grad, torch.float32)
    ours = _run(triton_multi_interest, params, lengths, grad, torch.float32)
    assert_within_twice_twin(NAMES, ref, twin, ours, ATOL[torch.float32])
    n = lengths.clamp(0, 13)
    padded = torch.arange(13)[None, :] >= n[:, None]
    assert (ours[1][padded] == 0).all() and (ours[1][~padded] != 0).all()
    reached = int(n.max())
    assert (ours[4][reached:] == 0).all() and (ours[4][:reached] != 0).all(1).all()
    again = _run(triton_multi_interest, params, lengths, grad, torch.float32)
    for name, a, b in zip(NAMES, ours, again):
        assert torch.equal(a, b), f"{name} differs between two runs on the same inputs"


def _check_padded_scores(batch: int, seq_len: int, lengths: torch.Tensor, device: str) -> None:
    """The forward's scores kernel walks only the valid rows (tiles of the valid-row list): there
    its scores match the twin's, at padded positions they are
    exactly 0 (written by the pool kernel, as documented) although the buffer held NaN, with and
    without a cap (fp32); the public call returns the same."""
    params, _, _ = _problem(batch, seq_len, 4, 16, 64, 22, device)
    h, w1, w2, pos = (p.float().contiguous() for p in params)
    lengths = lengths.to(device)
    padded = torch.arange(seq_len, device=device)[None, :] >= lengths.clamp(0, seq_len)[:, None]  # [B, L]
    for cap in (None, 1.5):
        plan = tmi._plan(tmi._key(h, lengths, w1, w2, pos, cap), h, w1, w2, pos, cap, None, backward=False)
        out, lse = h.new_empty(batch, 4, 16), h.new_empty(batch, 4)
        scores = torch.full((batch, seq_len, 4), float("nan"), device=device)
        cu, idx = tmi._row_list(plan, lengths, batch * seq_len)
        tmi._run(plan, "scores", (h, pos, w1, w2, scores, cu, idx), (float(cap or 1.0),))
        tmi._run(plan, "pool", (h, scores, lengths, out, lse))
        twin_out, twin = multi_interest_ref(h, lengths, w1, w2, pos=pos, score_cap=cap, return_scores=True)
        assert (scores[padded] == 0).all() and (twin[padded] == 0).all()
        torch.testing.assert_close(scores[~padded], twin[~padded], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out, twin_out, rtol=1e-5, atol=1e-5)
        returned = triton_multi_interest(h, lengths, w1, w2, pos=pos, score_cap=cap, return_scores=True)[1]
        assert torch.equal(returned, scores)


@needs_interpreter
@pytest.mark.parametrize("case", LENGTH_CASES)
def test_scores_walk_the_valid_rows_cpu(case):
    _check_padded_scores(37, 13, LENGTH_CASES[case](torch.Generator().manual_seed(5)), "cpu")


@needs_interpreter
@pytest.mark.parametrize(
    "batch,seq_len,lengths",
    [(1, 9, [5]), (2, 9, [0, 9]), (5, 70, [70, 0, 33, 65, 1])],
    ids=["one-sequence", "empty-then-full", "longer-than-a-tile"],
)
def test_scores_row_list_edges_cpu(batch, seq_len, lengths):
    """One sequence, an empty sequence before a full one (equal offsets), and sequences longer
    than the interpreter's 32-row tiles."""
    _check_padded_scores(batch, seq_len, torch.tensor(lengths), "cpu")


@gpu
@needs_cuda
@pytest.mark.parametrize("case", LENGTH_CASES)
def test_scores_walk_the_valid_rows_gpu(case):
    _check_padded_scores(37, 13, LENGTH_CASES[case](torch.Generator().manual_seed(5)), "cuda")
    lengths = torch.randint(12, 51, (4096,), generator=torch.Generator().manual_seed(3))
    _check_padded_scores(4096, 50, lengths, "cuda")  # the bench's shape, 64-row tiles


def _check_row_list(lengths: torch.Tensor, seq_len: int, chunk: int, blocks: dict[str, int]) -> None:
    """``cu`` = exclusive prefix sums of the clamped lengths and their total; ``idx[cu[b] + l] = b L + l``
    for every valid position, and nothing written past ``cu[B]``."""
    batch = lengths.shape[0]
    cu = torch.full((batch + 1,), -1, dtype=torch.int32, device=lengths.device)
    idx = torch.full((batch * seq_len,), -1, dtype=torch.int32, device=lengths.device)
    _mi_rows_kernel[(triton.cdiv(batch, chunk),)](lengths, cu, idx, batch, seq_len, chunk, **blocks, PDL=False)
    n = lengths.long().clamp(0, seq_len).cpu()
    assert torch.equal(cu.long().cpu(), torch.cat([torch.zeros(1, dtype=torch.long), n.cumsum(0)]))
    valid = torch.arange(seq_len)[None, :] < n[:, None]
    expected = torch.arange(batch * seq_len).view(batch, seq_len)[valid]  # row-major: sequence, then position
    total = int(n.sum())
    assert torch.equal(idx[:total].long().cpu(), expected) and (idx[total:] == -1).all()


@needs_interpreter
@pytest.mark.parametrize(
    "chunk,blocks",
    [
        (4, {"BLOCK_B": 4, "BLOCK_C": 2, "BLOCK_L": 4}),  # several programs, sub-blocks and position blocks
        (40, {"BLOCK_B": 16, "BLOCK_C": 64, "BLOCK_L": 16}),  # one program, one block of everything
        (6, {"BLOCK_B": 32, "BLOCK_C": 2, "BLOCK_L": 8}),  # a last program with a partial chunk
    ],
    ids=["small-blocks", "one-program", "partial-chunk"],
)
def test_row_list_cpu(chunk, blocks):
    """The valid-row list over lengths below 0, 0, in between and above L."""
    _check_row_list(torch.randint(-3, 12, (40,), generator=torch.Generator().manual_seed(6)), 9, chunk, blocks)


@gpu
@needs_cuda
@pytest.mark.parametrize("batch,seq_len", [(4096, 50), (1000, 200), (3, 1024), (70000, 20)])
def test_row_list_gpu(batch, seq_len):
    """The list at the GPU's own launch (:func:`gpu_rows_blocks`), int32 and int64 lengths."""
    gen = torch.Generator().manual_seed(batch)
    lengths = torch.randint(-2, seq_len + 3, (batch,), generator=gen)
    for dtype in (torch.int64, torch.int32):
        _check_row_list(lengths.to("cuda", dtype), seq_len, *tmi.gpu_rows_blocks(batch, seq_len))


@needs_interpreter
def test_backward_is_deterministic_and_dispatched_cpu():
    """Two backward passes give bit-identical gradients; the dispatcher routes to the kernel."""
    params, lengths, grad = _problem(7, 20, 4, 16, 64, 3, "cpu")
    h, w1, w2, pos = (p.float().contiguous() for p in params)
    out, lse, scores = multi_interest_forward(h, lengths, w1, w2, pos)
    first = multi_interest_backward(h, lengths, w1, w2, pos, out, lse, scores, grad.float())
    second = multi_interest_backward(h, lengths, w1, w2, pos, out, lse, scores, grad.float())
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    routed = multi_interest(h, lengths, w1, w2, pos=pos, backend="triton")
    assert torch.equal(routed, out)


@needs_interpreter
def test_unsupported_inputs_go_to_the_twin_cpu():
    """fp64 is outside the kernel: ``auto`` runs the twin, ``triton`` says why it can't."""
    params, lengths, _ = _problem(3, 5, 2, 16, 64, 5, "cpu")
    h, w1, w2, pos = params
    assert torch.equal(multi_interest(h, lengths, w1, w2, pos=pos), multi_interest_ref(h, lengths, w1, w2, pos=pos))
    with pytest.raises(ValueError, match="fp16/bf16/fp32"):
        multi_interest(h, lengths, w1, w2, pos=pos, backend="triton")


def test_separate_values_pool_through_the_twin_cpu():
    """``values=``: A from h (+ positions), pooled values; fully padded rows give zeros."""
    params, lengths, _ = _problem(4, 7, 3, 16, 32, 7, "cpu")
    h, w1, w2, pos = params
    lengths[0] = 0
    values = torch.randn(4, 7, 5, dtype=h.dtype)
    got = multi_interest(h, lengths, w1, w2, pos=pos, values=values)
    valid = torch.arange(7)[None] < lengths[:, None]  # [B, L]
    scores = torch.tanh((h + pos[:7]) @ w1) @ w2  # [B, L, K]
    attn = torch.softmax(scores.masked_fill(~valid[..., None], float("-inf")), dim=1).nan_to_num(0.0)
    torch.testing.assert_close(got, torch.einsum("blk,blv->bkv", attn, values))
    assert got[0].abs().max() == 0
    with pytest.raises(ValueError, match="pools h itself"):
        multi_interest(h, lengths, w1, w2, values=values, backend="triton")
    with pytest.raises(ValueError, match="values must be"):
        multi_interest(h, lengths, w1, w2, values=values[:, :6])


@gpu
@needs_cuda
@pytest.mark.parametrize("seq_len,k,d", SHAPES)
def test_matches_fp64_reference_gpu_bf16(seq_len, k, d):
    _check(seq_len, k, d, torch.bfloat16, "cuda", batch=300)


@gpu
@needs_cuda
@pytest.mark.parametrize("seq_len,k,d", [(7, 4, 16), (50, 4, 64), (129, 8, 64)])
def test_score_cap_and_attention_term_gpu_bf16(seq_len, k, d):
    params, lengths, grad = _problem(300, seq_len, k, d, 4 * d, 13, "cuda")
    params[2] = params[2] * 8.0
    ref = _run(_capped_with_attention_term(multi_interest_ref, 1.5), params, lengths, grad, torch.float64)
    twin = _run(_capped_with_attention_term(multi_interest_ref, 1.5), params, lengths, grad, torch.bfloat16)
    ours = _run(_capped_with_attention_term(triton_multi_interest, 1.5), params, lengths, grad, torch.bfloat16)
    assert_within_twice_twin(NAMES, ref, twin, ours, ATOL[torch.bfloat16])


@gpu
@needs_cuda
def test_fp32_gpu_is_ieee():
    """fp32 on GPU runs the products in IEEE fp32 (not TF32), so it meets the fp32 bound."""
    _check(50, 4, 64, torch.float32, "cuda", batch=64)


@gpu
@needs_cuda
def test_autocast_gpu():
    """Under bf16 autocast the kernel runs in bf16 and fp32 parameters get fp32 gradients."""
    params, lengths, grad = _problem(64, 50, 4, 64, 256, 4, "cuda")
    h, w1, w2, pos = (p.float().requires_grad_() for p in params)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = multi_interest(h, lengths, w1, w2, pos=pos)
    assert out.dtype == torch.bfloat16
    out.float().backward(grad.float())
    assert w1.grad.dtype == torch.float32 and torch.isfinite(w1.grad).all()
    ref = multi_interest_ref(h.double(), lengths, w1.double(), w2.double(), pos=pos.double())
    assert (out.double() - ref).abs().max().item() < 5e-2


@gpu
@needs_cuda
def test_cuda_graph_replay_follows_new_lengths_gpu():
    """A forward+backward captured once in a CUDA graph replays right for other lengths of the same
    shape (none valid, all valid, some past L): the valid-row count stays on the device, nothing of
    the captured lengths is baked in; each replay equals an eager call bit for bit."""
    params, lengths, grad = _problem(300, 50, 4, 64, 256, 8, "cuda")
    h, w1, w2, pos = (p.to(torch.bfloat16).requires_grad_() for p in params)
    grad = grad.to(torch.bfloat16)
    static_lengths = lengths.clone()

    def step():
        out = triton_multi_interest(h, static_lengths, w1, w2, pos=pos)
        return (out, *torch.autograd.grad(out, (h, w1, w2, pos), grad))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and cache the launches before the capture
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    g = torch.Generator(device="cuda").manual_seed(9)
    for new in (
        torch.zeros_like(lengths),
        torch.full_like(lengths, 50),
        torch.randint(-2, 60, lengths.shape, device="cuda", generator=g),
    ):
        static_lengths.copy_(new)
        graph.replay()
        expected = step()
        for name, a, b in zip(NAMES, captured, expected):
            assert torch.equal(a, b), f"{name}: graph replay differs from the eager call"


def _planned_launch_options() -> list[dict]:
    """Compile-time arguments and launch options of every launch planned so far."""
    return [launch.meta for plan in tmi._PLANS.values() for launch, _ in plan.values()]


@needs_interpreter
def test_interpreter_launches_without_programmatic_dependent_launch_cpu():
    """The interpreter has no grid dependency control: its forward and backward launch plainly."""
    params, lengths, grad = _problem(3, 5, 2, 16, 32, 9, "cpu")
    h, w1, w2, pos = (p.float() for p in params)
    h.requires_grad_()
    tmi._PLANS.clear()
    torch.autograd.grad(triton_multi_interest(h, lengths, w1, w2, pos=pos), h, grad.float())
    metas = _planned_launch_options()
    assert len(metas) == 9 and all(m["PDL"] is False and "launch_pdl" not in m for m in metas)


@needs_interpreter
def test_inference_calls_build_no_autograd_node_cpu():
    """Under ``no_grad``, or with no input requiring grad, the forward is launched directly (no
    autograd node, nothing saved for a backward) and gives the differentiable call's values."""
    params, lengths, _ = _problem(5, 9, 3, 16, 32, 4, "cpu")
    h, w1, w2, pos = (p.float() for p in params)
    leaves = [t.clone().requires_grad_() for t in (h, w1, w2, pos)]
    trained = triton_multi_interest(
        leaves[0], lengths, leaves[1], leaves[2], pos=leaves[3], score_cap=2.0, return_scores=True
    )
    assert all(t.grad_fn is not None for t in trained)
    with torch.no_grad():
        inferred = triton_multi_interest(
            leaves[0], lengths, leaves[1], leaves[2], pos=leaves[3], score_cap=2.0, return_scores=True
        )
    plain = triton_multi_interest(h, lengths, w1, w2, pos=pos, score_cap=2.0, return_scores=True)
    for outputs in (inferred, plain):
        for out, ref in zip(outputs, trained, strict=True):
            assert out.grad_fn is None and not out.requires_grad
            assert torch.equal(out, ref.detach())


@needs_interpreter
def test_kernels_work_with_a_triton_without_grid_dependency_control_cpu():
    """Triton < 3.3 has no ``gdc_wait``: the module still imports, never chains its launches and
    matches the twin (checked in a fresh interpreter whose Triton lacks the functions)."""
    script = """
import os, sys, types
os.environ["TRITON_INTERPRET"] = "1"
import triton.language.extra.cuda
sys.modules["triton.language.extra.cuda"] = types.ModuleType("triton.language.extra.cuda")  # no gdc_*
import torch
from recsys.kernels import multi_interest_ref
from recsys.kernels.multi_interest import triton as tmi
assert tmi.HAS_PDL is False
g = torch.Generator().manual_seed(0)
h, w1, w2, pos = (torch.randn(*s, generator=g) for s in ((3, 5, 16), (16, 32), (32, 2), (5, 16)))
lengths = torch.tensor([5, 0, 3])
torch.testing.assert_close(tmi.triton_multi_interest(h, lengths, w1, w2, pos=pos),
                           multi_interest_ref(h, lengths, w1, w2, pos=pos), rtol=1e-4, atol=1e-5)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@gpu
@needs_cuda
def test_launches_chain_by_programmatic_dependent_launch_gpu(monkeypatch):
    """On Hopper and newer GPUs every launch of a forward and backward carries programmatic
    dependent launch (older ones launch plainly); each kernel waits for the one before it, so the
    results keep their bits, compared with ``RECSYS_PDL=0``."""
    params, lengths, grad = _problem(300, 50, 4, 64, 256, 9, "cuda")
    h, w1, w2, pos = (p.to(torch.bfloat16).contiguous().requires_grad_() for p in params)
    grad, lengths = grad.to(torch.bfloat16), lengths.cuda()

    def call() -> tuple[list[torch.Tensor], list[dict]]:
        tmi._PLANS.clear()
        out = triton_multi_interest(h, lengths, w1, w2, pos=pos)
        results = [out, *torch.autograd.grad(out, (h, w1, w2, pos), grad)]
        return results, _planned_launch_options()

    hopper = torch.cuda.get_device_capability()[0] >= 9
    chained, metas = call()
    assert len(metas) == 9 and all(m["PDL"] == m.get("launch_pdl", False) == hopper for m in metas)
    monkeypatch.setenv("RECSYS_PDL", "0")
    plain, metas = call()
    assert len(metas) == 9 and all(m["PDL"] is False and "launch_pdl" not in m for m in metas)
    tmi._PLANS.clear()
    for a, b in zip(chained, plain, strict=True):
        assert torch.equal(a, b)


@gpu
@needs_cuda
def test_captured_backward_runs_the_weight_kernel_on_its_own_stream_gpu(monkeypatch):
    """Captured in a CUDA graph, the backward runs the weight kernel on a second stream, beside dX
    and dP (eager calls use one stream); the replay gives the eager call's bits (the same launches)."""
    params, lengths, grad = _problem(300, 50, 4, 64, 256, 8, "cuda")
    h, w1, w2, pos = (p.to(torch.bfloat16).contiguous() for p in params)
    grad, lengths = grad.to(torch.bfloat16), lengths.cuda()
    out, lse, scores = multi_interest_forward(h, lengths, w1, w2, pos)
    used = []
    side_stream = tmi._side_stream
    monkeypatch.setattr(tmi, "_side_stream", lambda index: used.append(index) or side_stream(index))

    def backward():
        return multi_interest_backward(h, lengths, w1, w2, pos, out, lse, scores, grad)

    eager = backward()
    assert used == []
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        backward()
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = backward()
    assert used == [torch.cuda.current_device()]
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, eager):
        assert torch.equal(a, b)


def test_register_cap_reaches_the_compiler_options(monkeypatch):
    """``LaunchConfig.max_registers`` becomes Triton's ``maxnreg`` for a compiled launch (the
    interpreter takes no such option) and is absent when not set."""
    capped = tmi.LaunchConfig(64, 4, 1, max_registers=128)
    monkeypatch.setattr(tmi, "_interpreting", lambda: True)
    assert "maxnreg" not in tmi._launch(capped)
    assert tmi.backward_config(50, 64, 256) != tmi.gpu_backward_config(50, 64, 256)  # small interpreter tiles
    monkeypatch.setattr(tmi, "_interpreting", lambda: False)
    assert tmi._launch(capped) == {"num_warps": 4, "num_stages": 1, "maxnreg": 128}
    assert tmi._launch(tmi.LaunchConfig(64, 4, 1)) == {"num_warps": 4, "num_stages": 1}
    assert tmi.backward_config(50, 64, 256) == tmi.gpu_backward_config(50, 64, 256)
