"""Whether the training step runs as one CUDA graph (``train.cuda_graph``), and the streams it needs.

``train.cuda_graph`` is ``"auto"`` (the default), ``true`` or ``false``:

* ``"auto"`` captures the whole step (forward, backward, gradient all-reduce under DDP, clipping,
  fused Adam) on CUDA whenever it can, and otherwise trains with eager launches after one log
  line saying why: the device is not CUDA, ``train.compile`` is on, NCCL is too old to capture
  collectives, or capturing the step raised an error.
* ``true`` is the same, but a step that cannot be captured is an error naming the key.
* ``false`` always launches eagerly.

Under DDP (``torchrun``) every rank captures its own graph, following PyTorch's notes on CUDA
graphs with DistributedDataParallel: NCCL >= 2.9.6 captures the all-reduce, asynchronous NCCL
error handling is off before the process group starts
(:func:`recsys.train.distributed.setup_distributed`), the DDP wrapper is built on the side stream
that later warms up and captures the step (:func:`side_stream`), and at least
:data:`DDP_WARMUP_STEPS` eager DDP steps run before the capture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from recsys.config import Config

__all__ = [
    "DDP_WARMUP_STEPS",
    "MIN_NCCL",
    "WARMUP_STEPS",
    "GraphPlan",
    "capturing",
    "graph_blocker",
    "launch_line",
    "plan_graph",
    "side_stream",
]

WARMUP_STEPS = 3  # eager steps before a capture: lazy state (optimizer moments, autotuning) exists
DDP_WARMUP_STEPS = 11  # PyTorch: DDP needs 11 eager iterations (its first 10 collect timing stats)
MIN_NCCL = (2, 9, 6)  # the first NCCL whose collectives from several processes can be captured


def _nccl_version() -> tuple[int, ...]:
    version = torch.cuda.nccl.version()
    if isinstance(version, int):  # old torch: 2.9.6 as 2906
        return version // 1000, version % 1000 // 100, version % 100
    return tuple(version)


def graph_blocker(cfg: Config, device: torch.device, world_size: int = 1) -> str | None:
    """Why the training step cannot be captured on ``device`` with ``world_size`` processes, or
    ``None`` when it can (as far as can be told before trying)."""
    if device.type != "cuda":
        return f"training runs on {device.type}; CUDA graphs need a CUDA device"
    if cfg.train.compile:
        return "train.compile = true (torch.compile launches the step its own way)"
    if world_size > 1 and cfg.train.item_updates == "sharded":
        return (
            'train.item_updates = "sharded" under torchrun: its exchanges of ids and rows between processes '
            "(recsys.items.sharded) are not captured"
        )
    if world_size > 1 and _nccl_version() < MIN_NCCL:
        have = ".".join(map(str, _nccl_version()))
        return f"NCCL {have} cannot capture the gradient all-reduce (needs >= {'.'.join(map(str, MIN_NCCL))})"
    return None


def launch_line(cfg: Config, captured: bool, reason: str | None = None) -> str:
    """The one line a run logs about how its step is launched (``reason``: why not as a graph)."""
    mode = cfg.train.cuda_graph
    mode = mode if isinstance(mode, str) else str(mode).lower()
    if captured:
        return f"training step: one CUDA graph per step (train.cuda_graph = {mode})"
    return f"training step: eager launches (train.cuda_graph = {mode}{f': {reason}' if reason else ''})"


GraphPlan = tuple[bool, str | None]  # whether the step is captured, and why not where it is not


def plan_graph(cfg: Config, device: torch.device, world_size: int = 1) -> GraphPlan:
    """``(capture?, why not)`` for ``cfg.train.cuda_graph`` on ``device`` with ``world_size``
    processes; ``why not`` is ``None`` when capturing, or when ``train.cuda_graph = false``.

    Raises ``ValueError`` naming ``train.cuda_graph`` when it is ``true`` and the step cannot be
    captured here.
    """
    mode = cfg.train.cuda_graph
    if mode is False:
        return False, None
    blocker = graph_blocker(cfg, device, world_size)
    if blocker is not None and mode is True:
        raise ValueError(f'train.cuda_graph = true: {blocker}; set it to "auto" (capture where possible) or false')
    return blocker is None, blocker


@contextlib.contextmanager
def side_stream(stream: torch.cuda.Stream | None) -> Iterator[None]:
    """Run the block on ``stream``, ordered after the current stream's work and before its later
    work (no-op for ``None``)."""
    if stream is None:
        yield
        return
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream(stream.device).wait_stream(stream)


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, *, thread_local: bool = False) -> Iterator[None]:
    """``torch.cuda.graph(graph, stream=stream)`` that, when the capture fails, puts the current
    stream, the memory allocator and the device's default random generator back as they were
    before raising (``torch.cuda.graph`` does none of it when ending an invalidated capture raises:
    the allocator would keep routing to the dead graph's pool and stop recycling memory, and the
    generator would stay in capture mode, so that every later random op on the device, e.g. the
    eager fallback's dropout, fails with "Offset increment outside graph capture encountered
    unexpectedly"). ``thread_local``: only this thread's CUDA calls can invalidate the capture
    (others, e.g. NCCL's watchdog, keep querying events)."""
    device = stream.device
    index = device.index if device.index is not None else torch.cuda.current_device()
    before = torch.cuda.current_stream(device)
    pool = torch.cuda.graph_pool_handle()
    try:
        with torch.cuda.graph(
            graph, pool=pool, stream=stream, capture_error_mode="thread_local" if thread_local else "global"
        ):
            yield
    except BaseException:
        torch.cuda.set_stream(before)
        generator = torch.cuda.default_generators[index]
        generator.graphsafe_set_state(generator.clone_state())  # same seed and offset, not capturing
        try:
            torch._C._cuda_endAllocateToPool(index, pool)
        except RuntimeError:  # the capture ended far enough to stop routing; the graph frees its pool
            pass
        else:
            torch._C._cuda_releasePool(index, pool)
        raise
