"""Triton flash attention (FlashAttention-2 style) for short, padded recommendation sequences.

Forward: one program per (batch, head, query block) streams key/value tiles with an online
softmax (base-2 exponentials, fp32 accumulation) and saves the per-row log-sum-exp. Tiles wholly
past a sequence's key length, or wholly above the causal diagonal, are never loaded; only the
tiles that straddle a boundary pay for masking. Without soft-capping, the row maximum is taken on
the unscaled products, so each score costs one FMA before its ``exp2``.

Causal with key lengths (right-padded self-attention), query rows at or past a sequence's length
are padding: their output is 0 and they add nothing to any gradient. Query blocks wholly past the
length load no tile and write zeros (forward, dq), the dk/dv kernel's walk over query blocks stops
at the length, and a block straddling it masks its padded rows.

Backward recomputes the probabilities tile by tile from the saved log-sum-exp:

- ``Lq <= 64`` (click sequences of up to 64 items, learned interest queries): one program per
  (batch, head) holds every query row, walks the valid key tiles once and writes ``dk``/``dv``
  for each tile plus ``dq`` at the end (the "fused" kernel; no atomics);
- longer ``Lq``: a ``dq`` kernel over query blocks (which also stores ``delta = rowsum(dO * O)``)
  followed by a dk/dv kernel over key blocks; no atomics, so the gradients are deterministic.
  (Adding dq atomically from the dk/dv kernel instead saves the dq kernel's recomputation, but
  the atomic traffic makes it slower at every length from 128 to 1024 keys.)

With broadcast queries (``q`` batch 1) each batch row's ``dq`` goes to an fp32 buffer that is
summed over the batch afterwards, without atomics across the batch.

fp32 inputs use IEEE fp32 dot products (``input_precision="ieee"``; Triton's default for fp32
would be TF32); fp16/bf16 inputs use the tensor cores with fp32 accumulation.

On CUDA, block sizes are autotuned (``triton.autotune``) keyed on power-of-2 buckets of
``Lq``/``Lk``, the head dim and the masking flags. Under ``TRITON_INTERPRET=1`` (CPU tests), or
with ``RECSYS_ATTN_AUTOTUNE=0`` (quick GPU test runs that should not compile every candidate),
a fixed heuristic configuration per shape bucket is used instead.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator

import torch
import triton
import triton.language as tl
from torch import Tensor

from recsys.kernels.attention.checks import check_attention_args
from recsys.kernels.attention.reference import attention_ref
from recsys.kernels.common.launch import MAX_KEYS, Kernel, Launch, aligned

LOG2E = 1.4426950408889634
TAIL_M: tl.constexpr = tl.constexpr(16)  # rows of the tile for a last, partial query block (block sizes >= 16)
MAX_HEAD_DIM = 128
FUSED_MAX_LQ = 64  # query rows one fused backward program holds
DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_PATHS = {"fused_max_lq": FUSED_MAX_LQ}  # see backward_paths
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_AUTOTUNE = not _INTERPRET and os.environ.get("RECSYS_ATTN_AUTOTUNE", "1") != "0"


# --------------------------------------------------------------------------------------------
# Device helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def _load_tile(ptrs, rows_ok, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, ROW_MASK: tl.constexpr):
    """Load a ``[rows, BLOCK_D]`` tile; masked rows and padded head-dim columns read 0."""
    if BLOCK_D == HEAD_DIM:
        if ROW_MASK:
            x = tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
        else:
            x = tl.load(ptrs)
    else:
        if ROW_MASK:
            x = tl.load(ptrs, mask=rows_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
        else:
            x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return x


@triton.jit
def _store_tile(ptrs, x, rows_ok, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store a ``[rows, BLOCK_D]`` tile, skipping masked rows and padded head-dim columns."""
    if BLOCK_D == HEAD_DIM:
        tl.store(ptrs, x, mask=rows_ok[:, None])
    else:
        tl.store(ptrs, x, mask=rows_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _logits(qk, qk_scale, tanh_scale, cap_log2, SOFTCAP: tl.constexpr):
    """Scaled (and soft-capped) logits in log2 units, and ``tanh`` for the soft-cap gradient.

    ``qk`` is the raw dot product. Without soft-capping the logit is ``qk * scale * log2(e)``;
    with it, ``cap * tanh(qk * scale / cap) * log2(e)``, ``tanh(x) = 1 - 2 / (exp(2x) + 1)``
    written with ``exp2`` (libdevice's tanh is missing in the interpreter). Saturates cleanly:
    ``exp2 -> inf`` gives ``tanh = 1``, ``exp2 -> 0`` gives ``-1``.
    """
    if SOFTCAP:
        t = 1.0 - 2.0 / (tl.exp2(qk * tanh_scale) + 1.0)
        s = t * cap_log2
    else:
        s = qk * qk_scale
        t = s
    return s, t


@triton.jit
def _key_tile(
    q,
    k_base,
    v_base,
    skn,
    skd,
    svn,
    svd,
    offs_m,
    offs_n,
    kv_len,
    offs_d,
    qk_scale,
    tanh_scale,
    cap_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DOT_PREC: tl.constexpr,
    RAW: tl.constexpr,
):
    """Load the key tile ``offs_n`` of K and V and its logits against ``q`` (log2 units).

    With ``MASK`` (a tile straddling the length or the diagonal), keys past ``kv_len`` and, if
    ``CAUSAL``, above the diagonal get ``-inf``. Returns ``k, v, s, t`` (``t`` as :func:`_logits`).
    ``RAW`` (no soft-cap): ``s`` is the unscaled dot product (masked alike), for a caller that
    folds ``qk_scale`` into its exponent's FMA.
    """
    n_ok = offs_n < kv_len
    k = _load_tile(k_base + offs_n[:, None] * skn + offs_d[None, :] * skd, n_ok, offs_d, HEAD_DIM, BLOCK_D, MASK)
    v = _load_tile(v_base + offs_n[:, None] * svn + offs_d[None, :] * svd, n_ok, offs_d, HEAD_DIM, BLOCK_D, MASK)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
    if RAW:
        s = qk
        t = qk
    else:
        s, t = _logits(qk, qk_scale, tanh_scale, cap_log2, SOFTCAP)
    if MASK:
        visible = n_ok[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None])
        s = tl.where(visible, s, float("-inf"))
    return k, v, s, t


