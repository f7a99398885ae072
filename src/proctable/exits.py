"""Exits: what happened to a process, read without reaping it.

This module holds the probe (one read of /proc/<pid>/stat, decoded with the
cases where field 52 lies told apart), the exit watcher (one thread, epoll over
pidfds, sources that do not depend on the runtime), ``wait_exit`` for asyncio,
and ``terminate``, whose every wait is bounded.
"""

from __future__ import annotations

import concurrent.futures
import enum
import math
import os
import select
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Protocol, Union

from . import _ended, _pidfd
from . import _lowlevel as _ll
from ._aio import is_asyncio_process
from ._fdwait import readable
from ._status import ExitStatus, decode_wait_status
from ._threads import NoThread, start_thread
from .errors import (
    AccessDenied,
    ExitUnknown,
    NoSuchProcess,
    OutOfFds,
    ProctableError,
    WatcherClosed,
)
from .table import Identity, Proc, _has_pidfs, read

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "ExitFuture",
    "ExitStatus",
    "ExitWatcher",
    "Probe",
    "ProbeState",
    "classify",
    "exit_probe",
    "terminate",
    "wait_exit",
    "zombie_exit",
]


class ProbeState(str, enum.Enum):
    """What one look at a pid found."""

    RUNNING = "running"
    """Alive and not stopped (R, S, D, I, ...)."""
    STOPPED = "stopped"
    """Stopped by a signal or a tracer: field 52 holds the stop signal, not an exit."""
    EXITED = "exited"
    """A zombie whose exit status is known (``Probe.status``)."""
    LEADER_EXITED = "leader_exited"
    """The main thread is a zombie but other threads still run: not an exit."""
    MASKED = "masked"
    """A zombie whose status the kernel hides from this reader (ptrace rules)."""
    GONE = "gone"
    """No process holds the pid (it was reaped, or never existed)."""
    REUSED = "reused"
    """The pid now names a process with another start time."""

    def __str__(self) -> str:
        return self.value


class Probe(NamedTuple):
    """The result of :func:`exit_probe`: ``status`` is set only for ``EXITED``."""

    state: ProbeState
    status: Optional[ExitStatus] = None
    proc: Optional[Proc] = None


def classify(row: Optional[Proc], start_time: Optional[int] = None) -> Probe:
    """The pure decision behind :func:`exit_probe`, over one row (or None)."""
    if row is None:
        return Probe(ProbeState.GONE)
    if start_time is not None and row.start_time != start_time:
        return Probe(ProbeState.REUSED, None, row)
    state = row.state
    if state in _ended.ENDED_STATES and not _ended.row_ended(state, row.num_threads):
        return Probe(ProbeState.LEADER_EXITED, None, row)  # threads still run: not ended
    if state == "Z":
        if row.raw_exit_code is None or row.exit_masked:
            return Probe(ProbeState.MASKED, None, row)
        status = row.exit
        if status is None:  # a value that is no exit status: do not guess
            return Probe(ProbeState.MASKED, None, row)
        return Probe(ProbeState.EXITED, status, row)
    if state in ("T", "t"):
        return Probe(ProbeState.STOPPED, None, row)
    if state in ("X", "x"):
        return Probe(ProbeState.GONE, None, row)
    return Probe(ProbeState.RUNNING, None, row)


def exit_probe(pid: int, start_time: Optional[int] = None) -> Probe:
    """Look at pid once, never reaping it, and say what state it is in.

    ``Probe.proc`` is the row it read, without memory figures (rss and vms are
    None: the probe reads the stat line only, which is what an exit needs).

    ``EXITED`` (with ``status``) only when all hold: the process is a zombie
    (state Z), it has one thread left, its start time matches ``start_time``
    (when given), and the kernel lets this reader see field 52. Otherwise
    ``RUNNING``, ``STOPPED``, ``LEADER_EXITED``, ``MASKED``, ``GONE`` or ``REUSED``.
    """
    _ll.check_pid(pid)
    if start_time is not None and (isinstance(start_time, bool) or not isinstance(start_time, int)):
        raise TypeError(f"start_time must be an int, not {type(start_time).__name__}")
    if start_time is not None and start_time < 0:  # clock ticks since boot
        raise ValueError(f"start_time must be >= 0 (clock ticks since boot), not {start_time}")
    return classify(read(pid, memory=False), start_time)


def zombie_exit(pid: int, start_time: Optional[int] = None) -> Optional[ExitStatus]:
    """The exit status of pid where :func:`exit_probe` says ``EXITED``, else None."""
    return exit_probe(pid, start_time).status


