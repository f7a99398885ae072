"""The exit probe: one read of /proc/<pid>/stat, decoded without reaping, with the
cases where field 52 lies told apart (stopped, leader-only zombie, masked, reused)."""

from __future__ import annotations

import enum
from typing import NamedTuple, Optional

from .. import _ended
from .. import _lowlevel as _ll
from .._status import ExitStatus
from ..table import Proc, read


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

