"""Run calls in threads released at the same moment (the thread-safety tests of issue 21 item 2)."""
from __future__ import annotations

import threading
from typing import Callable, Sequence


def at_once(calls: Sequence[Callable[[], object]]) -> list:
    """Each call in its own thread, all started together behind a barrier; their results in order.
    An exception in any thread is raised here, after every thread has ended."""
    results: list = [None] * len(calls)
    errors: list = []
    barrier = threading.Barrier(len(calls))

    def work(k):
        try:
            barrier.wait()
            results[k] = calls[k]()
        except Exception as e:  # noqa: BLE001 - re-raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