@triton.jit
def _key_bounds(
    kv_len,
    LQ,
    start_m,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_LENS: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """The key tiles of query rows ``[start_m, start_m + BLOCK_M)``, and the rows that are not padding.

    Returns ``full, hi, q_len``: keys below ``full`` (a multiple of ``BLOCK_N``) are visible to
    every row of the block, tiles in ``[full, hi)`` straddle the length or the diagonal, and rows
    at or past ``q_len`` are padding (``LQ``, or causal with lengths ``min(LQ, kv_len)``). A block
    wholly past ``q_len`` gets ``full = hi = 0``: it loads no key tile.
    """
    hi = kv_len
    full = kv_len
    q_len = LQ
    if CAUSAL:
        if HAS_LENS:
            q_len = tl.minimum(kv_len, LQ)
            hi = tl.where(start_m < q_len, tl.minimum(hi, start_m + BLOCK_M), 0)
            full = tl.minimum(tl.minimum(full, start_m), hi)
        else:
            hi = tl.minimum(hi, start_m + BLOCK_M)
            full = tl.minimum(full, start_m)
    full = (full // BLOCK_N) * BLOCK_N
    return full, hi, q_len


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


@triton.jit
def _fwd_tiles(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    skn,
    skd,
    svn,
    svd,
    lo,
    hi,
    kv_len,
    offs_m,
    offs_n0,
    offs_d,
    qk_scale,
    tanh_scale,
    cap_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DOT_PREC: tl.constexpr,
    RAW: tl.constexpr,
):
    """Online-softmax update over key tiles ``[lo, hi)``; ``MASK`` for tiles straddling a bound.

    ``RAW`` (no soft-cap, ``qk_scale > 0``): the row maximum is taken on the unscaled products and
    scaled once per row, so each score costs one FMA (``qk * qk_scale - m``) before its ``exp2``
    instead of a multiply and a subtraction (the loop is issue-bound at D = 64 on Hopper).
    """
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        _k, v, s, _ = _key_tile(
            q,
            k_base,
            v_base,
            skn,
            skd,
            svn,
            svd,
            offs_m,
            offs_n,
            kv_len,
            offs_d,
            qk_scale,
            tanh_scale,
            cap_log2,
            HEAD_DIM,
            BLOCK_D,
            MASK,
            CAUSAL,
            SOFTCAP,
            DOT_PREC,
            RAW,
        )
        if RAW:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            p = tl.exp2(s * qk_scale - m_new[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    LENS,
    sqb,
    sqh,
    sqm,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    sob,
    soh,
    som,
    H,
    LQ,
    LK,
    lq_bucket,
    lk_bucket,
    qk_scale,
    tanh_scale,
    cap_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_LENS: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DOT_PREC: tl.constexpr,
    RAW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """O[b, h, m-block] and its log2-sum-exp (``+inf`` for rows that see no key, as causal rows
    past the length: their ``O`` is 0 and the backward's probabilities are 0).

    Grid: ``cdiv(LQ, BLOCK_M) * B * H`` programs, query blocks fastest (they share K/V in L2).
    ``O`` is ``[B, H, LQ, HEAD_DIM]`` with strides ``sob, soh, som, 1``; ``LSE`` contiguous
    ``[B, H, LQ]`` fp32. A last query block of at most ``TAIL_M`` rows is computed as a
    ``TAIL_M``-row tile (Lq = 200 in 64-row blocks: the fourth block on 16 rows, not 64).
    """
    num_m = tl.cdiv(LQ, BLOCK_M)
    pid = tl.program_id(0)
    pid_m = pid % num_m
    bh = pid // num_m
    start_m = pid_m * BLOCK_M
    if LQ - start_m <= TAIL_M:  # the last block, partial: a TAIL_M-row tile (BLOCK_M >= TAIL_M)
        _fwd_rows(
            Q,
            K,
            V,
            O,
            LSE,
            LENS,
            sqb,
            sqh,
            sqm,
            sqd,
            skb,
            skh,
            skn,
            skd,
            svb,
            svh,
            svn,
            svd,
            sob,
            soh,
            som,
            H,
            LQ,
            LK,
            qk_scale,
            tanh_scale,
            cap_log2,
            bh,
            start_m,
            HEAD_DIM,
            BLOCK_D,
            HAS_LENS,
            CAUSAL,
            SOFTCAP,
            DOT_PREC,
            RAW,
            TAIL_M,
            BLOCK_N,
        )
    else:
        _fwd_rows(
            Q,
            K,
            V,
            O,
            LSE,
            LENS,
            sqb,
            sqh,
            sqm,
            sqd,
            skb,
            skh,
            skn,
            skd,
            svb,
            svh,
            svn,
            svd,
            sob,
            soh,
            som,
            H,
            LQ,
            LK,
            qk_scale,
            tanh_scale,
            cap_log2,
            bh,
            start_m,
            HEAD_DIM,
            BLOCK_D,
            HAS_LENS,
            CAUSAL,
            SOFTCAP,
            DOT_PREC,
            RAW,
            BLOCK_M,
            BLOCK_N,
        )


@triton.jit
def _fwd_rows(
    Q,
    K,
    V,
    O,
    LSE,
    LENS,
    sqb,
    sqh,
    sqm,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    sob,
    soh,
    som,
    H,
    LQ,
    LK,
    qk_scale,
    tanh_scale,
    cap_log2,
    bh,
    start_m,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_LENS: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DOT_PREC: tl.constexpr,
    RAW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The forward of query rows ``[start_m, start_m + BLOCK_M)`` of (batch, head) ``bh``; rows
    that are padding (see :func:`_key_bounds`) are not read and write 0."""
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < LQ
    kv_len = LK
    if HAS_LENS:
        kv_len = tl.minimum(tl.maximum(tl.load(LENS + b).to(tl.int32), 0), LK)
    full, hi, q_len = _key_bounds(kv_len, LQ, start_m, BLOCK_M, BLOCK_N, HAS_LENS, CAUSAL)
    rows_ok = offs_m < q_len
    q = _load_tile(
        Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd, rows_ok, offs_d, HEAD_DIM, BLOCK_D, True
    )

    k_base = K + b * skb + h * skh
    v_base = V + b * svb + h * svh
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: a fully masked tile gives p = 0, not NaN
    acc, l_i, m_i = _fwd_tiles(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        skn,
        skd,
        svn,
        svd,
        0,
        full,
        kv_len,
        offs_m,
        offs_n0,
        offs_d,
        qk_scale,
        tanh_scale,
        cap_log2,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_N,
        False,
        CAUSAL,
        SOFTCAP,
        DOT_PREC,
        RAW,
    )
    acc, l_i, m_i = _fwd_tiles(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        skn,
        skd,
        svn,
        svd,
        full,
        hi,
        kv_len,
        offs_m,
        offs_n0,
        offs_d,
        qk_scale,
        tanh_scale,
        cap_log2,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_N,
        True,
        CAUSAL,
        SOFTCAP,
        DOT_PREC,
        RAW,
    )

    seen = l_i > 0.0
    if CAUSAL and HAS_LENS:  # a block straddling the length: its padded rows saw keys, they give 0
        seen = seen & rows_ok
        acc = tl.where(rows_ok[:, None], acc, 0.0)
    l_safe = tl.where(seen, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse = tl.where(seen, m_i + tl.log2(l_safe), float("inf"))
    _store_tile(
        O + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :],
        o.to(O.dtype.element_ty),
        m_ok,
        offs_d,
        HEAD_DIM,
        BLOCK_D,
    )
    tl.store(LSE + bh.to(tl.int64) * LQ + offs_m, lse, mask=m_ok)


# --------------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------------


@triton.jit
def _dq_tiles(
    dq,
    q,
    do,
    lse,
    delta,
    k_base,
    v_base,
    skn,
    skd,
    svn,
    svd,
    dk_base,
    dv_base,
    lo,
    hi,
    kv_len,
    LK,
    offs_m,
    offs_n0,
    offs_d,
    qk_scale,
    tanh_scale,
    cap_log2,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    FUSED: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """Accumulate ``dq`` over key tiles ``[lo, hi)``; with ``FUSED`` also store each tile's dk, dv.

    ``dq`` accumulates ``dS @ K`` without the logit scale (applied once by the caller).
    """
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        k, v, s, t = _key_tile(
            q,
            k_base,
            v_base,
            skn,
            skd,
            svn,
            svd,
            offs_m,
            offs_n,
            kv_len,
            offs_d,
            qk_scale,
            tanh_scale,
            cap_log2,
            HEAD_DIM,
            BLOCK_D,
            MASK,
            CAUSAL,
            SOFTCAP,
            DOT_PREC,
            False,
        )
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
        if FUSED:
            dv = tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=DOT_PREC)
            dk = tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=DOT_PREC) * sm_scale
            off = offs_n[:, None] * HEAD_DIM + offs_d[None, :]
            _store_tile(dk_base + off, dk.to(dk_base.dtype.element_ty), offs_n < LK, offs_d, HEAD_DIM, BLOCK_D)
            _store_tile(dv_base + off, dv.to(dv_base.dtype.element_ty), offs_n < LK, offs_d, HEAD_DIM, BLOCK_D)
    return dq


@triton.jit
def _bwd_dq_kernel(
    Q,
    K,
    V,
    O,
    DO,
    LSE,
    DELTA,
    DQ,
    DK,
    DV,
    LENS,
    sqb,
    sqh,
    sqm,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    sob,
    soh,
    som,
    H,
    LQ,
    LK,
    lq_bucket,
    lk_bucket,
    qk_scale,
    tanh_scale,
    cap_log2,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_LENS: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    FUSED: tl.constexpr,
    DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dq for one (batch, head, query block); ``delta = rowsum(dO * O)`` is computed here.

    ``FUSED`` (``BLOCK_M >= LQ``, one program per (batch, head)): the program sees every query
    row, so it also writes complete ``dk``/``dv`` tiles (zeros past the key length) and keeps
    ``delta`` to itself. Otherwise ``delta`` is stored for the dk/dv kernel.
    ``O`` and ``DO`` are ``[B, H, LQ, HEAD_DIM]`` with ``O``'s strides; ``DQ`` contiguous (per kv-batch
    row, fp32, when queries are broadcast); ``DK``, ``DV`` contiguous ``[B, H, LK, HEAD_DIM]``.
    Without ``FUSED``, a last query block of at most ``TAIL_M`` rows is a ``TAIL_M``-row tile.
    Causal with lengths, a block wholly past the length reads nothing and writes zero ``dq``
    (and ``delta``); the padded rows of a straddling block are not read either (``lse = +inf``).
    """
    num_m = tl.cdiv(LQ, BLOCK_M)
    pid = tl.program_id(0)
    pid_m = pid % num_m
    bh = pid // num_m
    start_m = pid_m * BLOCK_M
    if not FUSED and LQ - start_m <= TAIL_M:  # the last block, partial (BLOCK_M >= TAIL_M)
        _dq_rows(
            Q,
            K,
            V,
            O,
            DO,
            LSE,
            DELTA,
            DQ,
            DK,
            DV,
            LENS,
            sqb,
            sqh,
            sqm,
            sqd,
            skb,
            skh,
            skn,
            skd,
            svb,
            svh,
            svn,
            svd,
            sob,
            soh,
            som,
            H,
            LQ,
            LK,
            qk_scale,
            tanh_scale,
            cap_log2,
            sm_scale,
            bh,
            start_m,
            HEAD_DIM,
            BLOCK_D,
            HAS_LENS,
            CAUSAL,
            SOFTCAP,
            FUSED,
            DOT_PREC,
            TAIL_M,
            BLOCK_N,
        )
    else:
        _dq_rows(
            Q,
            K,
            V,
            O,
            DO,
            LSE,
            DELTA,
            DQ,
            DK,
            DV,
            LENS,
            sqb,
            sqh,
            sqm,
            sqd,
            skb,
            skh,
            skn,
            skd,
            svb,
            svh,
            svn,
            svd,
            sob,
            soh,
            som,
            H,
            LQ,
            LK,
            qk_scale,
            tanh_scale,
            cap_log2,
            sm_scale,
            bh,
            start_m,
            HEAD_DIM,
            BLOCK_D,
            HAS_LENS,
            CAUSAL,
            SOFTCAP,
            FUSED,
            DOT_PREC,
            BLOCK_M,
            BLOCK_N,
        )


@triton.jit
def _dq_rows(
    Q,
    K,
    V,
    O,
    DO,
    LSE,
    DELTA,
    DQ,
    DK,
    DV,
    LENS,
    sqb,
    sqh,
    sqm,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    sob,
    soh,
    som,
    H,
    LQ,
    LK,
    qk_scale,
    tanh_scale,
    cap_log2,
    sm_scale,
    bh,
    start_m,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_LENS: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    FUSED: tl.constexpr,
    DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The dq kernel's work on query rows ``[start_m, start_m + BLOCK_M)`` of (batch, head) ``bh``;
    rows that are padding (see :func:`_key_bounds`) are not read and get zero ``dq``."""
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    bh64 = bh.to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < LQ
    kv_len = LK
    if HAS_LENS:
        kv_len = tl.minimum(tl.maximum(tl.load(LENS + b).to(tl.int32), 0), LK)
    full, hi, q_len = _key_bounds(kv_len, LQ, start_m, BLOCK_M, BLOCK_N, HAS_LENS, CAUSAL)
    rows_ok = offs_m < q_len
    row_off = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = _load_tile(
        Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd, rows_ok, offs_d, HEAD_DIM, BLOCK_D, True
    )
    o_off = b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :]  # O and DO share O's strides
    do = _load_tile(DO + o_off, rows_ok, offs_d, HEAD_DIM, BLOCK_D, True)
    o = _load_tile(O + o_off, rows_ok, offs_d, HEAD_DIM, BLOCK_D, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if not FUSED:
        tl.store(DELTA + bh64 * LQ + offs_m, delta, mask=m_ok)
    lse = tl.load(LSE + bh64 * LQ + offs_m, mask=rows_ok, other=float("inf"))

    k_base = K + b * skb + h * skh
    v_base = V + b * svb + h * svh
    dk_base = DK + bh64 * LK * HEAD_DIM
    dv_base = DV + bh64 * LK * HEAD_DIM
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq = _dq_tiles(
        dq,
        q,
        do,
        lse,
        delta,
        k_base,
        v_base,
        skn,
        skd,
        svn,
        svd,
        dk_base,
        dv_base,
        0,
        full,
        kv_len,
        LK,
        offs_m,
        offs_n0,
        offs_d,
        qk_scale,
        tanh_scale,
        cap_log2,
        sm_scale,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_N,
        False,
        CAUSAL,
        SOFTCAP,
        FUSED,
        DOT_PREC,
    )
    dq = _dq_tiles(
        dq,
        q,
        do,
        lse,
        delta,
        k_base,
        v_base,
        skn,
        skd,
        svn,
        svd,
        dk_base,
        dv_base,
        full,
        hi,
        kv_len,
        LK,
        offs_m,
        offs_n0,
        offs_d,
        qk_scale,
        tanh_scale,
        cap_log2,
        sm_scale,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_N,
        True,
        CAUSAL,
        SOFTCAP,
        FUSED,
        DOT_PREC,
    )
    if FUSED:  # key tiles that were skipped get zero gradients
        zero = tl.zeros([BLOCK_N, BLOCK_D], dtype=DK.dtype.element_ty)
        for start_n in range(tl.cdiv(hi, BLOCK_N) * BLOCK_N, LK, BLOCK_N):
            offs_n = start_n + offs_n0
            off = offs_n[:, None] * HEAD_DIM + offs_d[None, :]
            _store_tile(dk_base + off, zero, offs_n < LK, offs_d, HEAD_DIM, BLOCK_D)
            _store_tile(dv_base + off, zero, offs_n < LK, offs_d, HEAD_DIM, BLOCK_D)
    _store_tile(
        DQ + bh64 * LQ * HEAD_DIM + row_off, (dq * sm_scale).to(DQ.dtype.element_ty), m_ok, offs_d, HEAD_DIM, BLOCK_D
    )


@triton.jit
def _dkdv_tiles(
    dk,
    dv,
    k,
    v,
    q_base,
    sqm,
    sqd,
    do_base,
    som,
    lse_base,
    delta_base,
    lo,
    hi,
    q_len,
    offs_n,
    offs_m0,
    offs_d,
    qk_scale,
    tanh_scale,
    cap_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    MASK: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """Accumulate one key tile's ``dk`` (unscaled) and ``dv`` over query blocks ``[lo, hi)``.

    Works on transposed scores ``[BLOCK_N, BLOCK_M]``; ``MASK`` applies the causal mask.
    Query rows past ``q_len`` (``LQ``, or the padded rows: see :func:`_key_bounds`) are not read:
    they get ``lse = +inf``, so their probabilities are 0.
    """
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        m_ok = offs_m < q_len
        q = _load_tile(q_base + offs_m[:, None] * sqm + offs_d[None, :] * sqd, m_ok, offs_d, HEAD_DIM, BLOCK_D, True)
        do = _load_tile(do_base + offs_m[:, None] * som + offs_d[None, :], m_ok, offs_d, HEAD_DIM, BLOCK_D, True)
        lse = tl.load(lse_base + offs_m, mask=m_ok, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=m_ok, other=0.0)
        s, t = _logits(tl.dot(k, tl.trans(q), input_precision=DOT_PREC), qk_scale, tanh_scale, cap_log2, SOFTCAP)
        if MASK:
            s = tl.where(offs_m[None, :] >= offs_n[:, None], s, float("-inf"))
        p = tl.exp2(s - lse[None, :])
        dv = tl.dot(p.to(do.dtype), do, dv, input_precision=DOT_PREC)
        dp = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        ds = p * (dp - delta[None, :])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dk = tl.dot(ds.to(q.dtype), q, dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    LENS,
    sqb,
    sqh,
    sqm,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    sob,
    soh,
    som,
    H,
    LQ,
    LK,
    lq_bucket,
    lk_bucket,
    qk_scale,
    tanh_scale,
    cap_log2,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_LENS: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dk, dv for one (batch, head, key block); key blocks past the key length write zeros only.

    Grid: ``cdiv(LK, BLOCK_N) * B * H``. Causal: query blocks before the key block are skipped and
    only the blocks crossing the diagonal are masked; with lengths the walk stops at the length (the
    padded query rows add nothing). ``DELTA`` is the dq kernel's ``rowsum(dO * O)``.
    """
    num_n = tl.cdiv(LK, BLOCK_N)
    pid = tl.program_id(0)
    pid_n = pid % num_n
    bh = pid // num_n
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    bh64 = bh.to(tl.int64)

    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    kv_len = LK
    if HAS_LENS:
        kv_len = tl.minimum(tl.maximum(tl.load(LENS + b).to(tl.int32), 0), LK)
    n_ok = offs_n < kv_len
    k = _load_tile(
        K + b * skb + h * skh + offs_n[:, None] * skn + offs_d[None, :] * skd, n_ok, offs_d, HEAD_DIM, BLOCK_D, True
    )
    v = _load_tile(
        V + b * svb + h * svh + offs_n[:, None] * svn + offs_d[None, :] * svd, n_ok, offs_d, HEAD_DIM, BLOCK_D, True
    )

    q_len = LQ
    if CAUSAL and HAS_LENS:  # query rows past the length are padding
        q_len = tl.minimum(kv_len, LQ)
    lo = 0
    if CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
    hi = tl.where(start_n < kv_len, q_len, lo)  # a key block wholly past the length does no work
    mid = lo
    if CAUSAL:
        mid = tl.minimum(hi, tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M)

    q_base = Q + b * sqb + h * sqh
    do_base = DO + b * sob + h * soh
    lse_base = LSE + bh64 * LQ
    delta_base = DELTA + bh64 * LQ
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dk, dv = _dkdv_tiles(
        dk,
        dv,
        k,
        v,
        q_base,
        sqm,
        sqd,
        do_base,
        som,
        lse_base,
        delta_base,
        lo,
        mid,
        q_len,
        offs_n,
        offs_m0,
        offs_d,
        qk_scale,
        tanh_scale,
        cap_log2,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_M,
        True,
        SOFTCAP,
        DOT_PREC,
    )
    dk, dv = _dkdv_tiles(
        dk,
        dv,
        k,
        v,
        q_base,
        sqm,
        sqd,
        do_base,
        som,
        lse_base,
        delta_base,
        mid,
        hi,
        q_len,
        offs_n,
        offs_m0,
        offs_d,
        qk_scale,
        tanh_scale,
        cap_log2,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_M,
        False,
        SOFTCAP,
        DOT_PREC,
    )
    # keys past the length were read as 0 and summed nonzero probabilities: their gradients are 0
    dk = tl.where(n_ok[:, None], dk * sm_scale, 0.0)
    dv = tl.where(n_ok[:, None], dv, 0.0)
    off = bh64 * LK * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    _store_tile(DK + off, dk.to(DK.dtype.element_ty), offs_n < LK, offs_d, HEAD_DIM, BLOCK_D)
    _store_tile(DV + off, dv.to(DV.dtype.element_ty), offs_n < LK, offs_d, HEAD_DIM, BLOCK_D)


# --------------------------------------------------------------------------------------------
# Launch configuration
# --------------------------------------------------------------------------------------------


def _bucket(n: int) -> int:
    """Power-of-2 bucket (at least 16, the smallest dot size) used for block caps and tuning keys."""
    return max(16, triton.next_power_of_2(max(n, 1)))


def _cfg(block_n: int, warps: int, stages: int, block_m: int | None = None, regs: int | None = None) -> triton.Config:
    """An autotune candidate; ``regs`` caps registers per thread (ptxas ``maxnreg``) so that more
    programs fit on a multiprocessor (65,536 registers: 256 threads x 128 fit twice)."""
    kwargs = {"BLOCK_N": block_n} if block_m is None else {"BLOCK_M": block_m, "BLOCK_N": block_n}
    return triton.Config(kwargs, num_warps=warps, num_stages=stages, maxnreg=regs)


# candidates: (BLOCK_M, BLOCK_N, num_warps, num_stages); pruned per shape by `_prune`. Register
# counts for D = 64, bf16, sm_90 (Triton 3.9's ptxas) are noted where they decide the choice: 65536
# registers per SM, so 128 threads x 255 fit twice and 256 threads x 128 twice.
_FWD_CONFIGS = [
    _cfg(n, w, s, m)
    for m, n, w, s in [
        (16, 16, 4, 2),
        (32, 16, 4, 2),
        (64, 16, 4, 2),
        (64, 32, 4, 2),
        (64, 64, 4, 3),
        (128, 32, 4, 3),
        (128, 64, 4, 3),
        (128, 64, 8, 3),
        (128, 128, 8, 3),
        (128, 64, 8, 2),
        (128, 64, 8, 4),  # 128 registers: two programs per SM
        (128, 128, 8, 2),  # 199 registers, half the per-tile loop overhead and rescaling per score
        (64, 32, 4, 3),
        (128, 32, 8, 2),
    ]
]
_DQ_CONFIGS = [
    _cfg(n, w, s, m)
    for m, n, w, s in [
        (64, 32, 4, 2),
        (64, 64, 4, 3),
        (128, 32, 4, 3),
        (128, 64, 4, 3),
        (128, 64, 8, 3),
        (128, 128, 8, 3),
        (128, 64, 8, 2),
        (128, 64, 8, 4),
        (64, 32, 4, 3),
        (64, 16, 4, 2),
        (128, 32, 8, 2),
    ]
] + [
    # 132 registers on 8 warps fit one program per SM (sm_90, 256 x 1024); capped, two, no spill
    _cfg(64, 8, 3, 128, regs=128),
    _cfg(64, 8, 2, 128, regs=128),
]
_FUSED_CONFIGS = [_cfg(n, w, s) for n, w, s in [(16, 4, 2), (32, 4, 2), (64, 4, 2), (16, 2, 2), (32, 8, 2)]]
_DKDV_CONFIGS = [
    _cfg(n, w, s, m)
    for m, n, w, s in [
        (32, 32, 4, 2),
        (32, 64, 4, 3),
        (64, 64, 4, 3),
        (32, 128, 4, 3),
        (64, 128, 4, 3),
        (64, 128, 8, 3),
        # (32, 128, 4, 3), the tuner's pick on sm_90 at L >= 1024, spills (255 registers + 56 bytes of stack);
        # these do not: 254 registers at 2 stages, 160 / 138 with 8 warps
        (32, 128, 4, 2),
        (32, 128, 8, 3),
        (32, 128, 8, 2),
        (64, 128, 8, 2),
        (32, 32, 4, 3),
        (64, 32, 4, 2),
        (64, 64, 4, 2),
    ]
] + [
    # capped at 128 registers: two 8-warp programs per SM instead of one (160 registers), four 4-warp
    # ones instead of three (159); ptxas spills 24-80 bytes for it, the tuner weighs that
    _cfg(n, w, s, m, regs=128)
    for m, n, w, s in [(32, 128, 8, 2), (32, 128, 8, 3), (32, 64, 4, 2), (32, 64, 4, 3)]
]


def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Drop candidates whose blocks exceed the (bucketed) sequence lengths."""
    qb, kb = named_args["lq_bucket"], named_args["lk_bucket"]
    keep = [c for c in configs if c.kwargs.get("BLOCK_M", 16) <= qb and c.kwargs["BLOCK_N"] <= kb]
    return keep or configs[:1]


def _heuristic(kind: str, lq: int, lk: int) -> tuple[dict, int, int]:
    """Fixed (meta-parameters, num_warps, num_stages) when not autotuning: the tuner's picks on sm_90."""
    qb, kb = _bucket(lq), _bucket(lk)
    if kind == "fused":
        return {"BLOCK_N": 16}, 4, 2
    if kind.startswith("dkdv"):
        return {"BLOCK_M": 32, "BLOCK_N": 64 if kb <= 256 else 128}, 4, 3
    if kb <= 256:
        return {"BLOCK_M": min(qb, 64), "BLOCK_N": 32}, 4, 2
    return {"BLOCK_M": min(qb, 128), "BLOCK_N": 64}, 8, 3


def _autotuned(kernel, configs: list[triton.Config]):
    return triton.autotune(
        configs=configs,
        key=["lq_bucket", "lk_bucket", "HEAD_DIM", "HAS_LENS", "CAUSAL", "SOFTCAP"],
        prune_configs_by={"early_config_prune": _prune},
    )(kernel)


_CANDIDATES = {
    "fwd": (_fwd_kernel, _FWD_CONFIGS),
    "dq": (_bwd_dq_kernel, _DQ_CONFIGS),
    "fused": (_bwd_dq_kernel, _FUSED_CONFIGS),
    "dkdv": (_bwd_dkdv_kernel, _DKDV_CONFIGS),
}
_KERNELS = {
    kind: Kernel(kernel, _autotuned(kernel, configs) if _AUTOTUNE else None)
    for kind, (kernel, configs) in _CANDIDATES.items()
}


def best_configs() -> dict[str, str]:
    """The autotuner's pick per kernel for the last shape it tuned (empty when not autotuning)."""
    return {kind: str(cfg) for kind, kernel in _KERNELS.items() if (cfg := kernel.chosen()) is not None}


@contextlib.contextmanager
def backward_paths(*, fused_max_lq: int | None = None) -> Iterator[None]:
    """Within the block, take the fused backward for ``Lq <= fused_max_lq`` instead of the default
    ``FUSED_MAX_LQ`` (0 = never; for benchmarks and tests comparing the paths), the split dq and
    dk/dv kernels above it. The forward call fixes the path of its backward."""
    saved = dict(_PATHS)
    if fused_max_lq is not None:
        _PATHS["fused_max_lq"] = int(fused_max_lq)
    try:
        yield
    finally:
        _PATHS.update(saved)


# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------


class _Problem:
    """Shapes, strides, constants and the kernel launches of one forward and its backward.

    Built once per :func:`_problem` key (shapes, strides, dtypes, flags, input alignment); ``key``
    is that key. ``forward`` is the forward's launch, ``backward`` the backward path's launches
    (fixed here, by the thresholds of :func:`backward_paths` in force).
    """

    def __init__(
        self,
        key: tuple,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        lens: Tensor | None,
        causal: bool,
        scale: float | None,
        softcap: float | None,
    ) -> None:
        self.key = key
        self.batch, self.heads, self.lk, self.head_dim = k.shape
        self.lq = q.shape[2]
        self.broadcast = q.shape[0] != self.batch
        self.fused = self.lq <= _PATHS["fused_max_lq"]
        scale = 1.0 / math.sqrt(self.head_dim) if scale is None else float(scale)
        self.scale = scale
        cap = float(softcap) if softcap else 0.0
        self.consts = (
            scale * LOG2E,  # qk_scale
            2.0 * scale * LOG2E / cap if cap else 0.0,  # tanh_scale
            cap * LOG2E,  # cap_log2
        )
        q_strides = list(q.stride())
        if self.broadcast:
            q_strides[0] = 0
        # o (and the dO the backward reads) in q's layout: [B, Lq, H, D] memory when q's heads lie
        # inside its positions (a fused qkv projection's view), so that o.transpose(1, 2) is
        # contiguous for the output projection and its gradient comes back in o's strides
        self.heads_inner = _heads_inner(q)
        h, lq, d = self.heads, self.lq, self.head_dim
        self.o_strides = (lq * h * d, d, h * d) if self.heads_inner else (h * lq * d, lq * d, d)  # b, h, m
        strides = (*q_strides, *k.stride(), *v.stride(), *self.o_strides)
        sizes = (self.heads, self.lq, self.lk, _bucket(self.lq), _bucket(self.lk))
        self.fwd_ints = (*strides, *sizes, *self.consts)  # the forward's arguments after its tensors
        self.bwd_ints = (*self.fwd_ints, scale)  # the backward kernels' arguments after their tensors
        self.out_shape = (self.batch, self.heads, self.lq, self.head_dim)  # o, do and (per kv-batch row) dq
        self.kv_shape = (self.batch, self.heads, self.lk, self.head_dim)  # dk, dv
        self.dq_dtype = torch.float32 if self.broadcast else q.dtype  # broadcast: per-batch dq, summed after
        self.forward, self.backward = self._launches(q, lens, causal, cap)

    def _launches(self, q: Tensor, lens: Tensor | None, causal: bool, cap: float) -> tuple[Launch, tuple[Launch, ...]]:
        """The forward's launch and the backward path's: the fused kernel, or the dq kernel and the
        dk/dv kernel."""
        common = {
            "HEAD_DIM": self.head_dim,
            "BLOCK_D": _bucket(self.head_dim),
            "HAS_LENS": lens is not None,
            "CAUSAL": bool(causal),
            "SOFTCAP": bool(cap),
            "DOT_PREC": "ieee" if q.dtype == torch.float32 else "tf32",
        }
        kinds = ["fwd", *(["fused"] if self.fused else ["dq", "dkdv"])]
        meta = {kind: dict(common) for kind in kinds}
        for kind in ("fused", "dq"):
            if kind in meta:
                meta[kind]["FUSED"] = kind == "fused"
        if not _AUTOTUNE:  # the heuristic config instead of the tuner's pick
            for kind, kind_meta in meta.items():
                cfg, warps, stages = _heuristic(kind, self.lq, self.lk)
                kind_meta.update(cfg, num_warps=warps, num_stages=stages)
        bh = self.batch * self.heads
        lq, lk = self.lq, self.lk

        def q_grid(m):
            return (triton.cdiv(lq, m["BLOCK_M"]) * bh,)

        def k_grid(m):
            return (triton.cdiv(lk, m["BLOCK_N"]) * bh,)

        meta["fwd"]["RAW"] = not cap and self.scale > 0  # see _fwd_tiles
        forward = _KERNELS["fwd"].launch(q_grid, meta["fwd"])
        if self.fused:  # one program per (batch, head) holds every query row
            meta["fused"]["BLOCK_M"] = _bucket(self.lq)
            return forward, (_KERNELS["fused"].launch((bh,), meta["fused"]),)
        return forward, (_KERNELS["dq"].launch(q_grid, meta["dq"]), _KERNELS["dkdv"].launch(k_grid, meta["dkdv"]))


def _heads_inner(q: Tensor) -> bool:
    """Whether ``q [B, H, Lq, D]`` keeps its heads inside its positions (``[B, Lq, H, D]``-like memory)."""
    return q.stride(1) < q.stride(2)


def _new_out(q: Tensor, shape: tuple[int, int, int, int]) -> Tensor:
    """An uninitialised ``o`` of ``shape [B, H, Lq, D]`` in ``q``'s layout (see :class:`_Problem`)."""
    if _heads_inner(q):
        b, h, lq, d = shape
        return q.new_empty((b, lq, h, d)).transpose(1, 2)
    return q.new_empty(shape)


_PROBLEMS: dict[tuple, _Problem] = {}


def _problem(
    q: Tensor, k: Tensor, v: Tensor, lens: Tensor | None, causal: bool, scale: float | None, softcap: float | None
) -> _Problem:
    """The (cached) :class:`_Problem` of these inputs; the backward path thresholds are part of the key."""
    key = (
        q.device,
        q.dtype,
        q.shape,
        q.stride(),
        k.shape,
        k.stride(),
        v.stride(),
        None if lens is None else lens.dtype,
        causal,
        scale,
        softcap,
        _PATHS["fused_max_lq"],
        aligned(q, k, v, lens),
    )
    pb = _PROBLEMS.get(key)
    if pb is None:
        if len(_PROBLEMS) >= MAX_KEYS:
            _PROBLEMS.clear()
        pb = _PROBLEMS[key] = _Problem(key, q, k, v, lens, causal, scale, softcap)
    return pb


def _forward(q: Tensor, k: Tensor, v: Tensor, lens: Tensor | None, pb: _Problem) -> tuple[Tensor, Tensor]:
    """Returns ``o [B, H, Lq, D]`` and ``lse [B, H, Lq]`` (log2 units, fp32, ``+inf`` for empty rows)."""
    o = _new_out(q, pb.out_shape)
    lse = torch.empty(pb.out_shape[:3], dtype=torch.float32, device=q.device)
    pb.forward(q, k, v, o, lse, lse if lens is None else lens, *pb.fwd_ints)
    return o, lse


def _backward(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, lens: Tensor | None, pb: _Problem
) -> tuple[Tensor, Tensor, Tensor]:
    """dq (shape of ``q``), dk, dv; broadcast queries get their per-batch dq summed in fp32.

    The kernels read ``do`` with ``o``'s strides, 16-byte aligned, as the launches of
    ``pb.backward`` were specialised for; a ``do`` in another layout is copied into ``o``'s.
    """
    if do.stride() != o.stride() or do.data_ptr() % 16:
        do = torch.empty_like(o).copy_(do)
    dev = q.device
    dk = torch.empty(pb.kv_shape, dtype=k.dtype, device=dev)
    dv = torch.empty(pb.kv_shape, dtype=v.dtype, device=dev)
    dq = torch.empty(pb.out_shape, dtype=pb.dq_dtype, device=dev)
    lens_arg = lse if lens is None else lens
    if pb.fused:  # delta stays inside the program: `lse` fills its unused slot
        pb.backward[0](q, k, v, o, do, lse, lse, dq, dk, dv, lens_arg, *pb.bwd_ints)
    else:  # the dq kernel also writes delta for the dk/dv kernel
        delta = torch.empty_like(lse)
        dq_kernel, dkdv = pb.backward
        dq_kernel(q, k, v, o, do, lse, delta, dq, dk, dv, lens_arg, *pb.bwd_ints)
        dkdv(q, k, v, do, lse, delta, dk, dv, lens_arg, *pb.bwd_ints)
    if pb.broadcast:
        dq = dq.sum(0, keepdim=True)
    return dq.to(q.dtype), dk, dv


class _FlashAttention(torch.autograd.Function):
    """Eager autograd path (the registered op below costs ~13 µs more per call in the dispatcher).

    Takes the :class:`_Problem` (looked up by the caller) in place of the flags: the backward
    reuses its launches without a second lookup.
    """

    @staticmethod
    def forward(ctx, q, k, v, lens, pb):
        o, lse = _forward(q, k, v, lens, pb)
        ctx.save_for_backward(q, k, v, o, lse, lens)
        ctx.problem = pb  # the forward fixes the backward path (see backward_paths)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, lens = ctx.saved_tensors
        dq, dk, dv = _backward(do, q, k, v, o, lse, lens, ctx.problem)
        return dq, dk, dv, None, None


# --------------------------------------------------------------------------------------------
# Registered operators (what torch.compile traces)
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("recsys::flash_attention", mutates_args=())
def flash_attention_op(
    q: Tensor, k: Tensor, v: Tensor, lens: Tensor | None, causal: bool, scale: float, softcap: float
) -> tuple[Tensor, Tensor]:
    """``(o [B, H, Lq, D], lse [B, H, Lq] fp32)``; arguments as :func:`triton_attention` with
    ``scale`` resolved and ``softcap = 0`` for none. ``lse`` is saved for the backward."""
    return _forward(q, k, v, lens, _problem(q, k, v, lens, causal, scale, softcap))


@flash_attention_op.register_fake
def _(q, k, v, lens, causal, scale, softcap):
    batch, heads, _, head_dim = k.shape
    lq = q.shape[2]
    return _new_out(q, (batch, heads, lq, head_dim)), q.new_empty((batch, heads, lq), dtype=torch.float32)


@torch.library.custom_op("recsys::flash_attention_backward", mutates_args=())
def flash_attention_backward_op(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    lens: Tensor | None,
    causal: bool,
    scale: float,
    softcap: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` shaped like ``q``, ``k``, ``v`` (contiguous) from the forward's ``o`` and ``lse``."""
    return _backward(do, q, k, v, o, lse, lens, _problem(q, k, v, lens, causal, scale, softcap))


@flash_attention_backward_op.register_fake
def _(do, q, k, v, o, lse, lens, causal, scale, softcap):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, lens, causal, scale, softcap = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, lens)
    ctx.flags = (causal, scale, softcap)
    ctx.mark_non_differentiable(lse)


def _op_backward(ctx, do, _dlse):
    q, k, v, o, lse, lens = ctx.saved_tensors
    dq, dk, dv = flash_attention_backward_op(do, q, k, v, o, lse, lens, *ctx.flags)
    return dq, dk, dv, None, None, None, None


flash_attention_op.register_autograd(_op_backward, setup_context=_setup_context)


def triton_supports(q: Tensor, v: Tensor) -> bool:
    """Whether the kernel covers ``q``'s dtype and head dim (fp16/bf16/fp32, ``D <= 128``) and
    ``v``'s head dim (that of ``q``)."""
    return q.dtype in DTYPES and q.shape[-1] <= MAX_HEAD_DIM and v.shape[-1] == q.shape[-1]


def triton_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_lengths: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
) -> Tensor:
    """Flash attention with key padding, causal masking, soft-capping and broadcast queries.

    Args:
        q: ``[B or 1, H, Lq, D]`` (any strides); ``B = 1`` broadcasts the queries over the batch.
        k: ``[B, H, Lk, D]``.
        v: ``[B, H, Lk, D]``.
        key_lengths: ``[B]`` int; keys at positions ``>= key_lengths[b]`` are masked and their
            tiles skipped. Values are clamped to ``[0, Lk]``.
        causal: query ``i`` sees keys ``j <= i`` (needs ``Lq == Lk``). With ``key_lengths``, query
            rows ``i >= key_lengths[b]`` are padding: their output is 0, they contribute nothing
            to any gradient, and their work is skipped.
        scale: logit scale, default ``1 / sqrt(D)``.
        softcap: if set (non-zero), logits become ``softcap * tanh(logits / softcap)``.

    Returns:
        ``[B, H, Lq, D]`` in the input dtype; rows with no visible key (causal: every padded row) are
        0 with zero gradients.

    Raises:
        ValueError: on a dtype other than fp16/bf16/fp32, ``D > 128``, mismatched shapes or
            devices.
    """
    check_attention_args(q, k, v, key_lengths, causal)
    if q.dtype not in DTYPES:
        raise ValueError(f"triton attention needs q, k, v all fp16, bf16 or fp32; got {q.dtype}")
    if q.shape[3] > MAX_HEAD_DIM:
        raise ValueError(f"triton attention supports head dim D <= {MAX_HEAD_DIM}, got {q.shape[3]}")
    if v.shape != k.shape:
        raise ValueError(f"triton attention needs v shaped like k; got {tuple(v.shape)} and {tuple(k.shape)}")
    return flash_attention(q, k, v, key_lengths, causal, scale, softcap)


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_lengths: Tensor | None,
    causal: bool,
    scale: float | None,
    softcap: float | None,
) -> Tensor:
    """:func:`triton_attention` on arguments the caller has checked (as :func:`recsys.kernels.attention`
    does): the launched path, with the fewest host steps."""
    if q.numel() == 0 or k.numel() == 0:
        return attention_ref(q, k, v, key_lengths=key_lengths, causal=causal, scale=scale, softcap=softcap)
    lens = key_lengths  # the kernels read any integer dtype: no cast launch
    if lens is not None and (lens.device != q.device or lens.stride(0) != 1):
        lens = lens.to(q.device).contiguous()
    causal, softcap = bool(causal), float(softcap) if softcap else None
    if torch.compiler.is_compiling():
        scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
        return flash_attention_op(q, k, v, lens, causal, scale, softcap or 0.0)[0]
    pb = _problem(q, k, v, lens, causal, scale, softcap)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _FlashAttention.apply(q, k, v, lens, pb)
    return _forward(q, k, v, lens, pb)[0]  # inference (evaluation, serving): no autograd node, nothing saved
