"""The exit watcher: one thread, epoll over pidfds (or a shared /proc tick where
there are none), each watch a future resolved once; the watcher ``wait_exit``
and ``terminate`` share; ``wait_exit`` for asyncio."""

from __future__ import annotations

import concurrent.futures
import math
import os
import select
import threading
import time
from typing import Optional

from .. import _ended, _pidfd
from .._status import ExitStatus
from .._threads import NoThread, start_thread
from ..errors import NoSuchProcess, OutOfFds, ProctableError, WatcherClosed
from ._sources import (
    _LATER,
    _RUNNING,
    ExitFuture,
    _from_popen,
    _Outcome,
    _status_wake_fd,
    _Verdict,
    _Watch,
    examine,
)
from ._target import Target, _AsyncChild, _pin, _resolve_target, _seconds

_MAX_RECHECK = 1.0  # the longest pause between looks at an exit whose status is still to come
_POLL_BUDGET = 0.02  # the share of a core /proc polling may use (many watches, no pidfds)


class _Poller:
    """epoll where there is one (Linux), else poll: the fds that wake the watcher."""

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._poll = select.poll() if self._epoll is None else None

    def register(self, fd: int) -> None:
        if self._epoll is not None:
            self._epoll.register(fd, select.EPOLLIN)
        else:
            assert self._poll is not None
            self._poll.register(fd, select.POLLIN)

    def unregister(self, fd: int) -> None:
        if self._epoll is not None:
            self._epoll.unregister(fd)
        else:
            assert self._poll is not None
            self._poll.unregister(fd)

    def wait(self, timeout: Optional[float]) -> list[int]:
        if self._epoll is not None:
            return [fd for fd, _ in self._epoll.poll(-1 if timeout is None else timeout)]
        assert self._poll is not None
        ms = None if timeout is None else math.ceil(timeout * 1000)
        return [fd for fd, _ in self._poll.poll(ms)]

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()


