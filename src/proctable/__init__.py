"""proctable: a fast process table, exits that runtimes lose, lineage and teardown.

See the README for a tour; the public names are listed in ``__all__``.
"""

from __future__ import annotations

from ._status import ExitStatus, decode_wait_status
from .compat import ProcessInfo, process_iter
from .errors import (
    AccessDenied,
    ExitUnknown,
    InputBlocked,
    NoInput,
    NoSuchProcess,
    NoThread,
    OutOfFds,
    ProctableError,
    StartCancelled,
    SupervisorClosed,
    TeardownError,
    WatcherClosed,
)
from .exits import (
    ExitFuture,
    ExitWatcher,
    Probe,
    ProbeState,
    exit_probe,
    terminate,
    wait_exit,
    zombie_exit,
)
from .lineage import Ended, Lineage, LineageClosed, MemberEnd, Suspect, TeardownReport
from .scanner import Scanner
from .supervise import AsyncSupervisor, Event, RestartPolicy, Supervisor
from .table import Identity, Proc, Reader, Table, identity, parse_stat, read, reader, snapshot

__version__ = "0.1.0"

__all__ = [
    "AccessDenied",
    "AsyncSupervisor",
    "Ended",
    "Event",
    "ExitFuture",
    "ExitStatus",
    "ExitUnknown",
    "ExitWatcher",
    "Identity",
    "InputBlocked",
    "Lineage",
    "LineageClosed",
    "MemberEnd",
    "NoInput",
    "NoSuchProcess",
    "NoThread",
    "OutOfFds",
    "Probe",
    "ProbeState",
    "Proc",
    "ProcessInfo",
    "ProctableError",
    "Reader",
    "RestartPolicy",
    "Scanner",
    "StartCancelled",
    "Supervisor",
    "SupervisorClosed",
    "Suspect",
    "Table",
    "TeardownError",
    "TeardownReport",
    "WatcherClosed",
    "__version__",
    "decode_wait_status",
    "exit_probe",
    "identity",
    "parse_stat",
    "process_iter",
    "read",
    "reader",
    "snapshot",
    "terminate",
    "wait_exit",
    "zombie_exit",
]
