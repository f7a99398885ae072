"""What went wrong inside a supervisor itself: the faults its ``health`` lists.

A supervisor runs a few threads of its own (the timers, the dispatch of events,
the reader of owned output). None of them may end silently and leave the
supervisor half alive: each catches what fails in one of its turns, records it
here, logs it, and goes on with the next turn.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field

__all__ = ["Fault", "Faults"]

log = logging.getLogger("proctable.supervise")


@dataclass(frozen=True)
class Fault:
    """One failure inside a supervisor's own thread, and what it did next.

    ``thread`` is ``"timers"`` (restart delays and timeouts), ``"events"`` (the
    dispatch of events to ``on_event``), ``"output"`` (the reader of owned
    output) or ``"watcher"`` (the exit watcher); ``error`` is the exception;
    ``what`` says, for people, what failed and what was done about it; ``key``
    is the key it concerned, where one did; ``time`` when (``time.time()``).
    """

    thread: str
    error: BaseException
    what: str
    key: Hashable = None
    time: float = field(default_factory=time.time)

    def __str__(self) -> str:
        about = "" if self.key is None else f" (key {self.key!r})"
        return f"{self.thread}: {self.what}{about}: {self.error!r}"


class Faults:
    """The faults recorded so far: the last ``keep`` of them, and how many in all."""

    def __init__(self, keep: int = 64) -> None:
        self._lock = threading.Lock()
        self._last: collections.deque[Fault] = collections.deque(maxlen=keep)
        self.total = 0

    def add(self, fault: Fault) -> None:
        with self._lock:
            self._last.append(fault)
            self.total += 1
        log.error("supervisor: %s", fault, exc_info=fault.error)

    def snapshot(self) -> tuple[Fault, ...]:
        with self._lock:
            return tuple(self._last)