# decode_wait_status is re-exported here: exits are where users look for it.
__all__ += ["decode_wait_status"]


# --- the exit watcher ---------------------------------------------------------

Target = Union[int, Identity, "subprocess.Popen[Any]", "asyncio.subprocess.Process"]
"""What a watch or a terminate names: a pid, an Identity, a subprocess.Popen, or an
asyncio.subprocess.Process."""


class _Child(Protocol):
    """What the watcher and terminate use of the caller's own child object."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> Optional[int]: ...

    def poll(self) -> Optional[int]: ...


class _AsyncChild:
    """An asyncio.subprocess.Process seen as a Popen whose runtime reaps it.

    asyncio's child watcher reaps it and then sets its returncode (in the loop), so
    its sources are the returncode, waitid(WNOWAIT) while it is unreaped, the zombie,
    and pidfd exit info after asyncio reaped it. ``poll()`` never reaps: a reap here
    would steal the exit from asyncio.
    """

    __slots__ = ("_proc",)

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> Optional[int]:
        return self._proc.returncode

    def poll(self) -> Optional[int]:
        return self._proc.returncode

SOURCE_POPEN = "popen"
"""The Popen's own returncode (its runtime reaped it already)."""
SOURCE_WAITID = "waitid"
"""waitid(WEXITED | WNOWAIT) on the caller's own child: the status, not reaped."""
SOURCE_ZOMBIE = "zombie"
"""Field 52 of the zombie's /proc/<pid>/stat (see exit_probe)."""
SOURCE_PIDFD_INFO = "pidfd_info"
"""ioctl(PIDFD_GET_INFO) with PIDFD_INFO_EXIT, after someone else reaped it."""

_MAX_RECHECK = 1.0  # the longest pause between looks at an exit whose status is still to come
_POLL_BUDGET = 0.02  # the share of a core /proc polling may use (many watches, no pidfds)


class ExitFuture(concurrent.futures.Future[ExitStatus]):
    """The future of one watch: resolves once, with the ExitStatus or an error.

    ``identity`` is the process pinned when the watch began (None where its start
    time could not be read); ``source`` names what gave the status.
    """

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.identity: Optional[Identity] = None
        self.source: Optional[str] = None


def _resolve_target(
    target: object,
) -> tuple[int, Optional[int], Optional[int], Optional[_Child]]:
    """(pid, start_time, handle, child) of a target; refuse anything else before any call."""
    if isinstance(target, Identity):
        pid = _ll.check_pid(target.pid)
        st, handle = target.start_time, target.handle
        if isinstance(st, bool) or not isinstance(st, int):
            raise TypeError(f"Identity.start_time must be an int, not {type(st).__name__}")
        if handle is not None and (isinstance(handle, bool) or not isinstance(handle, int)):
            raise TypeError(f"Identity.handle must be an int or None, not {type(handle).__name__}")
        return pid, st, handle, None
    if isinstance(target, subprocess.Popen):
        return _ll.check_pid(target.pid), None, None, target
    if is_asyncio_process(target):
        return _ll.check_pid(target.pid), None, None, _AsyncChild(target)
    if isinstance(target, bool) or not isinstance(target, int):
        raise TypeError(
            "a target is a pid, a proctable.Identity, a subprocess.Popen or an "
            f"asyncio.subprocess.Process, not {type(target).__name__}"
        )
    return _ll.check_pid(target), None, None, None


def _seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not value >= 0 or math.isinf(value):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, not {value}")
    return float(value)


class _Pinned(NamedTuple):
    fd: Optional[int]  # a pidfd that names the process, or None without pidfds
    start_time: Optional[int]
    handle: Optional[int]
    row: Optional[Proc]  # the row read at pin time, if it names the process

    def identity(self, pid: int) -> Optional[Identity]:
        return None if self.start_time is None else Identity(pid, self.start_time, self.handle)


def _pin(pid: int, start_time: Optional[int], handle: Optional[int], pidfd: bool) -> _Pinned:
    """Pin the process that pid names now; NoSuchProcess when it is gone or reused.

    The pidfd is opened first: from then on it names that process whatever happens
    to the pid. The row read afterwards gives the start time, and is trusted only
    where it cannot belong to a process that reused the pid in between.
    """
    if not pidfd:
        row = read(pid, memory=False)
        if row is None:
            raise NoSuchProcess(pid, f"no such process: pid {pid} (gone, or reaped already)")
        if start_time is not None and row.start_time != start_time:
            raise NoSuchProcess(pid, f"pid {pid} names another process now")
        return _Pinned(None, row.start_time, handle, row)
    try:
        fd = _pidfd.open_pidfd(pid)
    except ProcessLookupError:
        raise NoSuchProcess(pid, f"no such process: pid {pid} (gone, or reaped already)") from None
    try:
        return _check_pidfd(fd, pid, start_time, handle)
    except BaseException:
        os.close(fd)
        raise


