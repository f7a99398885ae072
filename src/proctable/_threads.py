"""Starting the package's own threads, with a clear error where none can start.

A thread can fail to start where the process reached RLIMIT_NPROC (threads count
toward it) or where a sandbox answers clone3 with EPERM (glibc falls back to
clone only on ENOSYS): Python then raises a bare RuntimeError. Every thread of
proctable starts here, so the caller gets a ProctableError that says why.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

from .errors import NoThread

__all__ = ["NoThread", "Workers", "start_thread"]

log = logging.getLogger("proctable")


def start_thread(target: Callable[..., Any], name: str, *args: Any) -> threading.Thread:
    """Start a daemon thread running target(*args); NoThread if the host refuses."""
    t = threading.Thread(target=target, args=args, name=name, daemon=True)
    try:
        t.start()
    except RuntimeError as exc:
        raise NoThread(f"cannot start the thread {name!r}: {exc} (the process reached "
                       "RLIMIT_NPROC, or a sandbox denies clone3)") from None
    return t


class _Slot:
    """An idle worker's mailbox: ``ready`` is released (by any thread) with a job in it."""

    __slots__ = ("job", "ready")

    def __init__(self) -> None:
        self.job: Optional[tuple[Callable[..., Any], str, tuple[Any, ...]]] = None
        self.ready = threading.Lock()
        self.ready.acquire()


class Workers:
    """Threads kept a while after their job, for the next one.

    :meth:`run` hands a job to a worker that is idle, or starts a new thread for it:
    a job never waits for a busy worker, so jobs of different callers never wait on
    each other (as with a thread per job), and a burst of jobs starts as many threads
    as it needs. A worker idle for ``idle_seconds`` ends. Handing a job to an idle
    worker costs a lock release, where starting a thread costs a clone and a wait
    for the new thread to run (``Thread.start`` waits for it).
    """

    def __init__(self, idle_name: str, idle_seconds: float = 2.0) -> None:
        self.idle_name = idle_name
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._idle: list[_Slot] = []
        self._closed = False

    def run(self, target: Callable[..., Any], name: str, *args: Any) -> None:
        """Run target(*args) on a thread named name; NoThread if none is idle and no
        new one can start (then nothing runs it)."""
        job = (target, name, args)
        with self._lock:
            if self._idle:
                slot = self._idle.pop()
                slot.job = job
                slot.ready.release()
                return
        start_thread(self._work, name, job)

    @property
    def idle(self) -> int:
        """How many workers wait for a job now."""
        with self._lock:
            return len(self._idle)

    def close(self) -> None:
        """Idle workers end now, busy ones after their job."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for slot in idle:
            slot.ready.release()  # with no job: it ends

    def _work(self, first: tuple[Callable[..., Any], str, tuple[Any, ...]]) -> None:
        me = threading.current_thread()
        slot = _Slot()
        job: Optional[tuple[Callable[..., Any], str, tuple[Any, ...]]] = first
        while job is not None:
            target, me.name, args = job
            try:
                target(*args)
            except BaseException:  # a job answers its own errors; this is a bug of ours
                log.exception("%s failed", me.name)
            me.name = self.idle_name
            with self._lock:
                if self._closed:
                    return
                self._idle.append(slot)
            if not slot.ready.acquire(timeout=self.idle_seconds):
                with self._lock:
                    if slot in self._idle:  # idle for long: end
                        self._idle.remove(slot)
                        return
                # run() took this slot just now: its job is there (ready was released
                # under the lock, before we could take it).
                slot.ready.acquire()
            job, slot.job = slot.job, None
