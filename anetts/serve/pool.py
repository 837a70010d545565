"""Model instances shared by requests: one instance per worker, each used by one request at a time,
with a bounded queue in front of them and a deadline on each request.

A request holds an instance from :meth:`ModelPool.acquire` until its last chunk is made (or until its
client leaves, or its time is up). The model's calls run in the pool's threads, one step at a time,
so the event loop serves other requests meanwhile. A request is refused at once when:

- every instance is busy and ``queue`` requests already wait (:class:`Busy`: 429 with Retry-After);
- once its input is planned (:class:`~anetts.runtime.planned.Planned`: Kokoro's phonemes, Fish's
  frames), its work would take longer than the request timeout at the speed this server has
  measured (:class:`TooLong`; :class:`SpeedEstimate`: a line through (units, seconds) of the warm-up's
  timed runs and of every completed request), or longer than the time still left after waiting
  (:class:`TimedOut`). A step that cannot be interrupted (one chunk through the model) could otherwise
  run a request far past its timeout. Planning counts the work the text turns into, not its length:
  a 300-digit number is 300 characters and thousands of phonemes.

A request waiting in the queue whose client disconnects leaves the queue (:class:`ClientGone`).
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Iterator


class Busy(Exception):
    def __init__(self, retry_after: int):
        super().__init__(f"all workers busy and the queue full; retry after {retry_after} s")
        self.retry_after = retry_after


class TimedOut(Exception):
    pass


class TooLong(Exception):
    """Work that cannot fit the request timeout at the measured speed (the message says how long)."""


class ClientGone(Exception):
    """The client disconnected while its request waited for an instance."""


_DONE = object()
_MEAN_WEIGHT = 0.2  # of the newest request in the running means


def _malloc_trim():
    """glibc's ``malloc_trim``, or None elsewhere (macOS's allocator hands pages back by itself)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()
TRIM_SLACK_BYTES = 256 << 20


