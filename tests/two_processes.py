"""Two gloo processes on the CPU, for the tests of what several ranks compute together."""

import os
import socket
import time

import pytest
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environment(rank: int, world_size: int, port: int) -> None:
    """What torchrun sets for ``rank`` of ``world_size`` on one host (``setup_distributed`` reads it)."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def run_two(worker, args: tuple, preload: list[str]) -> None:
    """``worker(rank, 2, port, *args)`` in two processes; fails on an error in either or after 120 s.

    forkserver: one clean process imports ``preload`` once and forks both workers from it; plain
    fork from the pytest process can deadlock in OpenMP after earlier tests ran parallel ops."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(preload)
    workers = mp.start_processes(worker, args=(2, free_port(), *args), nprocs=2, join=False, start_method="forkserver")
    deadline = time.monotonic() + 120
    while not workers.join(timeout=1):  # raises if a worker failed
        if time.monotonic() > deadline:
            for process in workers.processes:
                process.kill()
            pytest.fail("distributed workers did not finish within 120 s")