def _check_pidfd(fd: int, pid: int, start_time: Optional[int], handle: Optional[int]) -> _Pinned:
    """The pinned process behind a fresh pidfd, checked against start_time and handle."""
    ino = os.fstat(fd).st_ino if _has_pidfs() else None
    if handle is not None and ino is not None and ino != handle:
        raise NoSuchProcess(pid, f"pid {pid} names another process now")
    row = read(pid, memory=False)
    if row is not None and not _ended.row_ended(row.state, row.num_threads) and (
            _ended.pidfd_ended(fd)):
        row = None  # our process died and the pid was reused before the read
    if start_time is None:
        return _Pinned(fd, None if row is None else row.start_time, ino, row)
    if row is not None and row.start_time == start_time:
        return _Pinned(fd, start_time, ino, row)
    if row is None and handle is not None and ino is not None:
        # The handle matched, so the pidfd is the process: it exited (and was
        # reaped) in between, which the pidfd still answers for.
        return _Pinned(fd, start_time, ino, None)
    what = "is gone" if row is None else "names another process now"
    raise NoSuchProcess(pid, f"pid {pid} {what}")


class _Verdict(NamedTuple):
    status: Optional[ExitStatus] = None
    source: Optional[str] = None
    error: Optional[BaseException] = None


_RUNNING = "running"  # no exit yet: wait for the pidfd, or look again after the interval
_LATER = "later"  # it exited, and its status may still come (a zombie not reaped yet)
_Outcome = Union[_Verdict, str]


class _Watch:
    __slots__ = ("delay", "due", "fd", "fut", "pid", "popen", "reap", "start_time", "tries",
                 "wake")

    def __init__(
        self,
        fut: ExitFuture,
        pid: int,
        start_time: Optional[int],
        fd: Optional[int],
        *,
        popen: Optional[_Child],
        reap: bool,
    ) -> None:
        self.fut = fut
        self.pid = pid
        self.start_time = start_time
        self.fd = fd
        self.popen = popen
        self.reap = reap
        self.due = 0.0
        self.delay = 0.0
        self.tries = 0
        self.wake: Optional[int] = None  # a Popen's own "status is here" fd (a dup, ours)


def _status_wake_fd(popen: _Child) -> Optional[int]:
    """A Popen's own fd that polls readable once the command's status is there to be
    read (``Lineage.spawn``'s, from the lineage's reaper: sooner than its mirror
    process's end), as a new fd of the watch's; None for any other Popen."""
    wake = getattr(popen, "exit_wake_fd", None)
    if not callable(wake):
        return None
    fd = wake()
    return fd if isinstance(fd, int) else None


def _patience(child: _Child) -> int:
    """How many later looks (10 ms, doubling) a child's runtime gets to set its
    returncode after reaping it: asyncio sets it only when its loop runs next."""
    return 8 if isinstance(child, _AsyncChild) else 3


