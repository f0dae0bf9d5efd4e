"""Triton kernels for the max-over-interests score ``out[b, s] = max_k <v[b, k], e[s]>``.

This is how ``train.negative_readout = "max"`` scores the sampled negatives: every user's best
matching interest scores every negative. The PyTorch twin (``reference.max_interest_scores_ref``)
materialises the ``[B, K, S]`` product, reduces it and, in the backward, builds a ``[B, K, S]``
gradient again: at batch 1024 with 10,240 shared negatives that is 42M scores written, read and
differentiated per step (about 30% of a training step's samples/s). Here no ``[B, K, S]`` tensor exists:

- forward, one program per (block of users, block of items): ``K`` small products, a running max
  and the winning interest, stored as ``[B, S]`` fp32 scores and ``[B, S]`` int8 winners;
- backward, two kernels: ``d_interests[b, k] = sum_s g[b, s] [win[b, s] = k] e[s]`` over (user
  block, interest, slice of the items) and ``d_items[s] = sum_b g[b, s] v[b, win[b, s]]`` over
  (item block, slice of the users); each program adds its slice's partial sum into an fp32 buffer
  with atomics (the float summation order varies from run to run), cast to the input dtype after.

The gradient of a tie goes to the first winning interest (the twin's ``amax`` splits it evenly);
a NaN score wins and propagates. fp32 inputs use IEEE fp32 dot products; fp16/bf16 use the tensor
cores with fp32 accumulation (the incoming gradient is rounded to the input dtype for its
products, as PyTorch's autocast matmul backward does).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_DIM = 256  # the embedding dim one program holds
MAX_INTERESTS = 127  # winners are stored as int8
BLOCK_B, BLOCK_S = 64, 64
TARGET_PROGRAMS = 1024  # backward grids are split along the summed axis up to about this many programs


@triton.jit
def _fwd_kernel(
    V,
    E,
    OUT,
    WIN,
    B,
    S,
    NK,
    svb,
    svk,
    svd,
    ses,
    sed,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_S: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """``OUT[b, s]`` (fp32, contiguous ``[B, S]``) ``= max_k <V[b, k], E[s]>`` and ``WIN[b, s]``
    (int8) the first ``k`` reaching it; grid ``(cdiv(B, BLOCK_B), cdiv(S, BLOCK_S))``."""
    offs_b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    offs_s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    b_ok, s_ok, d_ok = offs_b < B, offs_s < S, offs_d < D
    e = tl.load(E + offs_s[:, None] * ses + offs_d[None, :] * sed, mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    best = tl.full((BLOCK_B, BLOCK_S), float("-inf"), tl.float32)
    win = tl.zeros((BLOCK_B, BLOCK_S), tl.int32)
    v_ptrs = V + offs_b[:, None].to(tl.int64) * svb + offs_d[None, :] * svd
    for k in range(NK):
        v = tl.load(v_ptrs + k * svk, mask=b_ok[:, None] & d_ok[None, :], other=0.0)
        score = tl.dot(v, tl.trans(e), input_precision=DOT_PREC)  # [BLOCK_B, BLOCK_S]
        better = (score > best) | ((score != score) & (best == best))  # a NaN wins once and stays
        best = tl.where(better, score, best)
        win = tl.where(better, k, win)
    off = offs_b[:, None].to(tl.int64) * S + offs_s[None, :]
    ok = b_ok[:, None] & s_ok[None, :]
    tl.store(OUT + off, best, mask=ok)
    tl.store(WIN + off, win.to(tl.int8), mask=ok)


@triton.jit
def _grad_and_winners(G, WIN, offs_b, offs_s, b_ok, s_ok, sgb, S):
    """The ``[BLOCK_B, BLOCK_S]`` tiles of the scores' gradient (fp32) and their winners (-1 outside)."""
    ok = b_ok[:, None] & s_ok[None, :]
    g = tl.load(G + offs_b[:, None].to(tl.int64) * sgb + offs_s[None, :], mask=ok, other=0.0)
    win = tl.load(WIN + offs_b[:, None].to(tl.int64) * S + offs_s[None, :], mask=ok, other=-1)
    return g, win


