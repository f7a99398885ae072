"""Exits: what happened to a process, read without reaping it.

The package holds the probe (``_probe``: one read of /proc/<pid>/stat, decoded
with the cases where field 52 lies told apart), what a watch names and how it is
pinned (``_target``), where a status comes from (``_sources``), the exit watcher
and ``wait_exit`` (``_watcher``: one thread, epoll over pidfds, sources that do
not depend on the runtime), and ``terminate`` (``_terminate``), whose every wait
is bounded.
"""

from .._status import ExitStatus, decode_wait_status
from ._probe import Probe, ProbeState, classify, exit_probe, zombie_exit
from ._sources import (
    SOURCE_PIDFD_INFO,
    SOURCE_POPEN,
    SOURCE_WAITID,
    SOURCE_ZOMBIE,
    ExitFuture,
)
from ._target import Target
from ._terminate import terminate
from ._watcher import ExitWatcher, wait_exit

__all__ = [
    "SOURCE_PIDFD_INFO",
    "SOURCE_POPEN",
    "SOURCE_WAITID",
    "SOURCE_ZOMBIE",
    "ExitFuture",
    "ExitStatus",
    "ExitWatcher",
    "Probe",
    "ProbeState",
    "Target",
    "classify",
    "decode_wait_status",
    "exit_probe",
    "terminate",
    "wait_exit",
    "zombie_exit",
]