def _from_popen(popen: _Child) -> Optional[_Verdict]:
    # A Lineage.spawn Popen knows the command's whole wait status (the core-dump
    # bit included) once the command ended, which neither a returncode nor its
    # mirror process's own death can carry.
    command_status = getattr(popen, "command_status", None)
    if callable(command_status):
        full = command_status()
        if isinstance(full, ExitStatus):
            return _Verdict(full, SOURCE_POPEN)
        if getattr(popen, "status_lost", False) is True:
            return _Verdict(error=ExitUnknown(
                popen.pid, f"pid {popen.pid}: the lineage's reaper died before it could "
                "tell the command's status (it was killed from outside)"))
    rc = popen.returncode
    if rc is None:
        return None
    return _Verdict(ExitStatus.from_returncode(rc), SOURCE_POPEN)


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
                outcome = self._examine(w)
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
            outcome = self._examine(w)
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

    # -- the sources (the thread, or watch() for an exit that happened already) --

    def _examine(self, w: _Watch) -> _Outcome:
        outcome = self._examine_pidfd(w) if w.fd is not None else self._examine_proc(w)
        if w.reap and isinstance(outcome, _Verdict) and outcome.status is not None:
            # Asked to reap our own child, now that its status is in hand.
            if w.popen is not None:
                w.popen.poll()  # a Popen reaps under its own lock; asyncio's reaps itself
            else:
                _pidfd.reap_child(w.pid, w.fd)
        return outcome

    def _peek(self, w: _Watch) -> Optional[_Verdict]:
        """waitid(WNOWAIT): the status of the caller's own child, left unreaped."""
        if not self.features.waitid:
            return None
        try:
            raw = _pidfd.peek_child(w.pid, w.fd)
        except ChildProcessError:
            return None  # not our child, or reaped already
        if raw is None:
            return None
        return _Verdict(decode_wait_status(raw), SOURCE_WAITID)

    def _examine_pidfd(self, w: _Watch) -> _Outcome:
        """The pidfd is readable: the process exited. Ask the sources in order."""
        assert w.fd is not None
        feats = self.features
        verdict = None if w.popen is None else _from_popen(w.popen)
        if verdict is None:
            verdict = self._peek(w)
        if verdict is not None:
            return verdict
        if feats.zombie:
            try:
                probe = exit_probe(w.pid)
            except ProctableError:
                probe = Probe(ProbeState.GONE)
            # Still unreaped after the read: the zombie read was ours (a zombie holds its pid).
            if probe.status is not None and _pidfd.still_there(w.fd, w.pid, w.start_time):
                return _Verdict(probe.status, SOURCE_ZOMBIE)
        if feats.pidfd_info:
            raw = _pidfd.exit_info(w.fd)
            if raw is not None:
                return _Verdict(decode_wait_status(raw), SOURCE_PIDFD_INFO)
        if w.popen is not None:
            verdict = _from_popen(w.popen)
            if verdict is not None:
                return verdict
        if _pidfd.still_there(w.fd, w.pid, w.start_time):
            if feats.pidfd_info:
                return _LATER  # pidfs records the status when the zombie is reaped
            return _Verdict(error=ExitUnknown(
                w.pid, f"pid {w.pid} exited; its zombie's status is hidden from this user, "
                "and this kernel keeps no pidfd exit info"))
        if w.popen is not None and w.tries < _patience(w.popen):
            w.tries += 1  # its runtime may be between waitpid() and setting returncode
            return _LATER
        return _Verdict(error=ExitUnknown(
            w.pid, f"pid {w.pid} exited and another process reaped it before its status "
            "could be read (no pidfd exit info here)"))

    def _examine_proc(self, w: _Watch) -> _Outcome:
        """No pidfd: one look at /proc, against the start time pinned at watch()."""
        if w.popen is not None:
            verdict = _from_popen(w.popen)
            if verdict is not None:
                return verdict
        try:
            probe = exit_probe(w.pid, w.start_time)
        except ProctableError:
            return _RUNNING  # unreadable for now: look again
        if probe.state in (ProbeState.RUNNING, ProbeState.STOPPED, ProbeState.LEADER_EXITED):
            return _RUNNING
        if probe.state in (ProbeState.EXITED, ProbeState.MASKED):
            # Our zombie with our start time: the pid cannot be reused under it.
            verdict = self._peek(w)
            if verdict is not None:
                return verdict
            if probe.status is not None and self.features.zombie:
                return _Verdict(probe.status, SOURCE_ZOMBIE)
            return _Verdict(error=ExitUnknown(
                w.pid, f"pid {w.pid} exited; its status is hidden from this user"
                if probe.state is ProbeState.MASKED
                else f"pid {w.pid} exited; no enabled source can read its status"))
        if w.popen is not None and w.tries < _patience(w.popen):
            w.tries += 1
            return _LATER
        return _Verdict(error=ExitUnknown(
            w.pid, f"pid {w.pid} exited and another process reaped it before its status "
            "could be read (no pidfds here)"))


# --- the shared watcher, wait_exit() and terminate() --------------------------

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


def _signal(pid: int, fd: Optional[int], start_time: Optional[int], sig: int,
            pgid: Optional[int]) -> None:
    """Send sig to the pinned process (through its pidfd where the kernel lets us),
    and to its group if asked."""
    try:
        # False: gone or reaped already, nothing to signal.
        _pidfd.signal_pinned(_ll.check_pid(pid), start_time, fd, sig)
    except PermissionError:
        raise AccessDenied(pid, f"not allowed to signal pid {pid}") from None
    if pgid is not None:
        if pgid <= 1:  # never killpg(0) or killpg(1)
            raise ValueError(f"refusing to signal process group {pgid}")
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is empty now, or holds processes we may not signal


def _status_of(fut: ExitFuture) -> Optional[ExitStatus]:
    if not fut.done() or fut.cancelled() or fut.exception() is not None:
        return None
    return fut.result()


