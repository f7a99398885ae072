"""psutil's process API on Linux, read through proctable's C core.

``import proctable.compat as psutil`` switches code written against psutil's
process API: ``Process`` (with every method psutil's has that reads or
signals one process, listed in ``AS_DICT_ATTRS`` and the docs), ``pids``,
``pid_exists``, ``process_iter``, ``wait_procs``, the ``STATUS_*`` strings and
psutil's exceptions (``Error``, ``NoSuchProcess``, ``ZombieProcess``,
``AccessDenied``, ``TimeoutExpired``). Same values, same types, and the same
exception class where psutil raises, on every process this caller can see;
where identity matters (``is_running``, signals, ``wait``) it answers for the
process the object was made for, never for a later one on the same pid. The
rest of psutil (system-wide figures, network, disks, sensors) is not here.
See docs/integrations.md.

``proctable.compat.process_iter`` is ``proctable.process_iter`` with psutil's
meaning of ``attrs=None`` (no attribute read: ``proctable.process_iter`` reads
every one of ``OFFERED`` then) and of an empty list (every one of
``AS_DICT_ATTRS``).
"""

from __future__ import annotations

from ._decode import pcputimes, pgids, pmem, puids
from ._errors import AccessDenied, Error, NoSuchProcess, TimeoutExpired, ZombieProcess
from ._iter import OFFERED, ProcessInfo, last_reader
from ._iter import psutil_process_iter as process_iter
from ._process import AS_DICT_ATTRS, Negsignal, Process, pid_exists, pids, wait_procs

# psutil's status strings, for comparisons with Process.status().
STATUS_RUNNING = "running"
STATUS_SLEEPING = "sleeping"
STATUS_DISK_SLEEP = "disk-sleep"
STATUS_STOPPED = "stopped"
STATUS_TRACING_STOP = "tracing-stop"
STATUS_ZOMBIE = "zombie"
STATUS_DEAD = "dead"
STATUS_WAKE_KILL = "wake-kill"
STATUS_WAKING = "waking"
STATUS_IDLE = "idle"
STATUS_PARKED = "parked"

__all__ = [
    "AS_DICT_ATTRS",
    "OFFERED",
    "STATUS_DEAD",
    "STATUS_DISK_SLEEP",
    "STATUS_IDLE",
    "STATUS_PARKED",
    "STATUS_RUNNING",
    "STATUS_SLEEPING",
    "STATUS_STOPPED",
    "STATUS_TRACING_STOP",
    "STATUS_WAKE_KILL",
    "STATUS_WAKING",
    "STATUS_ZOMBIE",
    "AccessDenied",
    "Error",
    "Negsignal",
    "NoSuchProcess",
    "Process",
    "ProcessInfo",
    "TimeoutExpired",
    "ZombieProcess",
    "last_reader",
    "pcputimes",
    "pgids",
    "pid_exists",
    "pids",
    "pmem",
    "process_iter",
    "puids",
    "wait_procs",
]
