"""Fork on a thread that lasts as long as this process (``PR_SET_PDEATHSIG``'s "parent").

A scan-mode spawn has no reaper of its own between us and the command: if this
process is SIGKILLed, nothing of ours is left to end the command. The kernel can:
the lineage's helper (``proctable-lineage exec``) asks for SIGKILL on its parent's
death before it execs the command (the setting survives exec, except of a
set-user-ID or file-capability program, which clears it).

The kernel's "parent" is the *thread* that forked the child: the signal comes
when that thread ends, not only when the process does. The supervisor starts
commands from short-lived worker threads, so the fork must happen on a thread
that lasts as long as the process: the main thread, or one daemon thread of this
module that never ends (a daemon thread dies only with the process).
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, Optional, TypeVar

from .._threads import start_thread

__all__ = ["on_lasting_thread"]

T = TypeVar("T")


class _Lasting:
    """One daemon thread that runs what it is given, one at a time, and never ends."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        # NoThread (a ProctableError that names RLIMIT_NPROC) where none can start,
        # not a bare RuntimeError; nothing is kept, so the next spawn tries again.
        self.thread = start_thread(self._run, "proctable-lineage-spawner")

    def _run(self) -> None:
        while True:
            self._one(*self.jobs.get())

    @staticmethod
    def _one(fn: Callable[[], Any], fut: Future[Any]) -> None:
        # A frame of its own: nothing of a job (its Popen, its lineage) stays
        # referenced by this thread while it waits for the next one.
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn())
        except BaseException as exc:  # handed to the caller, who raises it
            fut.set_exception(exc)


_lasting: Optional[_Lasting] = None
_lasting_lock = threading.Lock()


def on_lasting_thread(fn: Callable[[], T]) -> T:
    """fn() on a thread that lives as long as this process (the main thread, or
    this module's spawner thread), so that a child it forks gets its parent-death
    signal only when the process dies. As bounded as fn itself (a Popen: until
    the child has exec'd, or failed to). NoThread where the spawner thread is
    needed and cannot start."""
    global _lasting
    if threading.current_thread() is threading.main_thread():
        return fn()
    with _lasting_lock:
        if _lasting is None:
            _lasting = _Lasting()
        lasting = _lasting
    fut: Future[T] = Future()
    lasting.jobs.put((fn, fut))
    return fut.result()


def _after_fork_in_child() -> None:
    global _lasting, _lasting_lock
    _lasting = None  # its thread is the parent's: a child starts its own
    _lasting_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