class ExitWatcher:
    """Watches processes exit, without depending on their runtime, in one thread.

    ``watch(target)`` pins the target's identity, opens a pidfd for it, and
    returns an :class:`ExitFuture`. One background thread waits with epoll on
    every watched pidfd (no thread per process, no polling); when one turns
    readable the status is read from the first source that has it: the Popen's
    own returncode, ``waitid(WNOWAIT)`` for the caller's own child, the zombie's
    field 52, then the exit info pidfs keeps once someone reaped it. Nothing is
    reaped unless ``reap=True`` is passed for the caller's own child.

    Without pidfds (an old kernel, macOS, or ``PROCTABLE_DISABLE=pidfd``) the
    thread looks at /proc every ``poll_interval`` seconds instead, one wake-up for
    all such watches, stretched so that polling uses at most 2% of a core.

    Use it as a context manager, or call :meth:`close`: pending futures are
    cancelled, and new watches are refused with :class:`WatcherClosed`.
    """

    def __init__(self, poll_interval: float = 0.05) -> None:
        self._poll_interval = _seconds(poll_interval, "poll_interval")
        if self._poll_interval <= 0:
            raise ValueError("poll_interval must be > 0")
        self.features = _pidfd.features()
        self._lock = threading.Lock()
        self._closed = False
        self._finished = False  # the thread cleaned up (or never ran)
        self._by_fd: dict[int, _Watch] = {}
        self._polled: set[_Watch] = set()  # no pidfd: looked at in /proc on each tick
        self._tick_due = 0.0
        self._later: set[_Watch] = set()  # exited, status still to come: each on its own timer
        self._dropped: list[_Watch] = []
        self._poller: Optional[_Poller] = None
        self._wake_r = self._wake_w = -1
        self._thread: Optional[threading.Thread] = None

    # -- public --------------------------------------------------------------

    def watch(self, target: Target, reap: bool = False) -> ExitFuture:
        """A future that resolves once, when target exits, with its ExitStatus.

        target is a pid, an :class:`Identity`, a ``subprocess.Popen`` or an
        ``asyncio.subprocess.Process``. A target that is gone or reused already
        resolves at once with :class:`NoSuchProcess`; an exit whose status no
        source can give fails with :class:`ExitUnknown`. With ``reap=True`` the
        watcher reaps the caller's own child once it has the status (a Popen
        through ``Popen.poll()``, so its returncode is set; an asyncio Process is
        left to asyncio, which reaps it).

        Each watch holds one pidfd until it resolves: where the process has no fd
        left, ``watch()`` raises :class:`OutOfFds` (an ``OSError``, EMFILE, that
        names the limit) and takes nothing; the watches taken before still resolve.
        """
        pid, start_time, handle, popen = _resolve_target(target)
        if not isinstance(reap, bool):
            raise TypeError(f"reap must be a bool, not {type(reap).__name__}")
        if self._closed:
            raise WatcherClosed("this ExitWatcher is closed: it takes no new watches")
        fut = ExitFuture(pid)
        if popen is not None:
            done = _from_popen(popen)
            if done is not None:
                self._resolve(fut, done)
                return fut
        try:
            pinned = _pin(pid, start_time, handle, self.features.pidfd)
        except OutOfFds:
            raise  # not taken: say so now (the watches taken before still resolve)
        except ProctableError as e:
            done = None if popen is None else _from_popen(popen)  # reaped meanwhile?
            if done is not None:
                self._resolve(fut, done)
            elif isinstance(popen, _AsyncChild) and isinstance(e, NoSuchProcess):
                # asyncio reaped it already and sets its returncode when its loop
                # runs next: look again later (bounded) instead of failing now.
                return self._add(_Watch(fut, pid, None, None, popen=popen, reap=reap))
            else:
                fut.set_exception(e)
            return fut
        fut.identity = pinned.identity(pid)
        return self._add(_Watch(fut, pid, pinned.start_time, pinned.fd, popen=popen, reap=reap))

    @property
    def pending(self) -> int:
        """How many watches are waiting for an exit."""
        with self._lock:
            return len(self._by_fd) + len(self._polled) + len(self._later)

    @property
    def poll_interval(self) -> float:
        """Seconds between looks at /proc for a watch without a pidfd."""
        return self._poll_interval

    @property
    def thread_id(self) -> Optional[int]:
        """The native id of the watcher's thread (None before the first watch)."""
        t = self._thread
        return None if t is None else t.native_id

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread; pending futures are cancelled. Waits at most timeout seconds."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is None:
                self._finished = True
            else:
                self._wake_locked()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def __enter__(self) -> ExitWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.pending} pending"
        return f"<ExitWatcher {state}>"

    # -- registration (any thread) --------------------------------------------

    def _add(self, w: _Watch) -> ExitFuture:
        """Answer an exit that happened already here; else hand w to the thread."""
        outcome: _Outcome = _RUNNING
        try:
            if w.fd is None or _ended.pidfd_ended(w.fd):
                outcome = examine(w, self.features)
        except BaseException:
            self._close_fd(w)
            raise
        if isinstance(outcome, _Verdict):
            self._close_fd(w)
            self._resolve(w.fut, outcome)
            return w.fut
        if w.fd is not None and outcome == _RUNNING and w.popen is not None:
            w.wake = _status_wake_fd(w.popen)
        with self._lock:
            if self._closed:
                self._close_fd(w)
                raise WatcherClosed("this ExitWatcher is closed: it takes no new watches")
            try:
                self._start_locked()
            except NoThread:
                self._close_fd(w)
                raise
            assert self._poller is not None
            if w.fd is not None and outcome == _RUNNING:
                for fd in (w.fd, w.wake):
                    if fd is not None:
                        self._by_fd[fd] = w
                        self._poller.register(fd)
            else:
                self._schedule_locked(w, outcome)
                self._wake_locked()  # the thread's next timeout may be sooner now
        w.fut.add_done_callback(lambda _f: self._on_done(w))
        return w.fut

    def _start_locked(self) -> None:
        if self._thread is not None:
            return
        self._poller = _Poller()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller.register(self._wake_r)
        try:
            self._thread = start_thread(self._run, "proctable-exit-watcher")
        except NoThread:
            # Nothing is left half set up: the next watch tries again.
            self._poller.close()
            self._poller = None
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            self._wake_r = self._wake_w = -1
            raise

    def _schedule_locked(self, w: _Watch, outcome: _Outcome) -> None:
        if outcome == _LATER:
            # An exit whose status is still to come: look again, less and less often.
            self._polled.discard(w)
            w.delay = min(max(w.delay * 2, 0.01), _MAX_RECHECK)
            w.due = time.monotonic() + w.delay
            self._later.add(w)
        elif w not in self._polled:
            # No pidfd: joins the shared /proc tick (one wake-up for all of them).
            if not self._polled:
                self._tick_due = time.monotonic() + self._poll_interval
            self._polled.add(w)

    def _wake_locked(self) -> None:
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:
                pass  # a wake-up is pending already

    def _on_done(self, w: _Watch) -> None:
        # A cancelled future (wait_exit's timeout, a caller's cancel): drop its watch.
        if w.fut.cancelled():
            with self._lock:
                if not self._finished:
                    self._dropped.append(w)
                    self._wake_locked()

    # -- the thread -----------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closed:
                        break
                    dues = [w.due for w in self._later]
                    if self._polled:
                        dues.append(self._tick_due)
                due = min(dues, default=None)
                timeout = None if due is None else max(0.0, due - time.monotonic())
                assert self._poller is not None
                fds = self._poller.wait(timeout)
                with self._lock:
                    if self._is_closed():  # close() may have run while we waited
                        break
                    dropped, self._dropped = self._dropped, []
                    ready = list(dict.fromkeys(self._by_fd[fd] for fd in fds
                                               if fd in self._by_fd))
                    now = time.monotonic()
                    ready += [w for w in self._later if w.due <= now]
                    tick = list(self._polled) if self._polled and self._tick_due <= now else []
                if self._wake_r in fds:
                    self._drain()
                for w in dropped:
                    self._forget(w)
                for w in ready:
                    if not w.fut.done():
                        self._step(w)
                if tick:
                    self._tick(tick)
        finally:
            self._shutdown()

    def _tick(self, polled: list[_Watch]) -> None:
        """One look at /proc for every watch without a pidfd.

        The next tick comes after poll_interval, or later where this one cost more
        CPU, so that polling stays within _POLL_BUDGET of a core however many watch.
        """
        cpu0 = time.thread_time()
        for w in polled:
            if not w.fut.done():
                self._step(w)
        cost = time.thread_time() - cpu0
        with self._lock:
            self._tick_due = time.monotonic() + max(self._poll_interval, cost / _POLL_BUDGET)

    def _is_closed(self) -> bool:
        return self._closed

    def _drain(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _step(self, w: _Watch) -> None:
        try:
            outcome = examine(w, self.features)
        except Exception as e:  # the thread must live on: the future carries the error
            outcome = _Verdict(error=e)
        if isinstance(outcome, _Verdict):
            self._forget(w)
            self._resolve(w.fut, outcome)
            return
        with self._lock:
            # Exited, status still to come: a readable pidfd would wake us forever.
            self._unregister_locked(w)
            self._later.discard(w)
            self._schedule_locked(w, outcome)

    def _unregister_locked(self, w: _Watch) -> None:
        for fd in (w.fd, w.wake):
            if fd is not None and self._by_fd.get(fd) is w:
                del self._by_fd[fd]
                assert self._poller is not None
                self._poller.unregister(fd)

    def _forget(self, w: _Watch) -> None:
        with self._lock:
            self._unregister_locked(w)
            self._polled.discard(w)
            self._later.discard(w)
        self._close_fd(w)

    @staticmethod
    def _close_fd(w: _Watch) -> None:
        fd, w.fd = w.fd, None
        wake, w.wake = w.wake, None
        for f in (fd, wake):
            if f is not None:
                os.close(f)

    def _shutdown(self) -> None:
        with self._lock:
            self._closed = True
            self._finished = True
            left = list(dict.fromkeys([*self._by_fd.values(), *self._polled, *self._later]))
            self._by_fd.clear()
            self._polled.clear()
            self._later.clear()
            self._dropped.clear()
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1
            if self._poller is not None:
                self._poller.close()
        for w in left:
            self._close_fd(w)
            w.fut.cancel()

    @staticmethod
    def _resolve(fut: ExitFuture, verdict: _Verdict) -> None:
        """Settle the future once; a future cancelled meanwhile stays cancelled."""
        try:
            if verdict.error is not None:
                fut.set_exception(verdict.error)
            else:
                fut.source = verdict.source
                fut.set_result(verdict.status)  # type: ignore[arg-type]
        except concurrent.futures.InvalidStateError:
            pass


_default: Optional[ExitWatcher] = None
_default_lock = threading.Lock()


def _default_watcher() -> ExitWatcher:
    """The watcher wait_exit() and terminate() share, started on first use."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = ExitWatcher()
        return _default


def _reset_default_watcher() -> None:
    """Close the shared watcher; the next use makes a new one (reads PROCTABLE_DISABLE anew)."""
    global _default
    with _default_lock:
        old, _default = _default, None
    if old is not None:
        old.close()


def _after_fork_in_child() -> None:
    # The watcher's thread does not exist in a forked child: start afresh there.
    global _default, _default_lock
    _default = None
    _default_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


async def wait_exit(target: Target, timeout: Optional[float] = None) -> ExitStatus:
    """Wait in asyncio for target to exit; its ExitStatus.

    Raises ``asyncio.TimeoutError`` (``TimeoutError``) after timeout seconds, and
    the watch ends with it; :class:`NoSuchProcess` when the target is gone or
    reused already; :class:`ExitUnknown` where its status cannot be known.
    """
    if timeout is not None:
        timeout = _seconds(timeout, "timeout")
    fut = _default_watcher().watch(target)
    try:
        import asyncio  # noqa: PLC0415 - import proctable does not load it

        return await asyncio.wait_for(asyncio.wrap_future(fut), timeout)
    finally:
        fut.cancel()  # a no-op once resolved; else the watch ends here

