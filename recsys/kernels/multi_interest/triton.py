"""Fused Triton kernels for ComiRec-SA's self-attentive multi-interest extraction.

For each sequence ``b`` with ``n = lengths[b]`` valid clicks::

    X = H[b] + P                   [L, d]       (positions feed the scores only)
    T = tanh(X W1)                 [L, hidden]
    S = T W2                       [L, K]
    A = softmax over l < n of S    [L, K]
    out[b] = Aᵀ H[b]               [K, d]

Forward, three launches. (0) *Valid-row list*, kept on the device: the exclusive prefix sum ``cu``
of the clamped lengths, the number of valid rows ``cu[B]``, and ``idx``: slot ``cu[b] + l`` of the
list holds the flat row ``b L + l`` of position ``l < lengths[b]`` (each program sums the lengths
before its sequences itself: one launch). (1) *Scores*: tiles of ``BLOCK_M`` slots of the list (the
grid covers all ``B L`` rows and tiles past ``cu[B]`` do nothing, so there is no host sync), so
padded rows cost nothing; a loop
over slices of the hidden units computes ``tanh(X W1)`` in registers and accumulates ``S``, so the
``[B, L, hidden]`` activation never reaches memory; ``S [B, L, K]`` fp32 (small) does. (2) *Pool*:
one program per sequence reads ``S`` and ``H`` once more and does the masked softmax over ``L``
(online, over blocks) and ``Aᵀ H``; it also writes the log-sum-exp ``[B, K]`` for backward and
zeros into the padded rows' scores.

Backward, four launches (five with positions; the registered operator used under
``torch.compile`` builds the valid-row list again first). (1) Per sequence: ``A`` from the saved
``S`` and log-sum-exp, the value path ``dH = A dO`` and the score gradients
``dS = A (dA - <dO, O>)`` (``[B, L, K]``, small). The next kernels walk tiles of the forward's
valid-row list (tile row ``i`` is flat row ``idx[i]``), so their work scales with the number of
clicks, not ``B L``; their grids are sized for all ``B L`` rows and tiles past ``cu[B]`` do nothing
(no host sync).
(2) *Weights*: persistent programs on a ``(programs, hidden slices)`` grid, looping to
``cdiv(cu[B], BLOCK_M)``; each recomputes ``tanh`` for its slice and sums ``Xᵀ dZ`` and ``Tᵀ dS``
in registers. Under CUDA-graph capture it runs on a second stream (:func:`_side_stream`),
alongside (3) and (4). (3) *dX*: over hidden slices it recomputes ``tanh``, forms
``dZ = (dS W2ᵀ) (1 - T²)`` and accumulates ``dX = dZ W1ᵀ``, which it adds to ``dH`` in place (and,
with positions, stores for dP). (4) With positions, *dP*: per position and chunk of sequences, the
sum of the valid rows' dX. (5) After the streams join, one launch sums the per-program weight
partials and dP's partials, in a fixed order: deterministic, no atomics.

On Hopper and newer GPUs every launch carries programmatic dependent launch: a kernel first
waits for the one before it on the stream (``griddepcontrol.wait``), then lets the next one
launch, so the next kernel's programs are already resident when this one's last programs finish
(about 5 us less per forward+backward at the bench shapes, same bits; docs/notes/results-history.md,
"Kernels").
``RECSYS_PDL=0`` launches plainly.

Tiles span many rows (several sequences) because one sequence's work is a chain of small
dependent steps: with a tile per sequence the GPU mostly waits on latency.

With a score cap ``c`` (``model.score_cap``) the scores kernel stores ``c · tanh(S / c)`` and the
backward's scores kernel multiplies ``dS`` by ``1 - (S / c)²``; the (capped) scores can also be
returned, differentiable, for a loss term on the attention (their gradient is added to ``dS``).

Rows at or past ``lengths[b]`` contribute nothing and get zero gradients (the kernels do not
read them; their returned scores are 0, and a gradient of the returned scores there is ignored); a
sequence of length 0 gives zero interests. For
fp16/bf16 on GPU, ``tanh`` is the hardware ``tanh.approx.f32`` (its result is rounded to the
operand dtype for the next product anyway, as in the PyTorch twin); fp32 and the interpreter
use an ``exp2`` form exact to fp32 rounding, and fp32 products run in IEEE fp32 (no TF32).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from recsys.kernels.common.launch import MAX_KEYS, Kernel, Launch, aligned

try:  # grid dependency control, for programmatic dependent launch (Triton >= 3.3)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_PDL = True
except ImportError:  # older Triton: the launches are never chained, so these are never called
    HAS_PDL = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass


LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
SUM_BLOCK_N = 32  # weights (columns) per program of the partial-gradient sum


@dataclass(frozen=True)
class LaunchConfig:
    """Tile and launch shape of one kernel.

    Attributes:
        block_l: rows per tile (flat rows of ``B L``, or positions of one sequence for the
            per-sequence kernels), a power of two >= 16.
        num_warps: warps per program.
        num_stages: software-pipelining depth of the kernel's loops.
        programs_per_sm: persistent programs per multiprocessor, for the weight-gradient
            kernel (it sums partial gradients); the others launch one program per tile.
        block_h: hidden units per slice (scores, dX and weights kernels).
        max_registers: cap on registers per thread given to ptxas (Triton's ``maxnreg``), or None
            for ptxas's own choice. Programs per multiprocessor are set by registers per program:
            65,536 registers hold two 256-thread programs only at <= 128 registers each.
    """

    block_l: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 0
    block_h: int = 64
    max_registers: int | None = None


@dataclass(frozen=True)
class ForwardConfig:
    """Launch shapes of the two forward kernels."""

    scores: LaunchConfig
    pool: LaunchConfig


@dataclass(frozen=True)
class BackwardConfig:
    """Launch shapes of the three heavy backward kernels (the row list, dP and the sums have fixed shapes)."""

    scores: LaunchConfig
    dx: LaunchConfig
    weights: LaunchConfig


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _max_programs(device: torch.device, programs_per_sm: int) -> int:
    if device.type != "cuda":
        return 3  # the interpreter runs programs one by one; a few exercise the strided loops
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device()) * programs_per_sm


def forward_config(seq_len: int, d: int, hidden: int) -> ForwardConfig:
    """Default forward launches for ``h [*, seq_len, d]`` and ``w1 [d, hidden]``.

    The defaults (here and in :func:`backward_config`) are the fastest of launch sweeps on sm_90
    (``benchmarks/multi_interest.py --sweep``) at B = 4096, L = 50, K = 4 and B = 1024, L = 200,
    K = 8, d = 64, hidden = 256, lengths uniform in [L/4, L]; none spills registers except the
    weight kernel's (192 bytes, and still the fastest).
    """
    if _interpreting():
        return ForwardConfig(LaunchConfig(32, 4, 1, block_h=32), LaunchConfig(16, 4, 1))
    return gpu_forward_config(seq_len, d, hidden)


def gpu_forward_config(seq_len: int, d: int, hidden: int) -> ForwardConfig:
    """The forward launches compiled for a GPU (:func:`forward_config` says where they come from)."""
    # the scores kernel reading its rows from the valid-row list takes 102 registers (sm_90, Triton
    # 3.9): capped at 96 it keeps five programs per multiprocessor, no spill
    return ForwardConfig(
        scores=LaunchConfig(block_l=64, num_warps=4, num_stages=3, block_h=64, max_registers=96),
        pool=LaunchConfig(block_l=64, num_warps=4, num_stages=1),
    )


def backward_config(seq_len: int, d: int, hidden: int) -> BackwardConfig:
    """Default backward launches for ``h [*, seq_len, d]`` and ``w1 [d, hidden]``: small tiles in
    the interpreter, else :func:`gpu_backward_config`."""
    if _interpreting():
        return BackwardConfig(
            LaunchConfig(16, 4, 1), LaunchConfig(32, 4, 1, block_h=32), LaunchConfig(16, 4, 1, 1, block_h=32)
        )
    return gpu_backward_config(seq_len, d, hidden)


def gpu_backward_config(seq_len: int, d: int, hidden: int) -> BackwardConfig:
    """The backward launches compiled for a GPU (see :func:`forward_config` for where they come from)."""
    # register caps for more programs per multiprocessor (sm_90): the scores kernel capped at 120
    # fits four 4-warp programs (it takes 115, no spill; uncapped, Triton 3.6 gives it 130: three);
    # the dX kernel's 64 x 32 tile needs 96 registers, five programs (a 128 x 64 tile on 8 warps
    # takes 130: one)
    return BackwardConfig(
        scores=LaunchConfig(block_l=64, num_warps=4, num_stages=1, max_registers=120),
        dx=LaunchConfig(block_l=64, num_warps=4, num_stages=3, block_h=32),
        weights=LaunchConfig(block_l=64, num_warps=4, num_stages=2, programs_per_sm=2, block_h=128),
    )


@triton.jit
def _after_prior_grid(PDL: tl.constexpr):
    """With programmatic dependent launch (``PDL``): wait until the kernel before this one on the
    stream has finished (its writes visible), then let the next one launch, whose programs take the
    multiprocessors this kernel's last programs free and wait there. A no-op without."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _clamped(lengths, L):
    """Loaded lengths (any int dtype) as int32 in ``[0, L]``."""
    return tl.minimum(tl.maximum(lengths.to(tl.int32), 0), L)


@triton.jit
def _tanh(z, dt: tl.constexpr, MODE: tl.constexpr):
    """tanh of an fp32 tile, returned in ``dt`` (the operand dtype of the next product).

    MODE 0: exact to fp32 rounding via exp2 (fp32 inputs, the interpreter); 1: the hardware
    ``tanh.approx.f32`` (fp16/bf16 on GPU; one MUFU op per value, and the SASS of the packed
    ``tanh.approx.bf16x2`` is two MUFU ops, so packing gains nothing).
    """
    if MODE == 1:
        return tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=r,r", [z], dtype=tl.float32, is_pure=True, pack=1
        ).to(dt)
    else:
        e = tl.exp2(tl.abs(z) * (-2.0 * LOG2E))  # exp(-2|z|) in (0, 1]
        t = (1.0 - e) / (1.0 + e)
        return tl.where(z < 0, -t, t).to(dt)


