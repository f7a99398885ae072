"""terminate(): SIGTERM, a bounded grace, SIGKILL, a bounded wait, through a pidfd
pinned before the identity check; waited for on the caller's thread."""

from __future__ import annotations

import os
import signal
import time
from typing import Optional

from .. import _lowlevel as _ll
from .. import _pidfd
from .._fdwait import readable
from .._status import ExitStatus
from ..errors import AccessDenied, NoSuchProcess
from ._sources import _LATER, ExitFuture, _from_popen, _Verdict, _Watch, examine
from ._target import Target, _Child, _pin, _resolve_target, _seconds
from ._watcher import ExitWatcher, _default_watcher


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
            outcome = examine(w, watcher.features)
            if isinstance(outcome, _Verdict):
                return outcome
            if outcome == _LATER or w.fd is None:
                # Exited, status still to come (or no pidfd): look again, less often.
                delay = min(max(delay * 2, 0.01), watcher.poll_interval)
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if w.fd is None or delay:
            time.sleep(min(left, delay or watcher.poll_interval))

