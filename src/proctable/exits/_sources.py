"""Where an exit's status comes from, in order: the Popen's own returncode,
waitid(WNOWAIT) on the caller's own child, the zombie's field 52, then the exit
info pidfs keeps once someone reaped it. ``examine`` asks them for one watch; the
watcher's thread and terminate's own wait both call it."""

from __future__ import annotations

import concurrent.futures
from typing import NamedTuple, Optional, Union

from .. import _pidfd
from .._status import ExitStatus, decode_wait_status
from ..errors import ExitUnknown, ProctableError
from ..table import Identity
from ._probe import Probe, ProbeState, exit_probe
from ._target import _AsyncChild, _Child

SOURCE_POPEN = "popen"
"""The Popen's own returncode (its runtime reaped it already)."""
SOURCE_WAITID = "waitid"
"""waitid(WEXITED | WNOWAIT) on the caller's own child: the status, not reaped."""
SOURCE_ZOMBIE = "zombie"
"""Field 52 of the zombie's /proc/<pid>/stat (see exit_probe)."""
SOURCE_PIDFD_INFO = "pidfd_info"
"""ioctl(PIDFD_GET_INFO) with PIDFD_INFO_EXIT, after someone else reaped it."""


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



def examine(w: _Watch, features: _pidfd.Features) -> _Outcome:
    """One look at w's sources (the watcher's thread, ``watch()`` for an exit that
    happened already, terminate's own wait); reaps where the watch asked to."""
    outcome = _examine_pidfd(w, features) if w.fd is not None else _examine_proc(w, features)
    if w.reap and isinstance(outcome, _Verdict) and outcome.status is not None:
        # Asked to reap our own child, now that its status is in hand.
        if w.popen is not None:
            w.popen.poll()  # a Popen reaps under its own lock; asyncio's reaps itself
        else:
            _pidfd.reap_child(w.pid, w.fd)
    return outcome


def _peek(w: _Watch, features: _pidfd.Features) -> Optional[_Verdict]:
    """waitid(WNOWAIT): the status of the caller's own child, left unreaped."""
    if not features.waitid:
        return None
    try:
        raw = _pidfd.peek_child(w.pid, w.fd)
    except ChildProcessError:
        return None  # not our child, or reaped already
    if raw is None:
        return None
    return _Verdict(decode_wait_status(raw), SOURCE_WAITID)


def _examine_pidfd(w: _Watch, features: _pidfd.Features) -> _Outcome:
    """The pidfd is readable: the process exited. Ask the sources in order."""
    assert w.fd is not None
    feats = features
    verdict = None if w.popen is None else _from_popen(w.popen)
    if verdict is None:
        verdict = _peek(w, features)
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


def _examine_proc(w: _Watch, features: _pidfd.Features) -> _Outcome:
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
        verdict = _peek(w, features)
        if verdict is not None:
            return verdict
        if probe.status is not None and features.zombie:
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