@triton.jit
def _d_interests_kernel(
    G,
    WIN,
    E,
    DI,
    B,
    S,
    sgb,
    ses,
    sed,
    s_per_program,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_S: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """Adds ``sum_s G[b, s] [WIN[b, s] = k] E[s]`` over this program's items into the fp32
    ``DI [B, K, D]`` (contiguous, zeroed); grid ``(cdiv(B, BLOCK_B), K, item slices)``."""
    k = tl.program_id(1)
    num_k = tl.num_programs(1)
    offs_b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    offs_d = tl.arange(0, BLOCK_D)
    b_ok, d_ok = offs_b < B, offs_d < D
    acc = tl.zeros((BLOCK_B, BLOCK_D), tl.float32)
    start = tl.program_id(2) * s_per_program
    for s0 in range(start, tl.minimum(start + s_per_program, S), BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        s_ok = offs_s < S
        g, win = _grad_and_winners(G, WIN, offs_b, offs_s, b_ok, s_ok, sgb, S)
        e = tl.load(E + offs_s[:, None] * ses + offs_d[None, :] * sed, mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        mine = tl.where(win == k, g, 0.0).to(e.dtype)
        acc += tl.dot(mine, e, input_precision=DOT_PREC)
    di = DI + (offs_b[:, None].to(tl.int64) * num_k + k) * D + offs_d[None, :]
    tl.atomic_add(di, acc, mask=b_ok[:, None] & d_ok[None, :])


@triton.jit
def _d_items_kernel(
    G,
    WIN,
    V,
    DE,
    B,
    S,
    NK,
    sgb,
    svb,
    svk,
    svd,
    b_per_program,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_S: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """Adds ``sum_b G[b, s] V[b, WIN[b, s]]`` over this program's users into the fp32 ``DE [S, D]``
    (contiguous, zeroed); grid ``(cdiv(S, BLOCK_S), user slices)``."""
    offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok, d_ok = offs_s < S, offs_d < D
    acc = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    start = tl.program_id(1) * b_per_program
    for b0 in range(start, tl.minimum(start + b_per_program, B), BLOCK_B):
        offs_b = b0 + tl.arange(0, BLOCK_B)
        b_ok = offs_b < B
        g, win = _grad_and_winners(G, WIN, offs_b, offs_s, b_ok, s_ok, sgb, S)
        v_ptrs = V + offs_b[:, None].to(tl.int64) * svb + offs_d[None, :] * svd
        for k in range(NK):
            v = tl.load(v_ptrs + k * svk, mask=b_ok[:, None] & d_ok[None, :], other=0.0)
            mine = tl.where(win == k, g, 0.0).to(v.dtype)  # [BLOCK_B, BLOCK_S]
            acc += tl.dot(tl.trans(mine), v, input_precision=DOT_PREC)
    de = DE + offs_s[:, None].to(tl.int64) * D + offs_d[None, :]
    tl.atomic_add(de, acc, mask=s_ok[:, None] & d_ok[None, :])


def _flags(v: Tensor) -> dict[str, object]:
    d = v.shape[2]
    return {
        "D": d,
        "BLOCK_D": max(16, triton.next_power_of_2(d)),
        "BLOCK_B": BLOCK_B,
        "BLOCK_S": BLOCK_S,
        "DOT_PREC": "ieee" if v.dtype == torch.float32 else "tf32",
    }


def _slices(blocks_other: int, blocks_summed: int) -> int:
    """How many slices the summed axis is cut into so that the grid has about TARGET_PROGRAMS."""
    return max(1, min(blocks_summed, TARGET_PROGRAMS // max(1, blocks_other)))


def forward(v: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
    """``v [B, K, D]``, ``e [S, D]`` (one dtype of :data:`DTYPES`, one device) -> scores ``[B, S]``
    fp32 and winners ``[B, S]`` int8."""
    batch, k, _ = v.shape
    s = e.shape[0]
    out = torch.empty((batch, s), dtype=torch.float32, device=v.device)
    win = torch.empty((batch, s), dtype=torch.int8, device=v.device)
    if batch and s:
        grid = (triton.cdiv(batch, BLOCK_B), triton.cdiv(s, BLOCK_S))
        _fwd_kernel[grid](v, e, out, win, batch, s, k, *v.stride(), *e.stride(), **_flags(v))
    return out, win


def backward(g: Tensor, v: Tensor, e: Tensor, win: Tensor) -> tuple[Tensor, Tensor]:
    """``g [B, S]`` (the scores' gradient), ``v``, ``e`` and ``win`` of :func:`forward` ->
    ``(d_v [B, K, D], d_e [S, D])`` in the dtypes of ``v`` and ``e``."""
    batch, k, d = v.shape
    s = e.shape[0]
    g = g.float()
    if g.stride(1) != 1:
        g = g.contiguous()
    dv = torch.zeros((batch, k, d), dtype=torch.float32, device=v.device)
    de = torch.zeros((s, d), dtype=torch.float32, device=v.device)
    if batch and s and k:
        b_blocks, s_blocks = triton.cdiv(batch, BLOCK_B), triton.cdiv(s, BLOCK_S)
        flags = _flags(v)
        s_slices = _slices(b_blocks * k, s_blocks)
        s_per = triton.cdiv(s_blocks, s_slices) * BLOCK_S
        _d_interests_kernel[(b_blocks, k, triton.cdiv(s, s_per))](
            g, win, e, dv, batch, s, g.stride(0), *e.stride(), s_per, **flags
        )
        b_slices = _slices(s_blocks, b_blocks)
        b_per = triton.cdiv(b_blocks, b_slices) * BLOCK_B
        _d_items_kernel[(s_blocks, triton.cdiv(batch, b_per))](
            g, win, v, de, batch, s, k, g.stride(0), *v.stride(), b_per, **flags
        )
    return dv.to(v.dtype), de.to(e.dtype)


# --------------------------------------------------------------------------------------------
# The registered operators (one path, eager and under torch.compile)
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("recsys::max_interest_scores", mutates_args=())
def max_interest_scores_op(v: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
    """``(scores [B, S] fp32, winners [B, S] int8)`` of :func:`forward`."""
    return forward(v, e)


@max_interest_scores_op.register_fake
def _(v, e):
    shape = (v.shape[0], e.shape[0])
    return v.new_empty(shape, dtype=torch.float32), v.new_empty(shape, dtype=torch.int8)


@torch.library.custom_op("recsys::max_interest_scores_backward", mutates_args=())
def max_interest_scores_backward_op(g: Tensor, v: Tensor, e: Tensor, win: Tensor) -> tuple[Tensor, Tensor]:
    """``(d_v, d_e)`` of :func:`backward`."""
    return backward(g, v, e, win)


@max_interest_scores_backward_op.register_fake
def _(g, v, e, win):
    return torch.empty_like(v), torch.empty_like(e)


def _setup_context(ctx, inputs, output) -> None:
    v, e = inputs
    _, win = output
    ctx.save_for_backward(v, e, win)
    ctx.mark_non_differentiable(win)


def _op_backward(ctx, g, _dwin):
    v, e, win = ctx.saved_tensors
    return max_interest_scores_backward_op(g, v, e, win)


max_interest_scores_op.register_autograd(_op_backward, setup_context=_setup_context)


def triton_supports(v: Tensor) -> bool:
    """Whether the kernels cover ``v [B, K, D]``: fp16/bf16/fp32, ``D <= 256``, ``K <= 127``."""
    return v.dtype in DTYPES and v.shape[2] <= MAX_DIM and v.shape[1] <= MAX_INTERESTS
