"""Model instances shared by requests: one instance per worker, each used by one request at a time,
with a bounded queue in front of them.

A request holds an instance from :meth:`ModelPool.acquire` until its last chunk is made (or until its
client leaves, or its time is up). The model's calls run in the pool's threads, one step at a time,
so the event loop serves other requests meanwhile. A request that finds every instance busy and
``queue`` requests already waiting is refused at once (:class:`Busy`: 429 with Retry-After).
"""
from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator


class Busy(Exception):
    def __init__(self, retry_after: int):
        super().__init__(f"all workers busy and the queue full; retry after {retry_after} s")
        self.retry_after = retry_after


class TimedOut(Exception):
    pass


_DONE = object()


class ModelPool:
    def __init__(self, instances: list, queue: int, timeout: float):
        if not instances:
            raise ValueError("a pool needs at least one model instance")
        if queue < 0 or timeout <= 0:
            raise ValueError(f"queue must be >= 0 and timeout > 0, got {queue}, {timeout}")
        self.instances, self.queue_limit, self.timeout = list(instances), int(queue), float(timeout)
        self.executor = ThreadPoolExecutor(max_workers=len(self.instances), thread_name_prefix="anetts-model")
        self._free: asyncio.Queue | None = None
        self.waiting = 0
        self.busy = 0
        self._mean_seconds = 1.0  # running mean of how long a request holds an instance, for Retry-After

    def _queue(self) -> asyncio.Queue:
        if self._free is None:  # bound to the running loop on first use
            self._free = asyncio.Queue()
            for inst in self.instances:
                self._free.put_nowait(inst)
        return self._free

    def retry_after(self) -> int:
        turns = (self.waiting + self.busy) / len(self.instances)
        return max(1, math.ceil(turns * self._mean_seconds))

    async def acquire(self, deadline: float) -> "Slot":
        """An instance for one request until ``Slot.release()``; Busy / TimedOut when none comes."""
        free = self._queue()
        if free.empty() and self.waiting >= self.queue_limit:
            raise Busy(self.retry_after())
        self.waiting += 1
        try:
            inst = await asyncio.wait_for(free.get(), timeout=max(0.0, deadline - time.monotonic()))
        except (asyncio.TimeoutError, TimeoutError):
            raise TimedOut(f"no worker became free within the request timeout of {self.timeout:g} s") from None
        finally:
            self.waiting -= 1
        self.busy += 1
        return Slot(self, inst, deadline)

    def _give_back(self, inst, held_seconds: float) -> None:
        self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * held_seconds
        self.busy -= 1
        self._queue().put_nowait(inst)


class Slot:
    """One held instance: `call` runs a function of it in the pool's thread; `steps` walks an
    iterator it made one item at a time there. The instance goes back to the pool when the last
    call that touches it has finished, even if the request stopped waiting for that call."""

    def __init__(self, pool: ModelPool, model, deadline: float):
        self.pool, self.model, self.deadline = pool, model, deadline
        self._running: asyncio.Future | None = None
        self._released = False
        self._t0 = time.monotonic()

    async def call(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        if time.monotonic() > self.deadline:
            raise TimedOut(f"the request took longer than its timeout of {self.pool.timeout:g} s")
        loop = asyncio.get_running_loop()
        self._running = loop.run_in_executor(self.pool.executor, lambda: fn(*args, **kwargs))
        try:
            return await asyncio.shield(self._running)
        finally:
            if self._running.done():
                self._running = None

    async def steps(self, make: Callable[[], Iterator]):
        """Items of the iterator ``make()`` returns, each made in the pool's thread."""
        it = await self.call(make)
        while True:
            item = await self.call(next, it, _DONE)
            if item is _DONE:
                return
            yield item

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        running = self._running
        if running is not None and not running.done():  # the thread is still using the model
            running.add_done_callback(lambda _: self.pool._give_back(self.model, time.monotonic() - self._t0))
        else:
            self.pool._give_back(self.model, time.monotonic() - self._t0)
