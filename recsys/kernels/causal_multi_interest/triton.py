"""Triton kernels of the causal multi-interest extraction (the maths is in :mod:`.op`).

Forward, one launch on a ``(B, K)`` grid: each program scans one sequence for one interest in
blocks of ``BLOCK_T`` positions, carrying the log-sum-exp of the scores before the block and the
output at the block's last row. Inside a block, row ``t`` of the prefix weights is
``w[t, l] = exp(s_l - lse_t)`` for ``l <= t`` (the block's own ``[BLOCK_T, BLOCK_T]`` tile, at most 1)
and ``exp(lse_carry - lse_t)`` for the carried output, so ``out_t = w @ h + exp(lse_carry - lse_t)
out_carry``: a tensor-core product per block, and every prefix is a convex combination (errors do
not grow along the sequence). It writes ``out [B, L, K, d]`` and ``lse [B, L, K]`` (fp32, kept for
the backward).

Backward, two launches. (1) The scan again, given the output gradient ``g``: ``delta_t = <g_t,
out_t>`` per ``(b, t, k)``, from the fp32 output (taken from the stored output, rounded to ``h``'s
dtype, fp16 ``dscores`` came out at more than twice the twin's error at d = 128). (2) The gradients
on a grid of ``B L / BLOCK_T`` programs in flash-attention's dK/dV form: each program owns one block of
positions ``l`` of one sequence and, per interest, walks the blocks of output rows ``t >= l``:
``w[t, l] = exp(s_l - lse_t)`` comes from the saved ``lse`` (no product to recompute),
``dh += wᵀ g`` and ``gh = g hᵀ`` run on the tensor cores, ``ds += Σ_t w (gh - delta)``. No carries
and no atomics: one program writes each row of ``dh`` (deterministic), and there are ``B L / BLOCK_T``
programs, where a reverse scan that owns a sequence's ``K`` interests (``dh`` sums over them) has
``B``. Rows ``t`` are read once per block ``l <= t``, about ``L / (2 BLOCK_T)`` times each, mostly
from L2 (a sequence's programs are adjacent in the grid).

Positions at or past ``lengths[b]`` are never read; their outputs, log-sum-exps and gradients are
written as zeros. Exponentials are ``exp2`` (the interpreter has no libdevice). Products take the
inputs' dtype and accumulate in fp32; fp32 products are IEEE (no TF32).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from recsys.kernels.common.launch import MAX_KEYS, Kernel, Launch, aligned

__all__ = ["LaunchConfig", "backward", "backward_config", "forward", "forward_config"]

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@dataclass(frozen=True)
class LaunchConfig:
    """Tile and launch shape of one kernel.

    Attributes:
        block_t: positions per block, a power of two >= 16 (the ``[block_t, block_t]`` prefix tile).
        num_warps: warps per program.
        num_stages: software-pipelining depth of the block loop.
    """

    block_t: int
    num_warps: int
    num_stages: int = 1


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def forward_config(d: int) -> LaunchConfig:
    """Default launch of the scan (the forward, and the backward's delta pass) for ``h [*, *, d]``:
    16-position blocks in the interpreter (test sequences then cross several blocks, exercising the
    carry); on a GPU 32-position blocks, on 8 warps past ``d = 128`` (sm_90: 96-113 registers per
    thread, no spill, at d = 64-256)."""
    if _interpreting():
        return LaunchConfig(16, 4)
    return LaunchConfig(32, 4 if d <= 128 else 8, 2)


def backward_config(d: int, dtype: torch.dtype) -> LaunchConfig:
    """Default launch of the gradient kernel for ``h [*, *, d]`` of ``dtype``, all on 8 warps (on 4
    they spill). fp16/bf16: 64-position blocks (sm_90: 173, 225 and 251 registers per thread at
    d = 64, 128, 256, no spill). fp32 (IEEE products, no tensor cores) holds wider operands: 32
    positions up to d = 64, 16 beyond (no spill up to d = 128; 352 bytes of spill at d = 256)."""
    if _interpreting():
        return LaunchConfig(16, 4)
    if dtype != torch.float32:
        return LaunchConfig(64, 8, 2)
    return LaunchConfig(32 if d <= 64 else 16, 8, 2)


@triton.jit
def _valid_length(LENGTHS, b, L):
    """``lengths[b]`` (any int dtype) as int32 clamped to ``[0, L]``."""
    return tl.minimum(tl.maximum(tl.load(LENGTHS + b).to(tl.int32), 0), L)


@triton.jit
def _scan_kernel(
    H,
    S,
    LENGTHS,
    G,
    OUT,
    ROW,
    L,
    D,
    K,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
    WITH_GRAD: tl.constexpr,
):
    """The forward scan of program ``(b, k)``'s sequence. Without ``WITH_GRAD``: ``OUT[b, t, k]`` and
    ``ROW[b, t, k] = lse_t``; with it: only ``ROW[b, t, k] = <G[b, t, k], out_t>`` (the backward's
    delta, from the fp32 output rather than the stored, rounded one). Zeros past the sequence."""
    b = tl.program_id(0)
    k = tl.program_id(1)
    n = _valid_length(LENGTHS, b, L)
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    earlier = offs_t[None, :] <= offs_t[:, None]  # [t, l]: l is in prefix t
    first = b.to(tl.int64) * L  # flat row of the sequence's position 0
    lse_c = float("-inf")  # log-sum-exp of the scores before the block
    out_c = tl.zeros([BLOCK_D], tl.float32)  # the output at the row before the block
    for start in range(0, n, BLOCK_T):
        rows = first + start + offs_t
        r_ok = start + offs_t < n
        in_seq = start + offs_t < L
        tile = (rows * K + k)[:, None] * D + offs_d[None, :]
        s = tl.load(S + rows * K + k, mask=r_ok, other=0.0).to(tl.float32)  # [T]
        hb = tl.load(H + rows[:, None] * D + offs_d[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0)
        x = tl.where(earlier & r_ok[None, :], s[None, :], float("-inf"))  # [T, T]
        m = tl.maximum(tl.max(x, axis=1), lse_c)  # finite: every row sees position `start`
        p = tl.exp2((x - m[:, None]) * LOG2E)
        carry = tl.exp2((lse_c - m) * LOG2E)  # 0 in the first block
        z = tl.sum(p, axis=1) + carry  # >= 1
        lse = m + tl.log2(z) * LN2  # [T]
        inv = 1.0 / z
        o = tl.dot((p * inv[:, None]).to(hb.dtype), hb, input_precision=PRECISION)
        o = tl.where(r_ok[:, None], o + (carry * inv)[:, None] * out_c[None, :], 0.0)  # [T, BLOCK_D]
        if WITH_GRAD:
            g = tl.load(G + tile, mask=r_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
            tl.store(ROW + rows * K + k, tl.sum(g * o, axis=1), mask=in_seq)
        else:
            tl.store(OUT + tile, o.to(OUT.dtype.element_ty), mask=in_seq[:, None] & d_ok[None, :])
            tl.store(ROW + rows * K + k, tl.where(r_ok, lse, 0.0), mask=in_seq)
        last = offs_t == tl.minimum(n - start, BLOCK_T) - 1
        out_c = tl.sum(tl.where(last[:, None], o, 0.0), axis=0)
        lse_c = tl.sum(tl.where(last, lse, 0.0), axis=0)
    for start in range(tl.cdiv(n, BLOCK_T) * BLOCK_T, L, BLOCK_T):  # past the sequence: zeros
        rows = first + start + offs_t
        in_seq = start + offs_t < L
        if not WITH_GRAD:
            tl.store(
                OUT + (rows * K + k)[:, None] * D + offs_d[None, :],
                tl.zeros([BLOCK_T, BLOCK_D], OUT.dtype.element_ty),
                mask=in_seq[:, None] & d_ok[None, :],
            )
        tl.store(ROW + rows * K + k, tl.zeros([BLOCK_T], tl.float32), mask=in_seq)


@triton.jit
def _bwd_kernel(
    H,
    S,
    LENGTHS,
    LSE,
    DELTA,
    G,
    DH,
    DS,
    L,
    D,
    K,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """``DH`` and ``DS`` at one block of positions ``l`` of one sequence, summed over the interests
    and over the output rows ``t >= l`` of the sequence. Program ``b * blocks + j`` takes block ``j``
    of sequence ``b``: a sequence's programs run side by side and share its rows in L2."""
    blocks = tl.cdiv(L, BLOCK_T)
    b = tl.program_id(0) // blocks
    j = tl.program_id(0) % blocks
    n = _valid_length(LENGTHS, b, L)
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    first = b.to(tl.int64) * L
    start = j * BLOCK_T
    rows_l = first + start + offs_t
    in_seq = start + offs_t < L
    l_ok = start + offs_t < n
    dh = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)
    if start < n:
        hb = tl.load(H + rows_l[:, None] * D + offs_d[None, :], mask=l_ok[:, None] & d_ok[None, :], other=0.0)
        for k in range(K):
            s = tl.load(S + rows_l * K + k, mask=l_ok, other=0.0).to(tl.float32)  # [l]
            ds = tl.zeros([BLOCK_T], tl.float32)
            for t0 in range(start, n, BLOCK_T):
                rows_t = first + t0 + offs_t
                t_ok = t0 + offs_t < n
                lse = tl.load(LSE + rows_t * K + k, mask=t_ok, other=0.0)  # [t]
                delta = tl.load(DELTA + rows_t * K + k, mask=t_ok, other=0.0)  # [t]
                g = tl.load(
                    G + (rows_t * K + k)[:, None] * D + offs_d[None, :], mask=t_ok[:, None] & d_ok[None, :], other=0.0
                )  # [t, BLOCK_D]
                visible = ((t0 + offs_t)[:, None] >= (start + offs_t)[None, :]) & t_ok[:, None]  # [t, l]
                w = tl.exp2(tl.where(visible, s[None, :] - lse[:, None], float("-inf")) * LOG2E)  # <= 1
                dh = tl.dot(tl.trans(w.to(g.dtype)), g, dh, input_precision=PRECISION)  # [l, BLOCK_D]
                gh = tl.dot(g, tl.trans(hb), input_precision=PRECISION)  # [t, l]: <g_t, h_l>
                ds += tl.sum(w * (gh - delta[:, None]), axis=0)
            tl.store(DS + rows_l * K + k, ds.to(DS.dtype.element_ty), mask=in_seq)
    else:  # past the sequence: zero gradients
        for k in range(K):
            tl.store(DS + rows_l * K + k, tl.zeros([BLOCK_T], DS.dtype.element_ty), mask=in_seq)
    tl.store(
        DH + rows_l[:, None] * D + offs_d[None, :], dh.to(DH.dtype.element_ty), mask=in_seq[:, None] & d_ok[None, :]
    )


