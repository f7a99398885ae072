"""What a watch or a terminate names, and pinning it: a pidfd opened before the
identity check, so that a reused pid is never taken for the process named."""

from __future__ import annotations

import math
import os
import subprocess
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Protocol, Union

from .. import _ended, _pidfd
from .. import _lowlevel as _ll
from .._aio import is_asyncio_process
from ..errors import NoSuchProcess
from ..table import Identity, Proc, _has_pidfs, read

if TYPE_CHECKING:
    import asyncio

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

