"""How the sidecar orders work that takes time: short worker threads (``_Workers``),
a key's calls run in the order they came (``_KeyOrder``), and the mark of an answer
that comes later from a callback (``_LATER``)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Optional

from .._threads import NoThread, start_thread

log = logging.getLogger("proctable.serve")


class _Workers:
    """A client's own worker threads (at most ``limit``, started as needed) for the
    calls that take time: a client that sends a flood of them waits for its own
    answers, never delays another client's."""

    def __init__(self, name: str, limit: int = 4) -> None:
        self.name = name
        self.limit = limit
        self._lock = threading.Lock()
        self._jobs: collections.deque[tuple[Callable[[], None], str]] = collections.deque()
        self._threads = 0
        self._idle = 0
        self._pending = 0       # jobs submitted and not yet ended
        self._cond = threading.Condition(self._lock)
        self._ended = threading.Condition(self._lock)

    def submit(self, job: Callable[[], None], what: str) -> None:
        with self._lock:
            self._jobs.append((job, what))
            self._pending += 1
            if self._idle:
                self._cond.notify()
                return
            if self._threads >= self.limit:
                return  # a busy worker takes it next
            self._threads += 1
        try:
            start_thread(self._run, f"proctable-serve-{self.name}")
        except NoThread:
            with self._lock:
                self._threads -= 1
                if self._threads:
                    return  # the others take it
                self._jobs.pop()
                self._pending -= 1
            raise

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._jobs:
                    self._idle += 1
                    woke = self._cond.wait(30.0)
                    self._idle -= 1
                    if not woke and not self._jobs:
                        self._threads -= 1  # idle for long: end
                        return
                job, what = self._jobs.popleft()
            try:
                job()
            except BaseException:  # the job answers its own errors; this is a bug
                log.exception("serve: %s on %s", what, self.name)
            finally:
                with self._lock:
                    self._pending -= 1
                    if not self._pending:
                        self._ended.notify_all()

    def wait(self, timeout: float) -> bool:
        """Wait, at most timeout seconds, until every job submitted has ended
        (its answer queued): True if they all did."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._ended.wait(left)
            return True


class _KeyOrder:
    """Requests about one key that are no input of the supervisor's machine (``write``,
    ``resize``, ``signal``, ``tail``, ``members``) run one at a time, in the order
    they were read, each after every ``start`` or ``adopt`` of the key read before it
    was answered (docs/serve.md, "Ordering"). So bytes written in pipelined requests
    reach the command in order, and a ``write`` pipelined after its key's ``start``
    finds the command running. A ``stop`` or ``remove`` is no gate: it is fed to the
    machine as soon as it is read (stop always wins), so a later ``write`` finds the
    key stopping, and a later ``signal`` still reaches a process that takes its grace.

    A step waiting for a start holds no thread: it resumes from that start's future."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, collections.deque[Any]] = {}
        self._busy: set[str] = set()

    def gate(self, key: str, fut: Future[Any]) -> None:
        """A start or adopt of key was fed: later steps of key wait for fut."""
        with self._lock:
            if not fut.done():
                self._queues.setdefault(key, collections.deque()).append(fut)
        fut.add_done_callback(lambda _f: self._prune(key))

    def _prune(self, key: str) -> None:
        """Forget the gates that are done with nothing behind them (a key started and
        never written to holds nothing here)."""
        with self._lock:
            q = self._queues.get(key)
            if q is None or key in self._busy:
                return  # a runner pops them in its turn
            while q and isinstance(q[0], Future) and q[0].done():
                q.popleft()
            if not q:
                del self._queues[key]

    def run(self, key: str, step: Callable[[], None],
            submit: Callable[[Callable[[], None]], None],
            refuse: Callable[[BaseException], None]) -> None:
        """Run step on a worker (submit) in its turn; refuse(error) where none can start."""
        with self._lock:
            self._queues.setdefault(key, collections.deque()).append((step, submit, refuse))
            if key in self._busy:
                return
            self._busy.add(key)
        self._advance(key)

    def _advance(self, key: str) -> None:
        while True:
            with self._lock:
                q = self._queues.get(key)
                if not q:
                    self._queues.pop(key, None)
                    self._busy.discard(key)
                    return
                head = q[0]
                if isinstance(head, Future) and not head.done():
                    wait: Optional[Future[Any]] = head
                else:
                    wait = None
                    q.popleft()
            if wait is not None:
                wait.add_done_callback(lambda _f: self._advance(key))
                return  # resumed when it is done (at once if it is by now)
            if isinstance(head, Future):
                continue
            step, submit, refuse = head

            def turn(step: Callable[[], None] = step) -> None:
                try:
                    step()
                finally:
                    self._advance(key)
            try:
                submit(turn)
            except NoThread as exc:
                refuse(exc)  # answered with the error; the next step's turn
            else:
                return


class _Later:
    """A method's answer comes later, from a callback."""


_LATER = _Later()
