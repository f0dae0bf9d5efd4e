"""Data-parallel setup from the environment ``torchrun`` provides (nanoGPT style).

``torchrun --nproc_per_node=N -m recsys train ...`` sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; :func:`setup_distributed` reads them and
joins the process group (NCCL on CUDA, gloo on CPU). Without them it is a no-op that returns a
single-process :class:`DistInfo`, so the same training code runs either way::

    info = setup_distributed(cfg.train.device)
    model = build(...).to(info.device)
    if info.world_size > 1:
        model = DDP(model, device_ids=[info.local_rank] if info.device.type == "cuda" else None)
    ...  # one seed on every rank, each training its slice of the global batch; files only if info.is_main
    cleanup()

A collective waits :func:`collective_timeout` for the other ranks; :func:`rank_failure` turns a
failed one (a rank that died, stopped or hung) into one line naming the ranks.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from recsys.device import resolve_device

T = TypeVar("T")

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
TIMEOUT_ENV = "RECSYS_DIST_TIMEOUT"  # seconds a collective waits for the other ranks
DEFAULT_TIMEOUT_S = 600.0  # longer than a validation on rank 0, which the other ranks wait out in one


def collective_timeout() -> timedelta:
    """How long a collective waits for every rank before it fails: ``RECSYS_DIST_TIMEOUT``
    seconds, 600 by default. A rank that stopped or hung (a lost host, a stopped process) then
    ends the job with an error instead of holding the others forever."""
    value = os.environ.get(TIMEOUT_ENV, "")
    if not value:
        return timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{TIMEOUT_ENV}: must be a number of seconds > 0, got {value!r}")
    return timedelta(seconds=seconds)


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: its global ``rank`` of ``world_size``, ``local_rank`` on the host."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs and writes the run directory."""
        return self.rank == 0


def setup_distributed(device_pref: str = "auto", *, graphs: bool = False) -> DistInfo:
    """Join the process group described by the ``torchrun`` environment, or run alone.

    ``device_pref``: ``auto`` (CUDA when available), ``cpu`` or ``cuda``. Under ``torchrun``
    each process takes ``cuda:LOCAL_RANK`` (made current) and the NCCL backend, or the CPU and
    gloo. Without ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` nothing is initialised and
    ``world_size`` is 1. Partial variables are an error.

    ``graphs``: the step may be captured in a CUDA graph, so NCCL's asynchronous error handling
    is turned off before the group starts (``TORCH_NCCL_ASYNC_ERROR_HANDLING=0``, as PyTorch's
    notes on graphs with DDP ask; a value already in the environment is kept).
    """
    present = [name for name in _ENV if name in os.environ]
    if not present:
        return DistInfo(rank=0, world_size=1, local_rank=0, device=resolve_device(device_pref, "train.device", index=0))
    if len(present) != len(_ENV):
        missing = ", ".join(name for name in _ENV if name not in os.environ)
        raise RuntimeError(f"distributed launch: {missing} not set (launch with torchrun)")
    try:
        rank, world_size, local_rank = (int(os.environ[name]) for name in _ENV)
    except ValueError:
        values = ", ".join(f"{name}={os.environ[name]!r}" for name in _ENV)
        raise RuntimeError(f"distributed launch: non-integer environment ({values})") from None
    device = resolve_device(device_pref, "train.device", index=local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if graphs and backend == "nccl":
            os.environ.setdefault(NCCL_ASYNC_ERROR_HANDLING, "0")
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, timeout=collective_timeout())
        _raise_on_sigterm()
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


class RankFailure(ConnectionError):
    """A collective failed because another rank died, stopped or hung: one line naming the ranks."""


class Terminated(Exception):
    """SIGTERM reached a rank: torchrun stops every rank this way when one fails."""


def _raise_on_sigterm() -> None:
    """Turn SIGTERM into :class:`Terminated` (in the main thread, where Python runs handlers), so
    a rank that torchrun stops ends through :func:`rank_failure`'s one line rather than silently."""
    if threading.current_thread() is not threading.main_thread():
        return

    def terminated(signum: int, frame: object) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, terminated)


CHECK_IN_S = 5.0  # after a timed-out collective, how long the ranks still alive have to say so


