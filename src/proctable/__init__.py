"""proctable: a fast process table, exits that runtimes lose, lineage and teardown.

See the README for a tour; the public names are listed in ``__all__``.
"""

from __future__ import annotations

from ._policy import RestartPolicy
from ._status import ExitStatus, decode_wait_status
from .compat import ProcessInfo, process_iter
from .errors import (
    AccessDenied,
    ExitUnknown,
    NoSuchProcess,
    ProctableError,
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
from .lineage import Ended, Lineage, LineageClosed, MemberEnd, TeardownReport
from .scanner import Scanner
from .supervise import Event, Supervisor
from .table import Identity, Proc, Table, identity, parse_stat, read, snapshot

__version__ = "0.1.0"

__all__ = [
    "AccessDenied",
    "Ended",
    "Event",
    "ExitFuture",
    "ExitStatus",
    "ExitUnknown",
    "ExitWatcher",
    "Identity",
    "Lineage",
    "LineageClosed",
    "MemberEnd",
    "NoSuchProcess",
    "Probe",
    "ProbeState",
    "Proc",
    "ProcessInfo",
    "ProctableError",
    "RestartPolicy",
    "Scanner",
    "Supervisor",
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
    "snapshot",
    "terminate",
    "wait_exit",
    "zombie_exit",
]
