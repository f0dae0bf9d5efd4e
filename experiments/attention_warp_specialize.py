"""Does Triton's warp specialisation speed up the attention forward on this GPU?

The long-sequence forward (256 x 1024, 32 x 8192) runs its exponentials and its tensor-core
products one after the other (``NOTES_attention.md``); FlashAttention-3 overlaps them with
warp-specialised ping-pong. Triton >= 3.4 offers ``tl.range(..., warp_specialize=True)``, which
needs its loads through tensor descriptors (TMA). This script times a plain FlashAttention-2
forward written that way (key-padding lengths, bf16, H = 2, D = 64, lengths uniform in [L/4, L])
with and without warp specialisation, over tile shapes, beside the public
``recsys.kernels.attention`` forward, and checks each against SDPA in fp32.

    python experiments/attention_warp_specialize.py                  # CUDA: the table
    TRITON_INTERPRET=1 python experiments/attention_warp_specialize.py  # CPU: the error only
"""

from __future__ import annotations

import itertools
import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

LOG2E = 1.4426950408889634


@triton.jit
def _step(q, k_desc, v_desc, row, start, m_i, l_i, acc, qk_scale, kv_len, offs_n,
          MASK: tl.constexpr, dt: tl.constexpr):
    """One key block: online-softmax update of ``(max, sum, acc)`` (``[BLOCK_M]``, ``[BLOCK_M]``,
    ``[BLOCK_M, D]``); ``MASK`` masks keys at or past ``kv_len``."""
    qk = tl.dot(q, k_desc.load([row + start, 0]).T)
    if MASK:
        qk = tl.where((start + offs_n)[None, :] < kv_len, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(dt), v_desc.load([row + start, 0]), acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _fwd(q_desc, k_desc, v_desc, O, LENS, H, L, qk_scale,
         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr):
    """One (query block, batch x head); q, k, v are ``[B H L, D]`` descriptors (L a multiple of BLOCK_M)."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    kv_len = tl.minimum(tl.load(LENS + bh // H).to(tl.int32), L)
    row = bh * L
    dt = O.dtype.element_ty
    q = q_desc.load([row + pid_m * BLOCK_M, 0])
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    full = kv_len // BLOCK_N * BLOCK_N
    for start in tl.range(0, full, BLOCK_N, warp_specialize=WS):
        m_i, l_i, acc = _step(q, k_desc, v_desc, row, start, m_i, l_i, acc, qk_scale, kv_len, offs_n, False, dt)
    if full < kv_len:
        m_i, l_i, acc = _step(q, k_desc, v_desc, row, full, m_i, l_i, acc, qk_scale, kv_len, offs_n, True, dt)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    tl.store(O + (row + offs_m).to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :], (acc / l_i[:, None]).to(dt))


def forward(q, k, v, lengths, block_m: int, block_n: int, warps: int, stages: int, ws: bool) -> torch.Tensor:
    """``[B, H, L, D]`` contiguous inputs, ``L`` a multiple of ``block_m``, every length >= 1."""
    b, h, seq_len, d = q.shape
    o = torch.empty_like(q)
    descs = [TensorDescriptor.from_tensor(t.view(b * h * seq_len, d), [bl, d])
             for t, bl in ((q, block_m), (k, block_n), (v, block_n))]
    _fwd[(triton.cdiv(seq_len, block_m), b * h)](*descs, o, lengths, h, seq_len, LOG2E / math.sqrt(d), HEAD_DIM=d,
                                                 BLOCK_M=block_m, BLOCK_N=block_n, WS=ws, num_warps=warps,
                                                 num_stages=stages)
    return o


def main() -> None:
    cuda = torch.cuda.is_available()
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float16)
    for b, seq_len in [(256, 1024), (32, 8192)] if cuda else [(3, 256)]:
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(b, 2, seq_len, 64, device=dev, generator=g, dtype=dtype) for _ in range(3))
        lengths = torch.randint(max(1, seq_len // 4), seq_len + 1, (b,), device=dev, generator=g)
        mask = (torch.arange(seq_len, device=dev)[None, :] < lengths[:, None])[:, None, None, :]
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
        if not cuda:
            err = (forward(q, k, v, lengths, 64, 32, 4, 2, False).float() - ref).abs().max().item()
            print(f"interpreter, {b}x{seq_len}: max error {err:.1e}")
            continue
        from triton.testing import do_bench

        from recsys.kernels import attention

        ours = do_bench(lambda: attention(q, k, v, key_lengths=lengths), warmup=25, rep=200, return_mode="median")
        print(f"{b}x{seq_len} public attention forward: {ours:.4f} ms", flush=True)
        for bm, bn, w, st, ws in itertools.product([128], [64, 128], [4, 8], [2, 3], [False, True]):
            err = (forward(q, k, v, lengths, bm, bn, w, st, ws).float() - ref).abs().max().item()
            ms = do_bench(lambda: forward(q, k, v, lengths, bm, bn, w, st, ws), warmup=25, rep=200,
                          return_mode="median")
            print(f"  BM{bm} BN{bn} w{w} s{st} ws={ws}: {ms:.4f} ms  public / this {ours / ms:.3f}  err {err:.1e}",
                  flush=True)


if __name__ == "__main__":
    main()