_SCAN, _BACKWARD = Kernel(_scan_kernel), Kernel(_bwd_kernel)
_LAUNCHES: dict[tuple, Launch] = {}


def _launch(kernel: Kernel, key: tuple, grid: tuple[int, ...], meta: dict) -> Launch:
    """The launch of ``kernel`` for problem ``key`` (see :mod:`recsys.kernels.launch`), built once."""
    launch = _LAUNCHES.get(key)
    if launch is None:
        if len(_LAUNCHES) >= MAX_KEYS:
            _LAUNCHES.clear()
        launch = _LAUNCHES[key] = kernel.launch(grid, meta)
    return launch


def _meta(h: Tensor, cfg: LaunchConfig) -> dict:
    return {
        "BLOCK_T": cfg.block_t,
        "BLOCK_D": max(16, triton.next_power_of_2(h.shape[2])),
        "PRECISION": "ieee" if h.dtype == torch.float32 else "tf32",
        "num_warps": cfg.num_warps,
        "num_stages": cfg.num_stages,
    }


def _scan(
    h: Tensor,
    scores: Tensor,
    lengths: Tensor,
    grad: Tensor | None,
    out: Tensor | None,
    row: Tensor,
    config: LaunchConfig | None,
) -> None:
    """Launch the scan kernel: the forward (``grad`` None) or the backward's delta pass (``out`` None)."""
    b, seq_len, d = h.shape
    k = scores.shape[2]
    cfg = config or forward_config(d)
    with_grad = grad is not None
    key = (
        "scan",
        with_grad,
        h.device,
        h.dtype,
        scores.dtype,
        lengths.dtype,
        h.shape,
        k,
        aligned(h, scores, lengths, grad),
        cfg,
    )
    launch = _launch(_SCAN, key, (b, k), {**_meta(h, cfg), "WITH_GRAD": with_grad})
    launch(h, scores, lengths, grad if with_grad else h, out if out is not None else h, row, seq_len, d, k)