def _still_our_child(popen: _Child, fd: Optional[int]) -> bool:
    """Is the pinned process still the Popen's unreaped child? waitid with WNOWAIT
    on the pidfd fails with ECHILD once it is not (reaped, the pid reused)."""
    if popen.returncode is not None:
        return False
    if fd is None:
        return True  # no pidfd: the start time check in _signal is what remains
    try:
        _pidfd.peek_child(popen.pid, fd)
    except ChildProcessError:
        return False
    except OSError:
        return True
    return True


def terminate(
    target: Target, grace: float = 3.0, kill_timeout: float = 3.0, group: bool = False
) -> Optional[ExitStatus]:
    """Stop target: SIGTERM, at most grace seconds, SIGKILL, at most kill_timeout seconds.

    SIGTERM is followed by SIGCONT, so that a stopped process runs its handler
    within the grace instead of being killed after it.

    Signals go through a pidfd opened before the identity check, so a reused pid
    is never hit. Returns the ExitStatus seen (also for a zombie nobody reaps),
    ``None`` where it cannot be read, or where the target is gone already. Returns
    within ``grace + kill_timeout`` plus a few milliseconds. Never reaps.

    ``group=True`` also signals the target's process group (with each signal sent
    while the target has not exited); a group of 0 or 1, or the caller's own
    group, is refused with ``ValueError`` before any signal.
    AccessDenied when the kernel does not let the caller signal target.

    A ``Popen`` (or an ``asyncio.subprocess.Process``) is signalled only while its
    process is still this process's unreaped child: one reaped elsewhere (its pid
    may name a stranger now), or a Popen copied into a forked child, gives its
    returncode or None, unsignalled.
    """
    pid, start_time, handle, popen = _resolve_target(target)
    grace = _seconds(grace, "grace")
    kill_timeout = _seconds(kill_timeout, "kill_timeout")
    if not isinstance(group, bool):
        raise TypeError(f"group must be a bool, not {type(group).__name__}")
    if popen is not None and popen.returncode is not None:
        return ExitStatus.from_returncode(popen.returncode)
    watcher = _default_watcher()
    try:
        pinned = _pin(pid, start_time, handle, watcher.features.pidfd)
    except NoSuchProcess:
        done = None if popen is None else _from_popen(popen)
        return None if done is None else done.status
    fd = pinned.fd
    if popen is not None and not _still_our_child(popen, fd):
        # Reaped by another thread between the check above and the pin: the pid
        # may name a stranger now. Never signal it; answer from the Popen.
        if fd is not None:
            os.close(fd)
        return None if popen.returncode is None else ExitStatus.from_returncode(popen.returncode)
    try:
        pgid = None
        if group and pinned.row is not None:
            pgid = pinned.row.pgid
            if pgid <= 1 or pgid == os.getpgrp():
                raise ValueError(
                    f"refusing group=True: pid {pid} is in process group {pgid}"
                    + (", the caller's own" if pgid == os.getpgrp() else ""))
        # Waited for here, on the caller's thread: terminate() needs no thread of
        # the watcher's (where none can start, it still ends what it was asked to).
        w = _Watch(ExitFuture(pid), pid, pinned.start_time, fd, popen=popen, reap=False)
        verdict = _exited_within(watcher, w, 0.0)
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_timeout)):
            if verdict is not None:
                break
            _signal(pid, fd, pinned.start_time, sig, pgid)
            if sig == signal.SIGTERM:
                # A stopped process holds SIGTERM pending until it runs again:
                # continue it, so that its handler runs within the grace.
                _signal(pid, fd, pinned.start_time, signal.SIGCONT, pgid)
            verdict = _exited_within(watcher, w, wait)
        return None if verdict is None else verdict.status
    finally:
        if fd is not None:
            os.close(fd)


def _exited_within(watcher: ExitWatcher, w: _Watch, timeout: float) -> Optional[_Verdict]:
    """w's exit, asked of the watcher's sources on this thread, within timeout
    seconds; None while it runs (or while its status is still to come)."""
    deadline = time.monotonic() + timeout
    delay = 0.0
    while True:
        left = deadline - time.monotonic()
        if w.fd is not None:
            ready = bool(readable([w.fd], max(0.0, min(left, delay) if delay else left)))
        else:
            ready = True  # no pidfd: look at /proc each time
        if ready:
            outcome = watcher._examine(w)
            if isinstance(outcome, _Verdict):
                return outcome
            if outcome == _LATER or w.fd is None:
                # Exited, status still to come (or no pidfd): look again, less often.
                delay = min(max(delay * 2, 0.01), watcher._poll_interval)
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if w.fd is None or delay:
            time.sleep(min(left, delay or watcher._poll_interval))