@triton.jit
def _hidden_slice(W1, W2, cols, offs_d, offs_k, d_ok, k_ok, HID, stride_w1, stride_w2, dt: tl.constexpr):
    """``W1[:, cols]`` ``[BLOCK_D, BLOCK_H]`` and ``W2[cols]ᵀ`` ``[BLOCK_K, BLOCK_H]``, zero-padded,
    rounded to the compute dtype ``dt`` (the weights may be stored wider, e.g. fp32 under autocast)."""
    c_ok = cols < HID
    w1 = tl.load(W1 + offs_d[:, None] * stride_w1 + cols[None, :], mask=d_ok[:, None] & c_ok[None, :], other=0.0)
    w2t = tl.load(W2 + cols[None, :] * stride_w2 + offs_k[:, None], mask=c_ok[None, :] & k_ok[:, None], other=0.0)
    return w1.to(dt), w2t.to(dt)


@triton.jit
def _flat_rows(H, POS, rows, offs_d, r_ok, d_ok, L, D, stride_pl, HAS_POS: tl.constexpr):
    """``H[rows] + P[rows % L]`` ``[M, BLOCK_D]`` for flat rows of a contiguous ``H``."""
    mask = r_ok[:, None] & d_ok[None, :]
    x = tl.load(H + rows.to(tl.int64)[:, None] * D + offs_d[None, :], mask=mask, other=0.0)
    if HAS_POS:
        p = tl.load(POS + (rows % L)[:, None] * stride_pl + offs_d[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + p.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _x_and_ds(H, POS, DS, rows, r_ok, offs_d, offs_k, d_ok, k_ok, L, D, K, stride_pl, HAS_POS: tl.constexpr):
    """``(H + P)[rows]`` ``[M, BLOCK_D]`` and ``dS[rows]`` ``[M, BLOCK_K]`` (zeros where ``r_ok`` is false)."""
    x = _flat_rows(H, POS, rows, offs_d, r_ok, d_ok, L, D, stride_pl, HAS_POS)
    ds = tl.load(DS + rows.to(tl.int64)[:, None] * K + offs_k[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
    return x, ds


@triton.jit
def _valid_rows(IDX, start, total, BLOCK_M: tl.constexpr):
    """Flat row ids ``IDX[start : start + BLOCK_M]`` of the valid-row list and their mask (``< total``);
    masked entries read row 0 (and are masked again at every load and store)."""
    slots = start + tl.arange(0, BLOCK_M)
    r_ok = slots < total
    return tl.load(IDX + slots, mask=r_ok, other=0), r_ok


@triton.jit
def _mi_scores_kernel(
    H,
    POS,
    W1,
    W2,
    S,
    CU,
    IDX,
    R,
    L,
    D,
    HID,
    K,
    stride_pl,
    stride_w1,
    stride_w2,
    CAP,
    HAS_POS: tl.constexpr,
    HAS_CAP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TANH_MODE: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """``S[rows] = tanh((H + P)[rows] W1) W2`` (fp32) for one tile of the valid-row list (rows
    ``IDX[pid BLOCK_M ...]``; the grid covers all ``R`` rows, tiles past ``CU[B]`` do nothing); with
    ``HAS_CAP`` the stored scores are ``CAP · tanh(S / CAP)``. Padded rows are neither read nor
    written here (the pool kernel zeroes their scores)."""
    _after_prior_grid(PDL)
    start = tl.program_id(0) * BLOCK_M
    total = tl.load(CU + R // L)
    if start < total:
        dt = H.dtype.element_ty
        rows, r_ok = _valid_rows(IDX, start, total, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_h = tl.arange(0, BLOCK_H)
        offs_k = tl.arange(0, BLOCK_K)
        d_ok = offs_d < D
        k_ok = offs_k < K
        x = _flat_rows(H, POS, rows, offs_d, r_ok, d_ok, L, D, stride_pl, HAS_POS)  # [BLOCK_M, BLOCK_D]
        s = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
        for c in range(0, HID, BLOCK_H):
            w1, w2t = _hidden_slice(W1, W2, c + offs_h, offs_d, offs_k, d_ok, k_ok, HID, stride_w1, stride_w2, dt)
            t = _tanh(tl.dot(x, w1, input_precision=PRECISION), dt, TANH_MODE)  # [BLOCK_M, BLOCK_H]
            s = tl.dot(t, tl.trans(w2t), s, input_precision=PRECISION)
        if HAS_CAP:
            s = CAP * _tanh(s / CAP, tl.float32, 0)
        tl.store(S + rows.to(tl.int64)[:, None] * K + offs_k[None, :], s, mask=r_ok[:, None] & k_ok[None, :])


@triton.jit
def _mi_pool_kernel(
    H,
    S,
    LENGTHS,
    OUT,
    LSE,
    L,
    D,
    K,
    stride_hb,
    stride_hl,
    stride_ob,
    stride_ok,
    SINGLE_BLOCK: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """Masked softmax over the sequence and ``Aᵀ H`` for one sequence; also its log-sum-exp, and
    zeros into the scores of its padded rows."""
    _after_prior_grid(PDL)
    b = tl.program_id(0)
    dt = H.dtype.element_ty
    offs_l = tl.arange(0, BLOCK_L)
    offs_d = tl.arange(0, BLOCK_D)
    offs_k = tl.arange(0, BLOCK_K)
    d_ok = offs_d < D
    k_ok = offs_k < K
    n = _clamped(tl.load(LENGTHS + b), L)
    h_seq = H + tl.cast(b, tl.int64) * stride_hb
    s_seq = S + tl.cast(b, tl.int64) * L * K
    m_i = tl.full([BLOCK_K], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_K], tl.float32)
    acc = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
    if SINGLE_BLOCK:
        m_i, l_i, acc = _pool_block(
            h_seq, s_seq, m_i, l_i, acc, 0, n, K, stride_hl, offs_l, offs_d, offs_k, d_ok, k_ok, PRECISION
        )
    else:
        for start in range(0, n, BLOCK_L):
            m_i, l_i, acc = _pool_block(
                h_seq, s_seq, m_i, l_i, acc, start, n, K, stride_hl, offs_l, offs_d, offs_k, d_ok, k_ok, PRECISION
            )
    for start in range(n // BLOCK_L * BLOCK_L, L, BLOCK_L):  # padded scores are 0 (never computed)
        rows = start + offs_l
        pad = (rows >= n) & (rows < L)
        tl.store(
            s_seq + rows[:, None] * K + offs_k[None, :],
            tl.zeros([BLOCK_L, BLOCK_K], tl.float32),
            mask=pad[:, None] & k_ok[None, :],
        )
    has = l_i > 0.0  # false exactly when n == 0
    l_safe = tl.where(has, l_i, 1.0)
    out = acc / l_safe[:, None]  # [BLOCK_K, BLOCK_D]; 0 when n == 0
    o_ptr = OUT + tl.cast(b, tl.int64) * stride_ob + offs_k[:, None] * stride_ok + offs_d[None, :]
    tl.store(o_ptr, out.to(dt), mask=k_ok[:, None] & d_ok[None, :])
    tl.store(LSE + b * K + offs_k, tl.where(has, m_i + tl.log2(l_safe) * LN2, 0.0), mask=k_ok)


@triton.jit
def _pool_block(
    h_seq, s_seq, m_i, l_i, acc, start, n, K, stride_hl, offs_l, offs_d, offs_k, d_ok, k_ok, PRECISION: tl.constexpr
):
    """One block of positions: online-softmax update of ``(max, sum, Aᵀ H)``."""
    rows = start + offs_l
    r_ok = rows < n
    s = tl.load(s_seq + rows[:, None] * K + offs_k[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
    s = tl.where(r_ok[:, None], s, float("-inf"))  # [BLOCK_L, BLOCK_K]
    hb = tl.load(h_seq + rows[:, None] * stride_hl + offs_d[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0)
    m_new = tl.maximum(m_i, tl.max(s, axis=0))
    m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # a block with no valid row stays at -inf
    alpha = tl.exp2((m_i - m_safe) * LOG2E)
    p = tl.exp2((s - m_safe[None, :]) * LOG2E)  # 0 on masked rows
    l_i = l_i * alpha + tl.sum(p, axis=0)
    acc = acc * alpha[:, None] + tl.dot(tl.trans(p.to(hb.dtype)), hb, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _mi_bwd_scores_kernel(
    H,
    S,
    LENGTHS,
    OUT,
    DOUT,
    LSE,
    DH,
    DS,
    L,
    D,
    K,
    stride_hb,
    stride_hl,
    stride_ob,
    stride_ok,
    CAP,
    HAS_CAP: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """One sequence: ``A``, ``dH = A dO`` (value path) and ``dS = A (H dOᵀ - <dO, O>)``; 0 on padding.

    With ``HAS_CAP`` the saved ``S`` are the capped scores and ``dS`` is taken through the cap
    (times ``1 - (S / CAP)²``), so it is the gradient of the raw scores.
    """
    _after_prior_grid(PDL)
    b = tl.program_id(0)
    b64 = tl.cast(b, tl.int64)
    dt = H.dtype.element_ty
    offs_l = tl.arange(0, BLOCK_L)
    offs_d = tl.arange(0, BLOCK_D)
    offs_k = tl.arange(0, BLOCK_K)
    d_ok = offs_d < D
    k_ok = offs_k < K
    n = _clamped(tl.load(LENGTHS + b), L)
    kd_ptr = b64 * stride_ob + offs_k[:, None] * stride_ok + offs_d[None, :]
    kd_mask = k_ok[:, None] & d_ok[None, :]
    do = tl.load(DOUT + kd_ptr, mask=kd_mask, other=0.0)  # [BLOCK_K, BLOCK_D]
    o = tl.load(OUT + kd_ptr, mask=kd_mask, other=0.0)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), axis=1)  # [BLOCK_K] = dO·O
    lse = tl.load(LSE + b * K + offs_k, mask=k_ok, other=0.0)
    for start in range(0, L, BLOCK_L):
        rows = start + offs_l
        in_l = rows < L
        r_ok = rows < n
        valid = r_ok[:, None] & k_ok[None, :]
        sk_ptr = (b64 * L + rows[:, None]) * K + offs_k[None, :]
        s = tl.load(S + sk_ptr, mask=valid, other=0.0)
        a = tl.where(valid, tl.exp2((s - lse[None, :]) * LOG2E), 0.0)  # [BLOCK_L, BLOCK_K]
        h_ptr = b64 * stride_hb + rows[:, None] * stride_hl + offs_d[None, :]
        hb = tl.load(H + h_ptr, mask=r_ok[:, None] & d_ok[None, :], other=0.0)
        dh = tl.dot(a.to(dt), do, input_precision=PRECISION)  # [BLOCK_L, BLOCK_D]
        da = tl.dot(hb, tl.trans(do), input_precision=PRECISION)  # [BLOCK_L, BLOCK_K]
        tl.store(DH + h_ptr, dh.to(dt), mask=in_l[:, None] & d_ok[None, :])
        ds = a * (da - delta[None, :])
        if HAS_CAP:
            ds = ds * (1.0 - (s / CAP) * (s / CAP))
        tl.store(DS + sk_ptr, ds.to(dt), mask=in_l[:, None] & k_ok[None, :])


@triton.jit
def _mi_bwd_dx_kernel(
    H,
    POS,
    DS,
    W1,
    W2,
    DH,
    DX,
    CU,
    IDX,
    R,
    L,
    D,
    HID,
    K,
    stride_pl,
    stride_w1,
    stride_w2,
    HAS_POS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TANH_MODE: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """Score path of dH for one tile of the valid-row list: ``dX = ((dS W2ᵀ) (1 - T²)) W1ᵀ``.

    Tile row ``i`` is flat row ``IDX[i]``, for ``i < CU[B]`` (the number of valid rows; the grid
    covers all ``R`` rows, tiles past the valid ones do nothing). Adds dX to ``DH`` (which holds
    the value path, and zeros on padding) in place; with positions it also stores dX in ``DX``
    (its padded rows are left unwritten; :func:`_mi_dpos_kernel` reads valid rows only).
    """
    _after_prior_grid(PDL)
    start = tl.program_id(0) * BLOCK_M
    total = tl.load(CU + R // L)
    if start < total:
        _dx_tile(
            H,
            POS,
            DS,
            W1,
            W2,
            DH,
            DX,
            IDX,
            start,
            total,
            L,
            D,
            HID,
            K,
            stride_pl,
            stride_w1,
            stride_w2,
            HAS_POS,
            BLOCK_M,
            BLOCK_D,
            BLOCK_H,
            BLOCK_K,
            TANH_MODE,
            PRECISION,
        )


@triton.jit
def _dx_tile(
    H,
    POS,
    DS,
    W1,
    W2,
    DH,
    DX,
    IDX,
    start,
    total,
    L,
    D,
    HID,
    K,
    stride_pl,
    stride_w1,
    stride_w2,
    HAS_POS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TANH_MODE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """:func:`_mi_bwd_dx_kernel`'s work for the valid rows ``IDX[start : start + BLOCK_M]`` (``< total``)."""
    dt = H.dtype.element_ty
    offs_d = tl.arange(0, BLOCK_D)
    offs_h = tl.arange(0, BLOCK_H)
    offs_k = tl.arange(0, BLOCK_K)
    d_ok = offs_d < D
    k_ok = offs_k < K
    rows, r_ok = _valid_rows(IDX, start, total, BLOCK_M)
    x, ds = _x_and_ds(H, POS, DS, rows, r_ok, offs_d, offs_k, d_ok, k_ok, L, D, K, stride_pl, HAS_POS)
    dx = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for c in range(0, HID, BLOCK_H):
        w1, w2t = _hidden_slice(W1, W2, c + offs_h, offs_d, offs_k, d_ok, k_ok, HID, stride_w1, stride_w2, dt)
        t = _tanh(tl.dot(x, w1, input_precision=PRECISION), dt, TANH_MODE).to(tl.float32)
        dz = (tl.dot(ds, w2t, input_precision=PRECISION) * (1.0 - t * t)).to(dt)  # [BLOCK_M, BLOCK_H]
        dx = tl.dot(dz, tl.trans(w1), dx, input_precision=PRECISION)
    offs = rows.to(tl.int64)[:, None] * D + offs_d[None, :]
    mask = r_ok[:, None] & d_ok[None, :]
    value_path = tl.load(DH + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(DH + offs, (value_path + dx).to(dt), mask=mask)
    if HAS_POS:
        tl.store(DX + offs, dx.to(dt), mask=mask)


@triton.jit
def _mi_bwd_weights_kernel(
    H,
    POS,
    DS,
    W1,
    W2,
    DW_PART,
    CU,
    IDX,
    R,
    L,
    D,
    HID,
    K,
    stride_pl,
    stride_w1,
    stride_w2,
    HAS_POS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TANH_MODE: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """Per-program sums of dW1 and dW2 for one slice of hidden units over strided tiles of the
    valid-row list (``IDX[:CU[B]]``, as :func:`_mi_bwd_dx_kernel`): padded rows (``dS = 0``) are
    never read. Each program sums its tiles in a fixed order: the same lengths give the same bits.
    A tile's inputs are loaded one tile ahead: Triton does not pipeline these gathered loads
    itself, so this hides their latency (same bits).
    """
    _after_prior_grid(PDL)
    pid_r = tl.program_id(0)
    nprog_r = tl.num_programs(0)
    dt = H.dtype.element_ty
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_k = tl.arange(0, BLOCK_K)
    d_ok = offs_d < D
    k_ok = offs_k < K
    c_ok = cols < HID
    w1, w2t = _hidden_slice(W1, W2, cols, offs_d, offs_k, d_ok, k_ok, HID, stride_w1, stride_w2, dt)
    dw1 = tl.zeros([BLOCK_D, BLOCK_H], tl.float32)
    dw2t = tl.zeros([BLOCK_K, BLOCK_H], tl.float32)  # dW2ᵀ
    total = tl.load(CU + R // L)  # valid rows: B L < 2**31, int32
    # pipelined by hand (Triton does not pipeline these gathered loads): while a tile computes, the
    # next tile's X and dS are in flight and the row ids of the one after are being read
    rows, r_ok = _valid_rows(IDX, pid_r * BLOCK_M, total, BLOCK_M)
    x_next, ds_next = _x_and_ds(H, POS, DS, rows, r_ok, offs_d, offs_k, d_ok, k_ok, L, D, K, stride_pl, HAS_POS)
    rows, r_ok = _valid_rows(IDX, (pid_r + nprog_r) * BLOCK_M, total, BLOCK_M)
    for tile in range(pid_r, tl.cdiv(total, BLOCK_M), nprog_r):
        x, ds = x_next, ds_next  # [BLOCK_M, BLOCK_D], [BLOCK_M, BLOCK_K]
        x_next, ds_next = _x_and_ds(H, POS, DS, rows, r_ok, offs_d, offs_k, d_ok, k_ok, L, D, K, stride_pl, HAS_POS)
        rows, r_ok = _valid_rows(IDX, (tile + 2 * nprog_r) * BLOCK_M, total, BLOCK_M)  # masked past the end
        tc = _tanh(tl.dot(x, w1, input_precision=PRECISION), dt, TANH_MODE)  # [BLOCK_M, BLOCK_H]
        t = tc.to(tl.float32)
        dz = (tl.dot(ds, w2t, input_precision=PRECISION) * (1.0 - t * t)).to(dt)
        dw1 += tl.dot(tl.trans(x), dz, input_precision=PRECISION)
        dw2t += tl.dot(tl.trans(ds), tc, input_precision=PRECISION)
    part = DW_PART + pid_r.to(tl.int64) * (D * HID + HID * K)  # this program's row: dW1 then dW2, flat
    tl.store(part + offs_d[:, None] * HID + cols[None, :], dw1, mask=d_ok[:, None] & c_ok[None, :])
    tl.store(part + D * HID + cols[None, :] * K + offs_k[:, None], dw2t, mask=c_ok[None, :] & k_ok[:, None])


@triton.jit
def _mi_rows_kernel(
    LENGTHS,
    CU,
    IDX,
    B,
    L,
    CHUNK,
    BLOCK_B: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_L: tl.constexpr,
    PDL: tl.constexpr,
):
    """The valid-row list for the sequences ``pid CHUNK ...`` (``CHUNK`` a multiple of ``BLOCK_C``):
    ``CU[b]`` = sum of the lengths (clamped to ``[0, L]``) before sequence ``b`` (its first slot),
    ``IDX[CU[b] + l] = b L + l`` for ``l < lengths[b]``, and from the last program ``CU[B]`` = the
    number of valid rows (int32). Each program sums the lengths before its sequences itself (``B``
    int lengths, in cache): one launch, no second pass, no atomics."""
    _after_prior_grid(PDL)
    seq0 = tl.program_id(0) * CHUNK
    offs_b = tl.arange(0, BLOCK_B)
    offs_c = tl.arange(0, BLOCK_C)
    offs_l = tl.arange(0, BLOCK_L)
    earlier = tl.zeros([BLOCK_B], tl.int32)
    for start in range(0, seq0, BLOCK_B):
        seqs = start + offs_b
        earlier += _clamped(tl.load(LENGTHS + seqs, mask=seqs < seq0, other=0), L)
    prefix = tl.sum(earlier, axis=0)
    for start in range(seq0, tl.minimum(seq0 + CHUNK, B), BLOCK_C):
        seqs = start + offs_c
        ok = seqs < B
        n = _clamped(tl.load(LENGTHS + seqs, mask=ok, other=0), L)
        first = prefix + tl.cumsum(n, axis=0) - n
        tl.store(CU + seqs, first, mask=ok)
        for l0 in range(0, tl.max(n, axis=0), BLOCK_L):
            pos = l0 + offs_l
            tl.store(
                IDX + first[:, None] + pos[None, :], seqs[:, None] * L + pos[None, :], mask=pos[None, :] < n[:, None]
            )
        prefix += tl.sum(n, axis=0)
    if seq0 + CHUNK >= B:
        tl.store(CU + B, prefix)


@triton.jit
def _mi_dpos_kernel(DX, LENGTHS, PART, B, L, D, CHUNK, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    """dP partial sums: program ``(l, s)`` sums ``DX[b, l]`` over the sequences ``b`` of chunk ``s``
    (``CHUNK`` of them) with ``l < lengths[b]``, in fp32 and a fixed order, into ``PART[s, l]``
    (``[programs(1), programs(0), D]``; rows ``l >= L`` get zeros). Padded rows of ``DX`` are never read."""
    _after_prior_grid(PDL)
    l = tl.program_id(0)
    s = tl.program_id(1)
    offs_b = tl.arange(0, BLOCK_B)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    acc = tl.zeros([BLOCK_B, BLOCK_D], tl.float32)
    end = tl.minimum(s * CHUNK + CHUNK, B)
    if l < L:
        for start in range(s * CHUNK, end, BLOCK_B):
            seqs = start + offs_b
            n = tl.load(LENGTHS + seqs, mask=seqs < end, other=0)  # unclamped: l < L already
            ok = (seqs < end) & (l < n)
            x = tl.load(
                DX + (seqs.to(tl.int64)[:, None] * L + l) * D + offs_d[None, :],
                mask=ok[:, None] & d_ok[None, :],
                other=0.0,
            )
            acc += x.to(tl.float32)
    part = PART + (s.to(tl.int64) * tl.num_programs(0) + l) * D
    tl.store(part + offs_d, tl.sum(acc, axis=0), mask=d_ok)


@triton.jit
def _sum_parts_kernel(
    PARTS,
    OUT,
    PARTS2,
    OUT2,
    P,
    N,
    P2,
    N2,
    TWO: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    """``OUT[n] = sum over p of PARTS[p, n]`` (contiguous fp32 ``[P, N]``), summed in fp32 in a fixed
    order and stored in ``OUT``'s dtype (the cast is part of the same launch). With ``TWO`` the
    programs after the first ``cdiv(N, BLOCK_N)`` do the same for ``PARTS2 [P2, N2]`` into ``OUT2``."""
    _after_prior_grid(PDL)
    pid = tl.program_id(0)
    first = tl.cdiv(N, BLOCK_N)
    if pid < first:
        _sum_columns(PARTS, OUT, P, N, pid, BLOCK_P, BLOCK_N)
    elif TWO:
        _sum_columns(PARTS2, OUT2, P2, N2, pid - first, BLOCK_P, BLOCK_N)


@triton.jit
def _sum_columns(PARTS, OUT, P, N, block, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """Columns ``block · BLOCK_N ...`` of :func:`_sum_parts_kernel`."""
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_p = tl.arange(0, BLOCK_P)
    ok = cols < N
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, P, BLOCK_P):
        rows = start + offs_p
        x = tl.load(
            PARTS + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=(rows < P)[:, None] & ok[None, :], other=0.0
        )
        acc += tl.sum(x, axis=0)
    tl.store(OUT + cols, acc.to(OUT.dtype.element_ty), mask=ok)


def _dpos_chunk() -> tuple[int, int]:
    """Sequences per dP program and per load block of :func:`_mi_dpos_kernel`: 256 and 32 on GPU
    (~800 programs at the bench shapes); small in the interpreter, so that tests cross chunks."""
    return (3, 2) if _interpreting() else (256, 32)


def _rows_blocks(batch: int, seq_len: int) -> tuple[int, dict[str, int]]:
    """Sequences per program and block sizes of :func:`_mi_rows_kernel`: small in the interpreter,
    so that tests cross every loop, else :func:`gpu_rows_blocks`."""
    if _interpreting():
        return 4, {"BLOCK_B": 4, "BLOCK_C": 2, "BLOCK_L": 4}
    return gpu_rows_blocks(batch, seq_len)


def gpu_rows_blocks(batch: int, seq_len: int) -> tuple[int, dict[str, int]]:
    """:func:`_rows_blocks` compiled for a GPU: ~64-128 programs, each storing ``BLOCK_C`` sequences
    x ``BLOCK_L`` positions (4096 slots) at a time."""
    block_l = min(max(16, triton.next_power_of_2(seq_len)), 256)
    block_c = max(1, 4096 // block_l)
    chunk = block_c * triton.cdiv(triton.cdiv(batch, 128), block_c)
    return chunk, {"BLOCK_B": 1024, "BLOCK_C": block_c, "BLOCK_L": block_l}


def _sum_block_p(parts: int) -> int:
    """Partial rows per load of :func:`_sum_parts_kernel`: all of them up to 256 on GPU (one load,
    no loop, at up to 256 weight-kernel programs; about half the time of 32-row loads on 128
    columns), 2 in the interpreter (tests cross the loop)."""
    return 2 if _interpreting() else min(256, max(16, triton.next_power_of_2(parts)))


def _blocks(d: int, hidden: int, k: int, block_h: int) -> dict[str, int]:
    return {
        "BLOCK_D": max(16, triton.next_power_of_2(d)),
        "BLOCK_H": min(max(16, triton.next_power_of_2(hidden)), block_h),
        "BLOCK_K": max(16, triton.next_power_of_2(k)),
    }


def _kernel_flags(h: Tensor) -> dict[str, object]:
    fp32 = h.dtype == torch.float32
    exact = fp32 or not h.is_cuda or _interpreting()
    return {"TANH_MODE": 0 if exact else 1, "PRECISION": "ieee" if fp32 else "tf32"}


def _seq_block(seq_len: int, block_l: int) -> int:
    """Positions per block for the per-sequence kernels: all of them, up to ``block_l``."""
    return min(max(16, triton.next_power_of_2(seq_len)), block_l)


def _use_pdl(h: Tensor) -> bool:
    """Whether the launches chain by programmatic dependent launch: on NVIDIA Hopper and newer GPUs
    with Triton >= 3.3 (``RECSYS_PDL=0`` turns it off; read when a problem's launches are first
    planned), never in the interpreter or on ROCm (whose capabilities also start at 9)."""
    return (
        HAS_PDL
        and h.is_cuda
        and torch.version.hip is None
        and not _interpreting()
        and torch.cuda.get_device_capability(h.device)[0] >= 9
        and os.environ.get("RECSYS_PDL", "1") != "0"
    )


def _launch(cfg: LaunchConfig) -> dict[str, int]:
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if cfg.max_registers is not None and not _interpreting():
        options["maxnreg"] = cfg.max_registers
    return options


_KERNELS = {
    "scores": Kernel(_mi_scores_kernel),
    "pool": Kernel(_mi_pool_kernel),
    "rows": Kernel(_mi_rows_kernel),
    "bwd_scores": Kernel(_mi_bwd_scores_kernel),
    "bwd_dx": Kernel(_mi_bwd_dx_kernel),
    "dpos": Kernel(_mi_dpos_kernel),
    "bwd_weights": Kernel(_mi_bwd_weights_kernel),
    "sum_parts": Kernel(_sum_parts_kernel),
}
Plan = dict[str, tuple[Launch, tuple]]  # kernel name -> (its launch, its run-time integer arguments)


def _key(h: Tensor, lengths: Tensor, w1: Tensor, w2: Tensor, pos: Tensor | None, score_cap: float | None) -> tuple:
    """Problem key (see :mod:`recsys.kernels.common.launch`): everything the integer arguments, pointer
    specialisations and compile-time arguments of the launches depend on, but the launch config."""
    return (
        h.device,
        h.dtype,
        h.shape,
        h.stride(),
        w1.dtype,
        w1.shape,
        w1.stride(),
        w2.stride(),
        lengths.dtype,
        None if pos is None else (pos.dtype, pos.shape, pos.stride()),
        bool(score_cap),
        aligned(h, lengths, w1, w2, pos),
    )


_PLANS: dict[tuple, Plan] = {}


def _plan(
    key: tuple,
    h: Tensor,
    w1: Tensor,
    w2: Tensor,
    pos: Tensor | None,
    score_cap: float | None,
    config: ForwardConfig | BackwardConfig | None,
    backward: bool,
) -> Plan:
    """The launches of the forward (or backward) of problem ``key`` under ``config``, built once."""
    plan = _PLANS.get((backward, key, config))
    if plan is not None:
        return plan
    b, seq_len, d = h.shape
    hidden, k = w2.shape
    rows = b * seq_len
    flags = _kernel_flags(h)
    block_d, block_k = max(16, triton.next_power_of_2(d)), max(16, triton.next_power_of_2(k))
    flat_ints = (rows, seq_len, d, hidden, k, pos.stride(0) if pos is not None else 0, w1.stride(0), w2.stride(0))
    seq_ints = (seq_len, d, k, h.stride(0), h.stride(1), k * d, d)  # out is a fresh contiguous [B, K, d]
    has_pos = {"HAS_POS": pos is not None}
    chunk, rows_blocks = _rows_blocks(b, seq_len)
    valid_rows = ((triton.cdiv(b, chunk),), (b, seq_len, chunk), dict(**rows_blocks, num_warps=4, num_stages=1))
    launches: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]]  # name -> (grid, ints, meta)
    if not backward:
        fwd = config or forward_config(seq_len, d, hidden)
        assert isinstance(fwd, ForwardConfig)
        block_l = _seq_block(seq_len, fwd.pool.block_l)
        launches = {
            "rows": valid_rows,
            "scores": (
                (triton.cdiv(rows, fwd.scores.block_l),),
                flat_ints,
                dict(
                    HAS_CAP=bool(score_cap),
                    BLOCK_M=fwd.scores.block_l,
                    **has_pos,
                    **_blocks(d, hidden, k, fwd.scores.block_h),
                    **flags,
                    **_launch(fwd.scores),
                ),
            ),
            "pool": (
                (b,),
                seq_ints,
                dict(
                    SINGLE_BLOCK=seq_len <= block_l,
                    BLOCK_L=block_l,
                    BLOCK_D=block_d,
                    BLOCK_K=block_k,
                    PRECISION=flags["PRECISION"],
                    **_launch(fwd.pool),
                ),
            ),
        }
    else:
        cfg = config or backward_config(seq_len, d, hidden)
        assert isinstance(cfg, BackwardConfig)
        blocks = _blocks(d, hidden, k, cfg.weights.block_h)
        n_hblocks = triton.cdiv(hidden, blocks["BLOCK_H"])
        n_tiles = triton.cdiv(rows, cfg.weights.block_l)
        nprog_r = min(n_tiles, max(1, _max_programs(h.device, cfg.weights.programs_per_sm) // n_hblocks))
        n_weights = d * hidden + hidden * k
        n_pos = 0 if pos is None else pos.shape[0] * d  # dP: [L_max, d]
        chunk, block_b = _dpos_chunk()
        n_chunks = triton.cdiv(b, chunk)
        launches = {
            "rows": valid_rows,  # used when the forward's list is not at hand (the registered op)
            "bwd_scores": (
                (b,),
                seq_ints,
                dict(
                    HAS_CAP=bool(score_cap),
                    BLOCK_L=_seq_block(seq_len, cfg.scores.block_l),
                    BLOCK_D=block_d,
                    BLOCK_K=block_k,
                    PRECISION=flags["PRECISION"],
                    **_launch(cfg.scores),
                ),
            ),
            "bwd_dx": (
                (triton.cdiv(rows, cfg.dx.block_l),),
                flat_ints,
                dict(
                    BLOCK_M=cfg.dx.block_l,
                    **has_pos,
                    **_blocks(d, hidden, k, cfg.dx.block_h),
                    **flags,
                    **_launch(cfg.dx),
                ),
            ),
            "bwd_weights": (
                (nprog_r, n_hblocks),
                flat_ints,
                dict(BLOCK_M=cfg.weights.block_l, **has_pos, **blocks, **flags, **_launch(cfg.weights)),
            ),
            "sum_parts": (
                (triton.cdiv(n_weights, SUM_BLOCK_N) + triton.cdiv(n_pos, SUM_BLOCK_N),),
                (nprog_r, n_weights, n_chunks, n_pos),
                dict(
                    TWO=pos is not None,
                    BLOCK_P=_sum_block_p(max(nprog_r, n_chunks)),
                    BLOCK_N=SUM_BLOCK_N,
                    num_warps=4,
                    num_stages=2,
                ),
            ),
        }
        if pos is not None:
            launches["dpos"] = (
                (pos.shape[0], n_chunks),
                (b, seq_len, d, chunk),
                dict(BLOCK_B=block_b, BLOCK_D=block_d, num_warps=4, num_stages=2),
            )
    pdl = _use_pdl(h)
    chain = {"PDL": pdl, **({"launch_pdl": True} if pdl else {})}
    plan = {
        name: (_KERNELS[name].launch(grid, {**meta, **chain}), ints) for name, (grid, ints, meta) in launches.items()
    }
    if len(_PLANS) >= MAX_KEYS:
        _PLANS.clear()
    _PLANS[(backward, key, config)] = plan
    return plan


def _run(plan: Plan, name: str, tensors: tuple, scalars: tuple = ()) -> None:
    """Launch kernel ``name`` of ``plan``: its tensors, then the plan's integers, then ``scalars``."""
    launch, ints = plan[name]
    launch(*tensors, *ints, *scalars)


RowList = tuple[Tensor, Tensor]  # (cu [B + 1], idx [B L]) int32: see _mi_rows_kernel


def _row_list(plan: Plan, lengths: Tensor, rows: int) -> RowList:
    """The valid-row list of ``lengths`` (``rows = B L``), built on the device (no host sync):
    ``cu`` (first slot per sequence, then the count) and ``idx`` (flat row per slot, ``cu[B]`` of them)."""
    cu = torch.empty(lengths.shape[0] + 1, device=lengths.device, dtype=torch.int32)
    idx = torch.empty(rows, device=lengths.device, dtype=torch.int32)
    _run(plan, "rows", (lengths, cu, idx))
    return cu, idx


def multi_interest_forward(
    h: Tensor,
    lengths: Tensor,
    w1: Tensor,
    w2: Tensor,
    pos: Tensor | None,
    config: ForwardConfig | None = None,
    score_cap: float | None = None,
    key: tuple | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Launch the forward kernels on contiguous tensors; ``h``'s dtype is the compute dtype, the
    weights (one dtype) and ``pos`` may be stored wider (fp32), rounded on load.

    Args:
        h: ``[B, L, d]``; lengths ``[B]`` int; w1 ``[d, hidden]``; w2 ``[hidden, K]``;
            pos ``[>= L, d]`` or None.
        config: launch shapes; default :func:`forward_config`.
        score_cap: if > 0, the scores kernel stores ``cap · tanh(S / cap)``.
        key: the inputs' :func:`_key`, when the caller has it already.

    Returns:
        ``(out [B, K, d] in h's dtype, lse [B, K] fp32, scores [B, L, K] fp32)``: ``scores``
        are the (capped) logits of the softmax (0 at padded positions), ``lse`` their
        log-sum-exp over the valid positions (0 for empty sequences).
    """
    return _forward(h, lengths, w1, w2, pos, config, score_cap, key)[:3]


def _forward(
    h: Tensor,
    lengths: Tensor,
    w1: Tensor,
    w2: Tensor,
    pos: Tensor | None,
    config: ForwardConfig | None,
    score_cap: float | None,
    key: tuple | None,
) -> tuple[Tensor, Tensor, Tensor, RowList | None]:
    """:func:`multi_interest_forward`'s outputs and the valid-row list (None when ``B L = 0``; the
    backward's too: :func:`_backward_flat` takes it instead of building it again)."""
    b, seq_len, d = h.shape
    k = w2.shape[1]
    out = torch.empty((b, k, d), device=h.device, dtype=h.dtype)
    lse = torch.empty((b, k), device=h.device, dtype=torch.float32)
    scores = torch.empty((b, seq_len, k), device=h.device, dtype=torch.float32)
    if b * seq_len == 0:
        return out.zero_(), lse.zero_(), scores, None
    key = key or _key(h, lengths, w1, w2, pos, score_cap)
    plan = _plan(key, h, w1, w2, pos, score_cap, config, backward=False)
    cu, idx = row_list = _row_list(plan, lengths, b * seq_len)
    _run(plan, "scores", (h, pos if pos is not None else h, w1, w2, scores, cu, idx), (float(score_cap or 1.0),))
    _run(plan, "pool", (h, scores, lengths, out, lse))
    return out, lse, scores, row_list


def _backward_flat(
    h: Tensor,
    lengths: Tensor,
    w1: Tensor,
    w2: Tensor,
    pos: Tensor | None,
    out: Tensor,
    lse: Tensor,
    scores: Tensor,
    dout: Tensor,
    config: BackwardConfig | None = None,
    dscores: Tensor | None = None,
    score_cap: float | None = None,
    key: tuple | None = None,
    row_list: RowList | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Launch the backward kernels (the module docstring's scores, weights, dX, and dP with
    positions) and the one summing the partial sums.

    Args:
        h, lengths, w1, w2, pos: the forward's inputs (contiguous; dtypes as :func:`multi_interest_forward`).
        out, lse, scores: the forward's outputs ``[B, K, d]``, ``[B, K]`` and ``[B, L, K]``.
        dout: ``[B, K, d]`` gradient of ``out`` (copied when not contiguous and 16-byte aligned,
            as the launches are specialised for).
        config: launch shapes; default :func:`backward_config`.
        dscores: optional ``[B, L, K]`` gradient of the returned scores (a loss term on the
            attention), added to the softmax path's score gradient.
        score_cap: the forward's cap; the scores kernel of the backward applies its derivative
            ``1 - (S / cap)²`` (and :func:`_add_score_grad` to ``dscores``).
        key: the inputs' :func:`_key`, when the caller has it already.
        row_list: the forward's valid-row list (:func:`_forward`), or None to build it again.

    Returns:
        ``(dh [B, L, d], dw [d · hidden + hidden · K] (dW1 then dW2, flat), dpos [L_max, d] or None)``
        in the dtypes of ``h``, the weights and ``pos``: the weight gradients share one buffer,
        summed in one launch.
    """
    b, seq_len, d = h.shape
    hidden, k = w2.shape
    dh = torch.empty_like(h)
    n_weights = d * hidden + hidden * k
    if b * seq_len == 0:
        dpos = None if pos is None else torch.zeros_like(pos)
        return dh, torch.zeros(n_weights, device=h.device, dtype=w1.dtype), dpos
    if dout.data_ptr() % 16 or not dout.is_contiguous():
        dout = dout.clone(memory_format=torch.contiguous_format)
    plan = _plan(key or _key(h, lengths, w1, w2, pos, score_cap), h, w1, w2, pos, score_cap, config, backward=True)
    pos_arg = pos if pos is not None else h
    ds = torch.empty((b, seq_len, k), device=h.device, dtype=h.dtype)  # dLoss/dS; 0 on padding
    cu, idx = row_list or _row_list(plan, lengths, b * seq_len)
    _run(plan, "bwd_scores", (h, scores, lengths, out, dout, lse, dh, ds), (float(score_cap or 1.0),))
    if dscores is not None:
        ds = _add_score_grad(ds, scores, dscores, score_cap)
    dx = torch.empty_like(h) if pos is not None else dh  # score-path dH of the valid rows, for dP
    nprog_r, _, n_chunks, _ = plan["sum_parts"][1]
    dw_part = torch.empty((nprog_r, n_weights), device=h.device, dtype=torch.float32)  # per program: dW1, dW2
    # under CUDA-graph capture the weight kernel runs beside dX and dP on a second stream (GPU time
    # only counts there); launched call by call the stream switch costs more host time than it saves
    side = _side_stream(h.device.index) if h.is_cuda and torch.cuda.is_current_stream_capturing() else None
    if side is None:
        _run(plan, "bwd_weights", (h, pos_arg, ds, w1, w2, dw_part, cu, idx))
    else:  # launched first, so that its persistent programs take their place on every multiprocessor
        main = torch.cuda.current_stream(h.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            _run(plan, "bwd_weights", (h, pos_arg, ds, w1, w2, dw_part, cu, idx))
    _run(plan, "bwd_dx", (h, pos_arg, ds, w1, w2, dh, dx, cu, idx))
    dw = torch.empty(n_weights, device=h.device, dtype=w1.dtype)
    dpos, second_sum = None, (dw_part, dw)  # dP's partial sums and result, if any, summed in the same launch
    if pos is not None:
        dpos_part = torch.empty((n_chunks, *pos.shape), device=h.device, dtype=torch.float32)
        _run(plan, "dpos", (dx, lengths, dpos_part))
        dpos = torch.empty(pos.shape, device=h.device, dtype=pos.dtype)  # contiguous [L_max, d]; rows >= L get 0
        second_sum = (dpos_part, dpos)
    if side is not None:
        main.wait_stream(side)  # the join: what the weight kernel read or wrote is free after this point
    _run(plan, "sum_parts", (dw_part, dw, *second_sum))
    return dh, dw, dpos


@functools.cache
def _side_stream(device_index: int) -> torch.cuda.Stream:
    """A second stream per GPU: a backward captured in a CUDA graph runs the weight kernel on it
    while dX and dP run on the caller's stream (they read the same inputs and write different
    outputs). Joined before the sums, so the call's work ends on the caller's stream; the same
    launches as one stream, so a graph replay gives the bits of an eager call.

    In a graph this takes about 5% off the backward's GPU time at the bench shapes. Launched call
    by call, the events and stream switches would cost more host time than that saves, so eager
    calls use one stream.
    """
    return torch.cuda.Stream(device_index)


def _split_weights(dw: Tensor, w1: Tensor, w2: Tensor) -> tuple[Tensor, Tensor]:
    """``dw1 [d, hidden]`` and ``dw2 [hidden, K]``: contiguous views of the flat buffer of
    :func:`_backward_flat`. Two ``as_strided`` calls: a split and two reshapes cost the host about
    3x more per backward."""
    (d, hidden), k = w1.shape, w2.shape[1]
    dw1 = dw.as_strided((d, hidden), (hidden, 1))
    return dw1, dw.as_strided((hidden, k), (k, 1), dw.storage_offset() + d * hidden)


def multi_interest_backward(
    h: Tensor,
    lengths: Tensor,
    w1: Tensor,
    w2: Tensor,
    pos: Tensor | None,
    out: Tensor,
    lse: Tensor,
    scores: Tensor,
    dout: Tensor,
    config: BackwardConfig | None = None,
    dscores: Tensor | None = None,
    score_cap: float | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """:func:`_backward_flat` with the weight gradients split: ``(dh, dw1 [d, hidden], dw2 [hidden, K],
    dpos or None)`` (``dw1`` and ``dw2`` are views of one buffer)."""
    dh, dw, dpos = _backward_flat(h, lengths, w1, w2, pos, out, lse, scores, dout, config, dscores, score_cap)
    return (dh, *_split_weights(dw, w1, w2), dpos)


def _add_score_grad(ds: Tensor, scores: Tensor, dscores: Tensor, score_cap: float | None) -> Tensor:
    """``ds [B, L, K]`` (the kernel's gradient of the raw scores) plus ``dscores`` (the gradient of
    the returned, capped scores from a loss term) taken through the cap's derivative."""
    extra = dscores.float()
    if score_cap:
        extra = extra * (1.0 - (scores / score_cap).square())
    return (ds.float() + extra).to(ds.dtype)


# what the forward keeps for the backward: (h, lengths, w1, w2, pos or None, out, lse, scores)
Saved = tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor, Tensor, Tensor]


def _input_grads(
    saved: Saved,
    dout: Tensor | None,
    dscores: Tensor | None,
    score_cap: float | None,
    key: tuple | None = None,
    row_list: RowList | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(dh, dw flat, dpos)`` (as :func:`_backward_flat`) from the forward's saved ``(h, lengths,
    w1, w2, pos, out, lse, scores)`` (and its valid-row list, if kept) and the output
    gradients (either may be None: unused by the loss)."""
    h, lengths, w1, w2, pos, out, lse, scores = saved
    dout = torch.zeros_like(out) if dout is None else dout
    return _backward_flat(
        h,
        lengths,
        w1,
        w2,
        pos,
        out,
        lse,
        scores,
        dout,
        dscores=dscores,
        score_cap=score_cap,
        key=key,
        row_list=row_list,
    )


class _MultiInterest(torch.autograd.Function):
    """Eager autograd path: saves the inputs, the output, the scores ``[B, L, K]``, log-sum-exp and
    the valid-row list (so the backward does not build it again).

    Returns ``(out, scores)``; ``scores`` (the capped logits) is differentiable, so a loss term
    on the attention adds its gradient to the kernel's own score gradient. (The registered op
    below does the same for ``torch.compile``; it costs ~13 µs more per call in the dispatcher.)
    """

    @staticmethod
    def forward(
        ctx, h: Tensor, lengths: Tensor, w1: Tensor, w2: Tensor, pos: Tensor | None, score_cap: float | None
    ) -> tuple[Tensor, Tensor]:
        key = _key(h, lengths, w1, w2, pos, score_cap)
        out, lse, scores, row_list = _forward(h, lengths, w1, w2, pos, None, score_cap, key)
        ctx.save_for_backward(h, lengths, w1, w2, pos, out, lse, scores, *(row_list or (None, None)))
        ctx.score_cap, ctx.key = score_cap, key  # the backward's launches are found by the same key
        ctx.set_materialize_grads(False)
        return out, scores

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout: Tensor | None, dscores: Tensor | None):
        *saved, cu, idx = ctx.saved_tensors
        dh, dw, dpos = _input_grads(saved, dout, dscores, ctx.score_cap, ctx.key, None if cu is None else (cu, idx))
        dw1, dw2 = _split_weights(dw, saved[2], saved[3])
        need = ctx.needs_input_grad
        return (
            dh if need[0] else None,
            None,
            dw1 if need[2] else None,
            dw2 if need[3] else None,
            dpos if need[4] else None,
            None,
        )


# --------------------------------------------------------------------------------------------
# Registered operators (what torch.compile traces)
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("recsys::multi_interest", mutates_args=())
def multi_interest_op(
    h: Tensor, lengths: Tensor, w1: Tensor, w2: Tensor, pos: Tensor | None, score_cap: float
) -> tuple[Tensor, Tensor, Tensor]:
    """``(out [B, K, d], lse [B, K] fp32, scores [B, L, K] fp32)`` of :func:`multi_interest_forward`
    (contiguous inputs, dtypes as there; ``score_cap = 0`` for none). ``lse`` is saved for the backward."""
    return multi_interest_forward(h, lengths, w1, w2, pos, score_cap=score_cap or None)


@multi_interest_op.register_fake
def _(h, lengths, w1, w2, pos, score_cap):
    b, seq_len, d = h.shape
    k = w2.shape[1]
    f32 = torch.float32
    return h.new_empty((b, k, d)), h.new_empty((b, k), dtype=f32), h.new_empty((b, seq_len, k), dtype=f32)


@torch.library.custom_op("recsys::multi_interest_backward", mutates_args=())
def multi_interest_backward_op(
    h: Tensor,
    lengths: Tensor,
    w1: Tensor,
    w2: Tensor,
    pos: Tensor | None,
    out: Tensor,
    lse: Tensor,
    scores: Tensor,
    dout: Tensor | None,
    dscores: Tensor | None,
    score_cap: float,
) -> list[Tensor]:
    """``[dh, dw (dW1 then dW2, flat)]`` plus ``dpos`` when ``pos`` is given (an op returns no None)."""
    grads = _input_grads((h, lengths, w1, w2, pos, out, lse, scores), dout, dscores, score_cap or None)
    return [g for g in grads if g is not None]


@multi_interest_backward_op.register_fake
def _(h, lengths, w1, w2, pos, out, lse, scores, dout, dscores, score_cap):
    grads = [h.new_empty(h.shape), w1.new_empty(w1.numel() + w2.numel())]
    return grads if pos is None else [*grads, pos.new_empty(pos.shape)]


def _setup_context(ctx, inputs, output) -> None:
    h, lengths, w1, w2, pos, score_cap = inputs
    out, lse, scores = output
    ctx.save_for_backward(h, lengths, w1, w2, pos, out, lse, scores)
    ctx.score_cap = score_cap
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(lse)


def _op_backward(ctx, dout, _dlse, dscores):
    saved = ctx.saved_tensors
    grads = multi_interest_backward_op(*saved, dout, dscores, ctx.score_cap)
    dw1, dw2 = _split_weights(grads[1], saved[2], saved[3])
    return grads[0], None, dw1, dw2, grads[2] if len(grads) > 2 else None, None


multi_interest_op.register_autograd(_op_backward, setup_context=_setup_context)


SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def triton_supports(h: Tensor, w1: Tensor) -> bool:
    """Whether the kernel covers these inputs: fp16/bf16/fp32 (after autocast), ``d <= 128``."""
    dtype = torch.get_autocast_dtype("cuda") if h.is_cuda and torch.is_autocast_enabled("cuda") else h.dtype
    return dtype in SUPPORTED_DTYPES and h.shape[-1] <= 128


def triton_multi_interest(
    h: Tensor,
    lengths: Tensor,
    w1: Tensor,
    w2: Tensor,
    *,
    pos: Tensor | None = None,
    score_cap: float | None = None,
    return_scores: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Fused ComiRec-SA extraction, differentiable in ``h``, ``w1``, ``w2`` and ``pos``.

    Computes in ``h``'s dtype (the weights are rounded to it), or in the autocast dtype when
    CUDA autocast is on; products accumulate in fp32.

    Args:
        h: ``[B, L, d]`` item embeddings, right-padded (CUDA, or CPU under ``TRITON_INTERPRET=1``).
        lengths: ``[B]`` int valid lengths; clamped to ``[0, L]``.
        w1: ``[d, hidden]``.
        w2: ``[hidden, K]``.
        pos: optional ``[L_max >= L, d]``, added to ``h`` for the scores only.
        score_cap: if > 0, scores become ``cap · tanh(S / cap)`` before the softmax.
        return_scores: also return the (capped) scores ``[B, L, K]`` fp32, differentiable; 0 at
            padded positions.

    Returns:
        ``[B, K, d]`` interests; 0 (with zero gradients) for a sequence of length 0.
        With ``return_scores``: ``(interests, scores)``.
    """
    if not triton_supports(h, w1):
        raise ValueError(
            f"the Triton multi-interest kernel takes fp16/bf16/fp32 and d <= 128; got {h.dtype}, "
            f"d = {h.shape[-1]} (use backend='torch')"
        )
    dtype = h.dtype
    if h.is_cuda and torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
    h = (h if h.dtype == dtype else h.to(dtype)).contiguous()
    # the kernels read the (small) weights and positions in their own supported dtype and round them
    # to the compute dtype on load: no cast launches, and no cast nodes in the backward, under autocast
    if w1.dtype != w2.dtype or w1.dtype not in SUPPORTED_DTYPES:
        w1, w2 = w1.to(dtype), w2.to(dtype)
    w1, w2 = w1.contiguous(), w2.contiguous()
    if pos is not None:
        pos = (pos if pos.dtype in SUPPORTED_DTYPES else pos.to(dtype)).contiguous()
    if lengths.device != h.device or lengths.stride(0) != 1:
        lengths = lengths.to(h.device).contiguous()
    if torch.compiler.is_compiling():
        out, _, scores = multi_interest_op(h, lengths, w1, w2, pos, float(score_cap or 0.0))
    elif torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, w1, w2, pos)):
        out, scores = _MultiInterest.apply(h, lengths, w1, w2, pos, score_cap or None)
    else:  # inference (evaluation, serving): no autograd node, nothing saved for a backward
        out, _, scores, _ = _forward(h, lengths, w1, w2, pos, None, score_cap or None, None)
    return (out, scores) if return_scores else out
