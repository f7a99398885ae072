"""Start a child that the kernel kills when this process dies (``PR_SET_PDEATHSIG``).

A scan-mode spawn has no reaper of its own between us and the command: if this
process is SIGKILLed, nothing of ours is left to end the command. The kernel can:
the child asks for SIGKILL on its parent's death, in a ``preexec_fn`` between fork
and exec (the setting survives exec, except of a set-user-ID or file-capability
program, which clears it).

The kernel's "parent" is the *thread* that forked the child: the signal comes
when that thread ends, not only when the process does. The supervisor starts
commands from short-lived worker threads, so the fork must happen on a thread
that lasts as long as the process: the main thread, or one daemon thread of this
module that never ends (a daemon thread dies only with the process).

The preexec function does only a prctl and a getppid through ctypes, with the
function looked up before any fork: nothing in it needs a lock another thread
may have held at the fork.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import threading
from concurrent.futures import Future
from typing import Any, Callable, Optional, TypeVar

from .._threads import start_thread

__all__ = ["dies_with_us", "on_lasting_thread"]

PR_SET_PDEATHSIG = 1

T = TypeVar("T")


def _load_prctl() -> Optional[Any]:
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal to ask for
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                   ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


_prctl = _load_prctl()  # looked up now: the child after a fork must not need dlsym


def dies_with_us(then: Optional[Callable[[], object]] = None) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` that has the child killed (SIGKILL) when this process dies,
    then calls ``then`` (the caller's own preexec_fn); just ``then`` where the
    kernel has no parent-death signal."""
    prctl = _prctl
    if prctl is None:
        if then is None:
            return None

        def only_then() -> None:
            then()

        return only_then
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # best effort: no error to raise
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)  # we died before it took effect
        if then is not None:
            then()

    return preexec


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
