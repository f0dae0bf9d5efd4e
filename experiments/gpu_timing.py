"""GPU timing helpers shared by the kernel benchmarks.

``launch_ms`` times calls launched one by one from Python (CPU launch overhead included, which
on the lent H200 is tens of µs per op); ``graph_ms`` captures several calls in one CUDA graph
and replays it, which measures what the kernels cost once launched.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from triton.testing import do_bench


def launch_ms(fn: Callable[[], object], rep: int = 200) -> float:
    """Median time per call launched from Python (CPU launch overhead included)."""
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def graph_ms(fn: Callable[[], object], calls: int = 20, replays: int = 15) -> float:
    """Median GPU time per call: ``calls`` calls captured in one CUDA graph, replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]
