"""Run the flash-attention kernel's forward + backward repeatedly at one shape, for a profiler.

Meant to sit under Nsight Compute, e.g. the backward kernels at the shortest shape::

    ncu -k regex:_bwd --launch-skip 10 --launch-count 2 --section SpeedOfLight \
        --section Occupancy --section WarpStateStats python experiments/profile_attention.py 4096 50

Inputs follow ``bench_attention.py`` (bf16, H = 2, D = 64, key lengths uniform in [L/4, L]);
autotuning is off (``RECSYS_ATTN_AUTOTUNE=0``) so the launches use the fixed H200 configurations.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("RECSYS_ATTN_AUTOTUNE", "0")

import torch  # noqa: E402

from recsys.kernels import attention  # noqa: E402


def main(batch: int, seq_len: int, iters: int = 20) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (batch, 2, seq_len, 64)
    q, k, v, do = (torch.randn(shape, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4))
    lengths = torch.randint(max(1, seq_len // 4), seq_len + 1, (batch,), device="cuda", generator=g)
    inputs = [t.requires_grad_() for t in (q, k, v)]
    for _ in range(iters):
        torch.autograd.grad(attention(*inputs, key_lengths=lengths, backend="triton"), inputs, do)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
