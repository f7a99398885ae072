"""The supervisor's timer thread: one heap of deadlines (timeouts, restart delays,
a fresh command's wait), each fired once unless cancelled; a timer that fails is
a fault of the supervisor's, never a thread that dies silently."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Hashable
from typing import Callable, Optional

from .._threads import start_thread

log = logging.getLogger("proctable.supervise")


class _Timers:
    """One thread for every key's timers; firing only calls ``fire(key, ticket)``.

    A cancelled timer leaves the heap at once in the cheap case, and otherwise by
    a compaction as soon as cancelled entries are half of it: a supervisor that
    starts and stops keys with long timeouts all day keeps only its live timers.

    The thread never ends of a failure: what fails in a turn (or in firing one
    timer) goes to ``fault(error, key)`` and the next turn comes. Its waits are at
    most ``_LONGEST_WAIT``, so no due time, however far, can break the wait.
    """

    _COMPACT_FROM = 16  # below this many cancelled entries a compaction is not worth it
    _LONGEST_WAIT = 3600.0  # far below threading.TIMEOUT_MAX; the thread wakes hourly at most

    def __init__(self, fire: Callable[[Hashable, int], None],
                 fault: Optional[Callable[[BaseException, Hashable], None]] = None) -> None:
        self._fire = fire
        self._fault = fault or _log_timer_fault
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Hashable, int]] = []
        self._ids: dict[tuple[Hashable, int], int] = {}  # live timers: -> their entry's n
        self._stale = 0  # cancelled entries still in the heap
        self._seq = itertools.count()
        self._closed = False
        self._thread = start_thread(self._run, "proctable-supervisor-timers")

    def __len__(self) -> int:
        """The timers set and not yet fired or cancelled."""
        with self._cond:
            return len(self._ids)

    @property
    def entries(self) -> int:
        """The heap's size (live timers, plus cancelled ones not yet compacted away)."""
        with self._cond:
            return len(self._heap)

    @property
    def running(self) -> bool:
        """The thread runs (or was closed): false only if it ended of itself."""
        return self._closed or self._thread.is_alive()

    def set(self, key: Hashable, ticket: int, delay: float) -> None:
        with self._cond:
            n = next(self._seq)
            self._ids[(key, ticket)] = n
            heapq.heappush(self._heap, (time.monotonic() + delay, n, key, ticket))
            self._cond.notify()

    def cancel(self, key: Hashable, ticket: int) -> None:
        with self._cond:
            n = self._ids.pop((key, ticket), None)
            if n is None:
                return
            self._stale += 1
            heap = self._heap
            if not self._ids:
                heap.clear()
                self._stale = 0
            elif heap[0][1] == n:  # the next one due: cheap to drop now, with what follows it
                while heap and self._ids.get((heap[0][2], heap[0][3])) != heap[0][1]:
                    heapq.heappop(heap)
                    self._stale -= 1
            elif self._stale >= self._COMPACT_FROM and 2 * self._stale >= len(heap):
                self._heap = [e for e in heap if self._ids.get((e[2], e[3])) == e[1]]
                heapq.heapify(self._heap)
                self._stale = 0
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        pause = 0.0
        while True:
            try:
                due = self._next_due()
            except Exception as exc:  # said, and the next turn comes
                self._fault(exc, None)
                pause = min(max(pause * 2, 0.01), 1.0)  # a failure that repeats must not spin
                with self._cond:
                    if not self._closed:
                        self._cond.wait(pause)
                continue
            pause = 0.0
            if due is None:
                return
            for key, ticket in due:
                try:
                    self._fire(key, ticket)
                except Exception as exc:  # keep the other keys' timers going
                    self._fault(exc, key)

    def _next_due(self) -> Optional[list[tuple[Hashable, int]]]:
        """Wait for the next timers due and take them off the heap; None once closed."""
        due: list[tuple[Hashable, int]] = []
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                heap = self._heap
                while heap and heap[0][0] <= now:
                    _, n, key, ticket = heapq.heappop(heap)
                    if self._ids.get((key, ticket)) != n:
                        self._stale = max(0, self._stale - 1)  # cancelled
                    else:
                        del self._ids[(key, ticket)]
                        due.append((key, ticket))
                if due:
                    return due
                self._cond.wait(None if not heap
                                else min(heap[0][0] - now, self._LONGEST_WAIT))
        return None


def _log_timer_fault(exc: BaseException, key: Hashable) -> None:
    log.error("supervisor timers: %s", "a turn failed" if key is None
              else f"firing a timer of {key!r} failed", exc_info=exc)
