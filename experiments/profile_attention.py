"""Run the flash-attention kernel's forward + backward repeatedly at one shape, for a profiler.

Meant to sit under Nsight Compute, e.g. the backward kernels at the shortest shape::

    ncu -k regex:_bwd --launch-skip 10 --launch-count 2 --section SpeedOfLight \
        --section Occupancy --section WarpStateStats python experiments/profile_attention.py 4096 50

or, with ``--table``, to print the GPU time per kernel from ``torch.profiler`` for each backward
path ``backward_paths`` offers at that shape (the default, and the split dq and dk/dv kernels)::

    python experiments/profile_attention.py 1024 200 --table

Inputs follow ``bench_attention.py`` (bf16, H = 2, D = 64, key lengths uniform in [L/4, L]);
autotuning is off (``RECSYS_ATTN_AUTOTUNE=0``) unless ``--autotune``.
"""

from __future__ import annotations

import argparse
import os

_args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
_args.add_argument("batch", type=int)
_args.add_argument("seq_len", type=int)
_args.add_argument("--table", action="store_true", help="print GPU time per kernel for each backward path")
_args.add_argument("--autotune", action="store_true", help="let the kernels autotune (as the public default)")
ARGS = _args.parse_args()  # before torch: the flag sets the environment
if not ARGS.autotune:
    os.environ.setdefault("RECSYS_ATTN_AUTOTUNE", "0")

import torch  # noqa: E402
from gpu_timing import kernel_table, print_kernel_table  # noqa: E402

from recsys.kernels import attention  # noqa: E402
from recsys.kernels.triton_attention import backward_paths  # noqa: E402


def step(batch: int, seq_len: int):
    """A no-argument forward+backward at one shape (inputs drawn once)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (batch, 2, seq_len, 64)
    q, k, v, do = (torch.randn(shape, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4))
    lengths = torch.randint(max(1, seq_len // 4), seq_len + 1, (batch,), device="cuda", generator=g)
    inputs = [t.requires_grad_() for t in (q, k, v)]
    return lambda: torch.autograd.grad(attention(*inputs, key_lengths=lengths, backend="triton"), inputs, do)


def main() -> None:
    run = step(ARGS.batch, ARGS.seq_len)
    if not ARGS.table:
        for _ in range(20):
            run()
        torch.cuda.synchronize()
        return
    for label, paths in (("default path", {}), ("split backward", {"fused_max_lq": 0})):
        with backward_paths(**paths):
            print_kernel_table(f"{label}, f+b at B={ARGS.batch} L={ARGS.seq_len}", kernel_table(run))


if __name__ == "__main__":
    main()
