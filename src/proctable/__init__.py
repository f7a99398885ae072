"""proctable: a fast process table, exits that runtimes lose, lineage and teardown.

See the README for a tour; the public names are listed in ``__all__``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
from .supervise import Event, RestartPolicy, Supervisor
from .table import Identity, Proc, Reader, Table, identity, parse_stat, read, reader, snapshot

if TYPE_CHECKING:
    from .supervise import AsyncSupervisor

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # AsyncSupervisor loads asyncio, which import proctable does not: only on use.
    if name == "AsyncSupervisor":
        from .supervise import _async  # noqa: PLC0415

        return _async.AsyncSupervisor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

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
