"""Triton kernels for the catalogue log-partition ``lse[r] = log sum_j exp(<u_r, e_j>)``.

This is the exact softmax's costly half (``train.full_softmax``): dense training has
``R = B * L`` rows (6,400 at batch 128, 50 positions) against the whole catalogue. The PyTorch
path (:func:`recsys.train.losses.chunked_softmax_loss`) writes each ``[R, chunk]`` block of fp32
logits to memory and reads it back some ten times over the forward and backward (the logsumexp,
the exponentials, the casts, the two gradient products): at 12k items about 3 GB a step, where
the products themselves are a tenth of a millisecond. Here the logits live only in registers,
as in Cut Cross-Entropy (Wijmans et al., 2024):

- forward, one program per (block of rows, slice of the catalogue): ``u_r`` stays loaded, each
  block of items is one ``tl.dot``, folded into a running max and sum of exponentials (the
  online softmax); the slices' ``(max, sum)`` pairs are merged on the host side of the op;
- backward, two kernels that recompute the logits tile by tile: ``d_u[r] = g_r sum_j p_rj e_j``
  over (row block, catalogue slice), and ``d_e[j] = sum_r g_r p_rj u_r`` over (item block, row
  slice), with ``p_rj = exp(<u_r, e_j> - lse_r)``; each writes its slice's partial sum to its own
  fp32 buffer (summed after, so the result does not depend on the order programs finish).

fp32 inputs use IEEE fp32 dot products; fp16/bf16 use the tensor cores with fp32 accumulation
(``p`` times the incoming gradient is rounded to the input dtype for its products, as PyTorch's
autocast matmul backward rounds its gradient). ``exp`` is ``exp2`` of scaled logits (the
interpreter has no libdevice).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_DIM = 256  # the embedding dim one program holds
BLOCK_R, BLOCK_N, NUM_WARPS = 64, 64, 4
TARGET_PROGRAMS = 1024  # the summed axis is cut into slices until a grid has about this many programs
LOG2E = tl.constexpr(1.4426950408889634)  # a global the kernels read must be a constexpr


@triton.jit
def _rows(X, offs, ok, stride, offs_d, d_ok, stride_d):
    """The ``[rows, BLOCK_D]`` tile of rows ``offs`` of ``X``, zero outside ``ok`` and ``d_ok``
    (so that padding adds nothing to a product, and never a NaN)."""
    return tl.load(
        X + offs[:, None].to(tl.int64) * stride + offs_d[None, :] * stride_d,
        mask=ok[:, None] & d_ok[None, :],
        other=0.0,
    )


@triton.jit
def _fwd_kernel(
    U,
    E,
    M_OUT,
    S_OUT,
    R,
    N,
    sur,
    sud,
    sen,
    sed,
    n_per_program,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """``M_OUT[slice, r]`` = the largest logit of row ``r`` over this program's items and
    ``S_OUT[slice, r]`` = the sum of ``exp(logit - M_OUT)`` there (fp32, contiguous
    ``[slices, R]``); grid ``(cdiv(R, BLOCK_R), slices)``."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    r_ok, d_ok = offs_r < R, offs_d < D
    u = _rows(U, offs_r, r_ok, sur, offs_d, d_ok, sud)
    m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_R,), tl.float32)
    start = tl.program_id(1) * n_per_program
    for n0 in range(start, tl.minimum(start + n_per_program, N), BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        e = _rows(E, offs_n, n_ok, sen, offs_d, d_ok, sed)
        logits = tl.dot(u, tl.trans(e), input_precision=DOT_PREC) * LOG2E  # [BLOCK_R, BLOCK_N], base 2
        logits = tl.where(n_ok[None, :], logits, float("-inf"))
        m_new = tl.maximum(m, tl.max(logits, axis=1))  # finite: every block has an item
        s = s * tl.exp2(m - m_new) + tl.sum(tl.exp2(logits - m_new[:, None]), axis=1)
        m = m_new
    out = tl.program_id(1) * R + offs_r
    tl.store(M_OUT + out, m / LOG2E, mask=r_ok)
    tl.store(S_OUT + out, s, mask=r_ok)


@triton.jit
def _probabilities(u, e, lse2, g, n_ok, DOT_PREC: tl.constexpr):
    """``g_r exp(<u_r, e_j> - lse_r)`` as a ``[rows, items]`` fp32 tile (0 outside ``n_ok``);
    ``lse2`` is ``lse`` in base 2."""
    logits = tl.dot(u, tl.trans(e), input_precision=DOT_PREC) * LOG2E
    p = tl.exp2(logits - lse2[:, None]) * g[:, None]
    return tl.where(n_ok[None, :], p, 0.0)


@triton.jit
def _d_user_kernel(
    U,
    E,
    LSE,
    G,
    DU,
    R,
    N,
    sur,
    sud,
    sen,
    sed,
    n_per_program,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """``DU[slice, r] = g_r sum_j p_rj E[j]`` over this program's items (fp32, contiguous
    ``[slices, R, D]``); grid ``(cdiv(R, BLOCK_R), slices)``."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    r_ok, d_ok = offs_r < R, offs_d < D
    u = _rows(U, offs_r, r_ok, sur, offs_d, d_ok, sud)
    lse2 = tl.load(LSE + offs_r, mask=r_ok, other=0.0) * LOG2E
    g = tl.load(G + offs_r, mask=r_ok, other=0.0)
    acc = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
    start = tl.program_id(1) * n_per_program
    for n0 in range(start, tl.minimum(start + n_per_program, N), BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        e = _rows(E, offs_n, n_ok, sen, offs_d, d_ok, sed)
        p = _probabilities(u, e, lse2, g, n_ok, DOT_PREC)
        acc += tl.dot(p.to(e.dtype), e, input_precision=DOT_PREC)
    du = DU + (tl.program_id(1) * R + offs_r[:, None]).to(tl.int64) * D + offs_d[None, :]
    tl.store(du, acc, mask=r_ok[:, None] & d_ok[None, :])


@triton.jit
def _d_items_kernel(
    U,
    E,
    LSE,
    G,
    DE,
    R,
    N,
    sur,
    sud,
    sen,
    sed,
    r_per_program,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """``DE[slice, j] = sum_r g_r p_rj U[r]`` over this program's rows (fp32, contiguous
    ``[slices, N, D]``); grid ``(cdiv(N, BLOCK_N), slices)``."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    n_ok, d_ok = offs_n < N, offs_d < D
    e = _rows(E, offs_n, n_ok, sen, offs_d, d_ok, sed)
    acc = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    start = tl.program_id(1) * r_per_program
    for r0 in range(start, tl.minimum(start + r_per_program, R), BLOCK_R):
        offs_r = r0 + tl.arange(0, BLOCK_R)
        r_ok = offs_r < R
        u = _rows(U, offs_r, r_ok, sur, offs_d, d_ok, sud)
        lse2 = tl.load(LSE + offs_r, mask=r_ok, other=0.0) * LOG2E
        g = tl.load(G + offs_r, mask=r_ok, other=0.0)  # 0 outside: those rows add nothing
        p = _probabilities(u, e, lse2, g, n_ok, DOT_PREC)
        acc += tl.dot(tl.trans(p.to(u.dtype)), u, input_precision=DOT_PREC)
    de = DE + (tl.program_id(1) * N + offs_n[:, None]).to(tl.int64) * D + offs_d[None, :]
    tl.store(de, acc, mask=n_ok[:, None] & d_ok[None, :])


def _flags(user: Tensor) -> dict[str, object]:
    d = user.shape[1]
    return {
        "D": d,
        "BLOCK_D": max(16, triton.next_power_of_2(d)),
        "BLOCK_R": BLOCK_R,
        "BLOCK_N": BLOCK_N,
        "DOT_PREC": "ieee" if user.dtype == torch.float32 else "tf32",
        "num_warps": NUM_WARPS,
    }


def _slice(blocks_other: int, blocks_summed: int, block: int) -> int:
    """Elements of the summed axis per program (a whole number of blocks), cut so that the grid
    has about TARGET_PROGRAMS programs."""
    slices = max(1, min(blocks_summed, TARGET_PROGRAMS // max(1, blocks_other)))
    return triton.cdiv(blocks_summed, slices) * block


def forward(user: Tensor, items: Tensor) -> tuple[Tensor, Tensor]:
    """``user [R, D]``, ``items [N, D]`` (one dtype of :data:`DTYPES`, one device, ``N >= 1``) ->
    ``(lse [R], row_max [R])`` fp32."""
    rows, n = user.shape[0], items.shape[0]
    r_blocks = triton.cdiv(rows, BLOCK_R)
    per = _slice(r_blocks, triton.cdiv(n, BLOCK_N), BLOCK_N)
    slices = triton.cdiv(n, per)
    part_max = torch.empty((slices, rows), dtype=torch.float32, device=user.device)
    part_sum = torch.empty_like(part_max)
    if rows:
        _fwd_kernel[(r_blocks, slices)](
            user, items, part_max, part_sum, rows, n, *user.stride(), *items.stride(), per, **_flags(user)
        )
    row_max = part_max.amax(dim=0)  # [R]
    lse = row_max + torch.log((part_sum * torch.exp(part_max - row_max)).sum(dim=0))
    return lse, row_max


def backward(grad: Tensor, user: Tensor, items: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
    """``grad [R]`` (of ``lse``) and ``user``, ``items``, ``lse`` of :func:`forward` ->
    ``(d_user [R, D], d_items [N, D])`` in the dtypes of ``user`` and ``items``."""
    rows, d = user.shape
    n = items.shape[0]
    if not rows:
        return user.new_zeros(user.shape), items.new_zeros(items.shape)
    grad, lse = grad.float().contiguous(), lse.contiguous()
    r_blocks, n_blocks = triton.cdiv(rows, BLOCK_R), triton.cdiv(n, BLOCK_N)
    flags = _flags(user)
    n_per, r_per = _slice(r_blocks, n_blocks, BLOCK_N), _slice(n_blocks, r_blocks, BLOCK_R)
    du = torch.empty((triton.cdiv(n, n_per), rows, d), dtype=torch.float32, device=user.device)
    de = torch.empty((triton.cdiv(rows, r_per), n, d), dtype=torch.float32, device=user.device)
    strides = (*user.stride(), *items.stride())
    _d_user_kernel[(r_blocks, du.shape[0])](user, items, lse, grad, du, rows, n, *strides, n_per, **flags)
    _d_items_kernel[(n_blocks, de.shape[0])](user, items, lse, grad, de, rows, n, *strides, r_per, **flags)
    return du.sum(dim=0).to(user.dtype), de.sum(dim=0).to(items.dtype)


# --------------------------------------------------------------------------------------------
# The registered operators (one path, eager and under torch.compile)
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("recsys::catalogue_logsumexp", mutates_args=())
def catalogue_logsumexp_op(user: Tensor, items: Tensor) -> tuple[Tensor, Tensor]:
    """``(lse [R], row_max [R])`` fp32 of :func:`forward`."""
    return forward(user, items)


@catalogue_logsumexp_op.register_fake
def _(user, items):
    return user.new_empty(user.shape[0], dtype=torch.float32), user.new_empty(user.shape[0], dtype=torch.float32)


@torch.library.custom_op("recsys::catalogue_logsumexp_backward", mutates_args=())
def catalogue_logsumexp_backward_op(grad: Tensor, user: Tensor, items: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
    """``(d_user, d_items)`` of :func:`backward`."""
    return backward(grad, user, items, lse)


@catalogue_logsumexp_backward_op.register_fake
def _(grad, user, items, lse):
    return torch.empty_like(user), torch.empty_like(items)


def _setup_context(ctx, inputs, output) -> None:
    user, items = inputs
    lse, row_max = output
    ctx.save_for_backward(user, items, lse)
    ctx.mark_non_differentiable(row_max)


def _op_backward(ctx, grad, _grad_row_max):
    user, items, lse = ctx.saved_tensors
    return catalogue_logsumexp_backward_op(grad, user, items, lse)


catalogue_logsumexp_op.register_autograd(_op_backward, setup_context=_setup_context)


def triton_supports(dtype: torch.dtype, dim: int, num_items: int) -> bool:
    """Whether the kernels cover ``dtype`` logits of ``dim``-wide vectors against ``num_items``
    items: fp16/bf16/fp32, ``dim <= 256``, at least one item."""
    return dtype in DTYPES and dim <= MAX_DIM and num_items >= 1
