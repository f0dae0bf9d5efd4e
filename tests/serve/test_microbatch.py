"""MicroBatcher: concurrent submits share calls, keep their order, and see their batch's error."""

import asyncio
import threading
import time

import pytest

from recsys.serve.microbatch import MicroBatcher


def test_concurrent_submits_are_batched_in_order():
    sizes = []

    def square_slowly(items):
        sizes.append(len(items))
        time.sleep(0.01)  # while this runs, the other requests queue up
        return [x * x for x in items]

    async def go():
        batcher = MicroBatcher(square_slowly, max_batch=8)
        alone = await batcher.submit(7)  # a lone request does not wait for company
        results = await asyncio.gather(*(batcher.submit(i) for i in range(30)))
        batcher.close()
        return alone, results, batcher

    alone, results, batcher = asyncio.run(go())
    assert alone == 49 and sizes[0] == 1
    assert results == [i * i for i in range(30)]
    assert sum(sizes[1:]) == 30 and max(sizes) == 8 and len(sizes) - 1 < 30
    assert batcher.batches == len(sizes) and batcher.items == 31


def test_batch_error_reaches_its_waiters_only():
    calls = []
    main_thread = threading.get_ident()

    def fail_on_negative(items):
        calls.append(threading.get_ident())
        if any(x < 0 for x in items):
            raise ValueError("negative")
        return items

    async def go():
        batcher = MicroBatcher(fail_on_negative, max_batch=4)
        with pytest.raises(ValueError, match="negative"):
            await batcher.submit(-1)
        ok = await asyncio.gather(*(batcher.submit(i) for i in range(5)))
        batcher.close()
        return ok

    assert asyncio.run(go()) == list(range(5))
    assert calls and all(ident != main_thread for ident in calls)  # ran in the worker thread


def test_wrong_result_count_is_an_error():
    async def go():
        batcher = MicroBatcher(lambda items: [], max_batch=2)
        with pytest.raises(RuntimeError, match="0 results for 1 items"):
            await batcher.submit(1)
        batcher.close()

    asyncio.run(go())
    with pytest.raises(ValueError, match="max_batch"):
        MicroBatcher(lambda items: items, max_batch=0)