def rank_failure(err: BaseException) -> RankFailure | None:
    """``err`` as a :class:`RankFailure` when it is a failed collective of this job, else None.

    A rank that died closes its connections: the others fail at once ("Connection reset by
    peer"), or are stopped by torchrun's SIGTERM first (:class:`Terminated`), and torchrun's
    report names the rank that exited. A rank that stopped or hung (a lost
    host, a stopped process) is only noticed by :func:`collective_timeout`; the ranks still alive
    then check in at the job's key-value store for :data:`CHECK_IN_S` seconds, and those that do
    not are named.
    """
    if not dist.is_initialized() or not (isinstance(err, Terminated) or _is_collective_error(err)):
        return None
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if isinstance(err, Terminated):  # torchrun saw another rank exit before this one failed a collective
        return RankFailure(f"rank {rank} of {world_size}: stopped by SIGTERM; torchrun names the rank that exited")
    cause = _first_sentence(err)
    if "timed out" not in cause.lower():
        return RankFailure(
            f"rank {rank} of {world_size}: lost another rank ({cause}); torchrun names the rank that exited"
        )
    silent = _silent_ranks(rank, world_size)
    who = (
        f"rank {', '.join(map(str, silent))} did not answer (stopped or hung)"
        if silent
        else "another rank stopped or hung"
    )
    return RankFailure(
        f"rank {rank} of {world_size}: {who}; a collective waited {collective_timeout().total_seconds():g} s "
        f"for it ({TIMEOUT_ENV})"
    )


def _first_sentence(err: BaseException) -> str:
    """The error's first sentence without gloo's source location (``[.../pair.cc:553] Connection
    closed by peer [127.0.0.1]:11462. This is typically ...`` -> ``Connection closed by peer [127.0.0.1]:11462``)."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(err).strip())
    return text.splitlines()[0].split(". ")[0] if text else type(err).__name__


def _is_collective_error(err: BaseException) -> bool:
    """gloo raises plain RuntimeErrors from its sources; NCCL and the store raise DistErrors."""
    return isinstance(err, dist.DistError) or (isinstance(err, RuntimeError) and "gloo" in str(err))


def _silent_ranks(rank: int, world_size: int) -> list[int]:
    """The ranks that do not check in at the job's store within :data:`CHECK_IN_S` seconds (or the
    collective timeout, if shorter); empty when the store cannot tell (it may be the silent rank's own)."""
    try:
        store = dist.distributed_c10d._get_default_store()  # the job's store (torchrun's agent holds it)
        store.set(f"recsys/alive/{rank}", "1")
        deadline = time.monotonic() + min(CHECK_IN_S, collective_timeout().total_seconds())
        while True:
            silent = [r for r in range(world_size) if not store.check([f"recsys/alive/{r}"])]
            if not silent or time.monotonic() > deadline:
                return silent
            time.sleep(0.1)
    except Exception:  # noqa: BLE001 - the store is gone too: nothing more to say
        return []


def cleanup() -> None:
    """Leave the process group if one was joined (safe to call always).

    Collects garbage first: a DDP wrapper sits in reference cycles, so it is freed only by the
    cycle collector, and a reducer freed after its process group is destroyed can hang the
    process (seen with gloo).
    """
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def is_main() -> bool:
    """True on rank 0, and in a single-process run."""
    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    """Wait for every rank (no-op in a single-process run)."""
    if dist.is_initialized():
        dist.barrier()


def broadcast_flag(flag: bool, device: torch.device) -> bool:
    """Rank 0's ``flag`` on every rank (e.g. early stop decided by the main process).

    Syncs the host; call it at evaluation time, not every step. ``device`` is this rank's device
    (NCCL needs a CUDA tensor). Single-process: returns ``flag``.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    value = torch.tensor([int(flag)], device=device)
    dist.broadcast(value, src=0)
    return bool(value.item())


def broadcast_object(obj: T, src: int = 0) -> T:
    """Rank ``src``'s picklable ``obj`` on every rank (syncs the host; single-process: ``obj``)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: T) -> list[T]:
    """Every rank's picklable ``obj``, in rank order (syncs the host; single-process: ``[obj]``)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    box: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(box, obj)
    return box


def broadcast_weights(model: nn.Module) -> None:
    """Rank 0's parameters and buffers into every rank's ``model``, in place (single-process: no-op)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src=0)


def all_true(flag: bool, device: torch.device) -> bool:
    """True when ``flag`` is true on every rank (syncs the host; single-process: ``flag``).

    ``device`` is this rank's device (NCCL needs a CUDA tensor)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def mean_across_ranks(values: torch.Tensor) -> torch.Tensor:
    """``values`` averaged over the ranks, on every rank (single-process: ``values``); one
    all-reduce on ``values``' device (call it where the host syncs anyway, e.g. at a log line)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    total = values.clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module under DDP (``.module``) and ``torch.compile`` (``._orig_mod``) wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(inner := getattr(model, "_orig_mod", None), nn.Module):
            model = inner
        else:
            return model