class HeapTrim:
    """Hands freed heap pages back to the OS after a request that left the process larger than after
    the last trim by more than ``TRIM_SLACK_BYTES``. A long chunk's activations (hundreds of MB at a 30 s
    bucket) are freed into glibc's arenas and stay in the process, so RSS climbs to the largest request
    ever served (kokoro-tiny, 12 mixed requests in one process: 1,672 MB; trimmed after each: 958 MB).
    Not after every request: the next one faults its pages in again (+10-25 % on the next synthesis,
    measured in the same run), so only growth is trimmed."""

    def __init__(self):
        self.after_last: int | None = None

    def __call__(self) -> None:
        if _TRIM is None:
            return
        rss = _rss_bytes()
        if self.after_last is None or rss > self.after_last + TRIM_SLACK_BYTES:
            _TRIM(0)
            self.after_last = _rss_bytes()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:  # Linux (where _TRIM exists): pages resident is the second field
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class SpeedEstimate:
    """Seconds a request of ``units`` of planned work takes: ``a + b * units``, a least-squares line
    through running means of the timed runs (each new run weighs ``_MEAN_WEIGHT``). A line, not a
    rate: short requests cost mostly their fixed part, and a rate taken from them would refuse long
    ones that fit."""

    def __init__(self):
        self.n = 0
        self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, units: int, seconds: float) -> None:
        if units <= 0 or not math.isfinite(seconds) or seconds < 0:
            return
        w = 1.0 if self.n == 0 else _MEAN_WEIGHT
        self._x += w * (units - self._x)
        self._y += w * (seconds - self._y)
        self._xx += w * (units * units - self._xx)
        self._xy += w * (units * seconds - self._xy)
        self.n += 1

    def line(self) -> tuple[float, float]:
        """(seconds, seconds per character); (0, 0) before any run."""
        if self.n == 0:
            return 0.0, 0.0
        var = self._xx - self._x * self._x
        if var <= 1e-9 * max(1.0, self._xx):  # every run the same length: all of it per character
            return 0.0, self._y / self._x
        b = max(0.0, (self._xy - self._x * self._y) / var)
        return max(0.0, self._y - b * self._x), b

    def __call__(self, units: int) -> float:
        a, b = self.line()
        return a + b * units


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
        self.estimate = SpeedEstimate()  # model seconds for a request of so many units of planned work
        self.trim = HeapTrim()

    def _queue(self) -> asyncio.Queue:
        if self._free is None:  # bound to the running loop on first use
            self._free = asyncio.Queue()
            for inst in self.instances:
                self._free.put_nowait(inst)
        return self._free

    def retry_after(self) -> int:
        turns = (self.waiting + self.busy) / len(self.instances)
        return max(1, math.ceil(turns * self._mean_seconds))

    def calibrate(self, runs: list[tuple[int, float]]) -> None:
        """Take timed runs (planned units, seconds), e.g. the warm-up's, into the speed estimate."""
        for units, seconds in runs:
            self.estimate.observe(units, seconds)

    def check_fits(self, units: int, unit: str, left: float) -> None:
        """TooLong when ``units`` of work cannot fit the request timeout at the measured speed, TimedOut
        when they cannot fit the ``left`` seconds a request still has."""
        need = self.estimate(units)
        if need > self.timeout:
            a, b = self.estimate.line()
            raise TooLong(f"this input is {units} {unit} of speech, about {need:.0f} s of work at this server's measured "
                          f"speed ({a:.2f} s + {1000 * b:.3f} s per 1000 {unit}), more than its request timeout of "
                          f"{self.timeout:g} s; send less text per request")
        if need > left:
            raise TimedOut(f"a worker came free with {max(left, 0):.1f} s of the request timeout left, and this "
                           f"input needs about {need:.1f} s")

    async def acquire(self, deadline: float, receive: Callable[[], Awaitable[dict]] | None = None) -> "Slot":
        """An instance for one request until ``Slot.release()``: Busy, TimedOut or ClientGone (``receive``:
        the request's ASGI receive, read for the client's disconnect while it waits) when none comes."""
        free = self._queue()
        if free.empty() and self.waiting >= self.queue_limit:
            raise Busy(self.retry_after())
        self.waiting += 1
        get = asyncio.ensure_future(free.get())
        gone = asyncio.ensure_future(_disconnect(receive)) if receive is not None else None
        try:
            done, _ = await asyncio.wait({get, gone} - {None}, timeout=max(0.0, deadline - time.monotonic()),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.waiting -= 1
            if gone is not None:
                gone.cancel()
            if not get.done():
                get.cancel()
        if get not in done or get.cancelled():
            if get.done() and not get.cancelled():  # came free in the same instant: give it back
                free.put_nowait(get.result())
            if gone is not None and gone in done:
                raise ClientGone("the client disconnected while its request waited for a worker")
            raise TimedOut(f"no worker became free within the request timeout of {self.timeout:g} s")
        self.busy += 1
        slot = Slot(self, get.result(), deadline)
        if gone is not None and gone in done:
            slot.release()
            raise ClientGone("the client disconnected while its request waited for a worker")
        return slot

    def _give_back(self, inst, held_seconds: float, units: int, completed: bool) -> None:
        self._mean_seconds = (1 - _MEAN_WEIGHT) * self._mean_seconds + _MEAN_WEIGHT * held_seconds
        if completed:
            self.estimate.observe(units, held_seconds)
        self.trim()
        self.busy -= 1
        self._queue().put_nowait(inst)


async def _disconnect(receive: Callable[[], Awaitable[dict]]) -> None:
    """Returns when the client has gone (the request's body has been read by then)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Slot:
    """One held instance: `call` runs a function of it in the pool's thread; `steps` walks an
    iterator it made one item at a time there. The instance goes back to the pool when the last
    call that touches it has finished, even if the request stopped waiting for that call."""

    def __init__(self, pool: ModelPool, model, deadline: float):
        self.pool, self.model, self.deadline = pool, model, deadline
        self.units = 0  # the planned work of this request, once planned
        self._running: asyncio.Future | None = None
        self._released = False
        self._completed = False
        self._t0 = time.monotonic()

    def _timed_out(self) -> TimedOut:
        return TimedOut(f"the request took longer than its timeout of {self.pool.timeout:g} s")

    async def call(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        if time.monotonic() > self.deadline:
            raise self._timed_out()
        loop = asyncio.get_running_loop()
        self._running = loop.run_in_executor(self.pool.executor, lambda: fn(*args, **kwargs))
        try:
            return await asyncio.shield(self._running)
        finally:
            if self._running.done():
                self._running = None

    def fits(self, planned) -> None:
        """Check a request's planned work (``planned.units`` of ``planned.unit``) against the time it has."""
        self.pool.check_fits(planned.units, planned.unit, self.deadline - time.monotonic())
        self.units = planned.units

    async def steps(self, make: Callable[[], Iterator], stop: Callable[[], Awaitable[bool]] | None = None):
        """Items of the iterator ``make()`` returns, each made in the pool's thread. A next item is not
        begun when the last one's time would carry the request past its deadline (TimedOut), or when
        ``stop()`` (the client's disconnect) says so (ClientGone). An item whose ``is_last`` is true ends
        the walk: nothing is left to begin, so no time is checked for it."""
        it = await self.call(make)
        last = 0.0
        while True:
            if time.monotonic() + last > self.deadline:
                raise self._timed_out()
            if stop is not None and await stop():
                raise ClientGone("the client disconnected while its request was being made")
            t0 = time.monotonic()
            item = await self.call(next, it, _DONE)
            last = time.monotonic() - t0
            if item is _DONE:
                self._completed = True
                return
            if getattr(item, "is_last", False):
                self._completed = True
                yield item
                return
            yield item

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        running = self._running

        def give_back(_=None):
            self.pool._give_back(self.model, time.monotonic() - self._t0, self.units, self._completed)

        if running is not None and not running.done():  # the thread is still using the model
            running.add_done_callback(give_back)
        else:
            give_back()
