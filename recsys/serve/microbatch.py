"""Adaptive micro-batching for an asyncio server: concurrent requests share one model call.

:class:`MicroBatcher` runs a synchronous batch function ``fn(items) -> results`` in worker
threads. Requests submitted in the same event-loop turn form one batch, which starts at once
when a worker is free (no waiting timer); requests that arrive while every worker is busy
queue up and form the next batch (up to ``max_batch``). So an idle server answers a lone
request with no added delay, and a loaded one amortises the per-call cost of the model and the
index over every request in flight. The event loop stays free to read and parse requests while
the workers compute (torch and FAISS release the GIL), and with ``workers = 2`` two batches
run at once on two cores (``fn`` must then be safe to call from two threads: read-only model
inference and FAISS searches are).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

__all__ = ["MicroBatcher"]

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    """Batch concurrent :meth:`submit` calls into calls of ``fn``.

    Args:
        fn: ``fn(items: list[T]) -> Sequence[R]``, one result per item, in order; runs in a
            worker thread. If it raises, every request of that batch gets the exception.
        max_batch: the most items per call.
        workers: batches computed at the same time (worker threads).
    """

    def __init__(self, fn: Callable[[list[T]], Sequence[R]], max_batch: int = 64, workers: int = 1) -> None:
        if max_batch <= 0:
            raise ValueError(f"max_batch: must be > 0, got {max_batch}")
        if workers <= 0:
            raise ValueError(f"workers: must be > 0, got {workers}")
        self._fn = fn
        self._max_batch = max_batch
        self._workers = workers
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="recsys-batch")
        self._running = 0  # batches in the workers now
        self._kick_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # calls of fn so far
        self.items = 0  # items handled so far

    async def submit(self, item: T) -> R:
        """Queue ``item`` and wait for its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, future))
        if not self._kick_scheduled:  # after this loop turn, so its other submits join the batch
            self._kick_scheduled = True
            loop.call_soon(self._kick, loop)
        return await future

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start batches from the queue while a worker is free."""
        self._kick_scheduled = False
        while self._pending and self._running < self._workers:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            self._running += 1
            task = loop.create_task(self._run(batch))
            self._tasks.add(task)  # keep a reference until it is done
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        loop = asyncio.get_running_loop()
        try:
            results: Any = await loop.run_in_executor(self._executor, self._fn, [item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"batch function returned {len(results)} results for {len(batch)} items")
        except Exception as err:  # noqa: BLE001 - every waiter of the failed batch gets the error
            for _, future in batch:
                if not future.done():
                    future.set_exception(err)
        else:
            self.batches += 1
            self.items += len(batch)
            for (_, future), result in zip(batch, results):
                if not future.done():  # a cancelled request (client gone) is skipped
                    future.set_result(result)
        finally:
            self._running -= 1
            self._kick(loop)

    def close(self) -> None:
        """Stop the worker threads (after the running batches)."""
        self._executor.shutdown(wait=True)
