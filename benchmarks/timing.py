"""GPU timing helpers shared by the kernel benchmarks.

``launch_ms`` times calls launched one by one from Python (CPU launch overhead included, tens
of µs per op on a busy host); ``graph_ms`` captures several calls in one CUDA graph
and replays it, which measures what the kernels cost once launched.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable

import torch
from triton.testing import do_bench

from recsys.train.graphs import capturing


def launch_ms(fn: Callable[[], object], rep: int = 200, warmup: int = 25) -> float:
    """Median time per call launched from Python (CPU launch overhead included)."""
    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def interleaved_launch_ms(
    fns: dict[Hashable, Callable[[], object]], rounds: int = 5, rep: int = 20
) -> dict[Hashable, float]:
    """:func:`launch_ms` of each function, taken in turns: ``rounds`` rounds, each timing every
    function once (for ``rep`` ms), then the median of its rounds. A host's speed can drift
    during a bench (launched times have moved by up to 3x between runs of the same code), and launched
    calls are host-bound; timed in turns, the methods compared share the drift, so their ratios do
    not depend on which one was timed when. A function that raises gets ``nan`` (the reason
    printed) and is left out of the later rounds."""
    times: dict[Hashable, list[float]] = {key: [] for key in fns}
    failed: set[Hashable] = set()
    for _ in range(rounds):
        for key, fn in fns.items():
            if key in failed:
                continue
            try:
                times[key].append(launch_ms(fn, rep=rep, warmup=5))
            except Exception as exc:  # noqa: BLE001 - report and go on with the others
                print(f"  {key}: launched timing failed: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                failed.add(key)
    return {key: float("nan") if key in failed else statistics.median(ms) for key, ms in times.items()}


def graph_ms(fn: Callable[[], object], calls: int = 20, replays: int = 15) -> float:
    """Median GPU time per call: ``calls`` calls captured in one CUDA graph, replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # captured on the warm-up stream: its cuBLAS workspace exists before the capture (a first
    # backward captured on a fresh stream can fail); a failed capture leaves the device's random
    # generator and allocator as they were, so the methods timed after it still run
    with capturing(graph, stream):
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


def graph_ms_or_nan(fn: Callable[[], object], label: str) -> float:
    """:func:`graph_ms`, or ``nan`` for a call that cannot be captured in a CUDA graph (the reason
    printed under ``label``)."""
    try:
        return graph_ms(fn)
    except Exception as exc:  # noqa: BLE001 - some baselines cannot be captured: report and go on
        print(f"  {label}: CUDA graph capture failed: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
        return float("nan")


def launch_and_graph_ms(fn: Callable[[], object], label: str) -> dict[str, float]:
    """``{"launch": ms, "graph": ms}`` of :func:`launch_ms` and :func:`graph_ms_or_nan`, the graph
    captured first, as ``attention.py`` does (captures of a backward after its launched timing have
    failed)."""
    graph = graph_ms_or_nan(fn, label)
    return {"launch": launch_ms(fn, rep=100), "graph": graph}


def ratio_table(title: str, rows: list[tuple[str, dict[str, float], dict[str, float]]], baselines: list[str]) -> str:
    """A markdown table: per row, ``ours`` and each baseline in ms, then ``baseline / ours``.

    ``rows`` are ``(label, {method: ms}, {baseline: wanted ratio})``; a ratio with a target gets ✓ or ✗.
    """
    head = ["shape", "ours ms", *(f"{b} ms" for b in baselines), *(f"{b} / ours" for b in baselines)]
    lines = [title, "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, ms, targets in rows:
        ours = ms.get("ours", float("nan"))
        cells = [label, f"{ours:.4f}", *(f"{ms.get(b, float('nan')):.4f}" for b in baselines)]
        for b in baselines:
            ratio = ms.get(b, float("nan")) / ours
            mark = f" {'✓' if ratio >= targets[b] else '✗'} (≥{targets[b]})" if b in targets and ratio == ratio else ""
            cells.append(f"{ratio:.2f}x{mark}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shape_ratios(results: list[tuple[tuple[int, ...], dict]], timing: str, baselines: list[str]) -> str:
    """:func:`ratio_table` of per-shape results ``[(shape, {method: {"fwd launch": ms, "fb graph": ms, ...}})]``
    for ``timing`` (``"launch"`` or ``"graph"``): a forward and a forward+backward row per shape."""
    table: list[tuple[str, dict[str, float], dict[str, float]]] = []
    for shape, rows in results:
        for mode in ("fwd", "fb"):
            label = "x".join(map(str, shape)) + (" fwd" if mode == "fwd" else " f+b")
            table.append((label, {name: row[f"{mode} {timing}"] for name, row in rows.items()}, {}))
    what = "each call launched from Python" if timing == "launch" else "CUDA-graph replay (GPU time only)"
    return ratio_table(f"\n{timing}: {what}", table, baselines)
