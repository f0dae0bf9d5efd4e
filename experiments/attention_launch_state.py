"""Is the launched attention forward+backward at 4096 x 50 host-bound, and does building the
bench's competitors (FlexAttention's block mask and compiled kernel, SDPA) in the same process
change it?

Times the public ``recsys.kernels.attention`` launched (``do_bench`` medians, as
``bench_attention.py`` does) and its host time per call (host clock over 200 calls with no sync
between them) after each step, and profiles 200 forward+backward calls at the start and the end.
(Two bench runs had given 0.19 ms and 0.40 ms for the same launched call, 2026-11-30.)

    python experiments/attention_launch_state.py     # needs CUDA
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from bench_attention import make_inputs  # experiments/ is on sys.path as a script
from gpu_timing import launch_ms

from recsys.kernels import attention

BATCH, SEQ_LEN = 4096, 50  # bench_attention.py's first shape (H = 2, D = 64)


def host_us(fn: Callable[[], object], calls: int = 200) -> float:
    """Host microseconds per call of ``fn`` (the GPU may still be running when the clock stops)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main() -> None:
    (q, k, v), lengths, do = make_inputs(BATCH, SEQ_LEN, seed=0)  # the bench's inputs

    def forward():
        return attention(q, k, v, key_lengths=lengths)

    def forward_backward():
        return torch.autograd.grad(forward(), (q, k, v), do)

    def report(state: str) -> None:
        print(f"{state:32s} f+b launched {launch_ms(forward_backward):.4f} ms, fwd {launch_ms(forward):.4f} ms; "
              f"host us per call: f+b {host_us(forward_backward):.0f}, fwd {host_us(forward):.0f}", flush=True)

    def profile(state: str) -> None:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            forward_backward()
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
        print(f"--- cProfile of 200 f+b calls, {state}\n{text.getvalue()}")

    forward_backward()  # compile and autotune
    report("fresh")
    report("fresh, again")
    profile("fresh")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    report("after importing flex_attention")
    block_mask = create_block_mask(lambda b, h, qi, ki: ki < lengths[b], BATCH, None, SEQ_LEN, SEQ_LEN, device="cuda")
    report("after create_block_mask")
    compiled = torch.compile(flex_attention, dynamic=False)
    torch.autograd.grad(compiled(q, k, v, block_mask=block_mask), (q, k, v), do)
    report("after compiled flex f+b")
    mask = (torch.arange(SEQ_LEN, device="cuda")[None, :] < lengths[:, None])[:, None, None, :]
    torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), (q, k, v), do)
    report("after SDPA f+b")
    profile("after all")


if __name__ == "__main__":
    main()