def forward(h: Tensor, scores: Tensor, lengths: Tensor, config: LaunchConfig | None = None) -> tuple[Tensor, Tensor]:
    """The forward kernel on contiguous ``h [B, L, d]`` (fp16/bf16/fp32), ``scores [B, L, K]`` (read
    in fp32) and ``lengths [B]`` int, on one device.

    Returns:
        ``(out [B, L, K, d] in h's dtype, lse [B, L, K] fp32)``: ``lse[b, t, k]`` is the log-sum-exp
        of ``scores[b, : t + 1, k]``; both 0 at ``t >= lengths[b]``.
    """
    b, seq_len, d = h.shape
    k = scores.shape[2]
    out = torch.empty((b, seq_len, k, d), device=h.device, dtype=h.dtype)
    lse = torch.empty((b, seq_len, k), device=h.device, dtype=torch.float32)
    if out.numel() == 0:
        return out, lse.zero_()
    _scan(h, scores, lengths, None, out, lse, config)
    return out, lse


def backward(
    h: Tensor,
    scores: Tensor,
    lengths: Tensor,
    lse: Tensor,
    grad: Tensor,
    config: LaunchConfig | None = None,
    scan_config: LaunchConfig | None = None,
) -> tuple[Tensor, Tensor]:
    """The backward kernels: :func:`forward`'s inputs, its ``lse`` and the (contiguous) gradient
    ``grad [B, L, K, d]`` of its output. ``config`` is the gradient kernel's launch (default
    :func:`backward_config`), ``scan_config`` the delta pass's (default :func:`forward_config`).

    Returns:
        ``(dh [B, L, d] in h's dtype, dscores [B, L, K] in scores' dtype)``; 0 at padded positions.
    """
    b, seq_len, d = h.shape
    k = scores.shape[2]
    if grad.numel() == 0:
        return torch.zeros_like(h), torch.zeros_like(scores)
    grad = grad.to(h.dtype)
    delta = torch.empty_like(lse)
    _scan(h, scores, lengths, grad, None, delta, scan_config)
    dh = torch.empty_like(h)
    dscores = torch.empty_like(scores)
    cfg = config or backward_config(d, h.dtype)
    key = ("grad", h.device, h.dtype, scores.dtype, lengths.dtype, h.shape, k, aligned(h, scores, lengths, grad), cfg)
    _launch(_BACKWARD, key, (b * triton.cdiv(seq_len, cfg.block_t),), _meta(h, cfg))(
        h, scores, lengths, lse, delta, grad, dh, dscores, seq_len, d, k
    )
    return dh, dscores
