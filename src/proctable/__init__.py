"""proctable: a fast process table, exits that runtimes lose, lineage and teardown.

See the README for a tour; the public names are listed in ``__all__``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._status import ExitStatus, decode_wait_status
from .errors import (
    AccessDenied,
    ExitUnknown,
    GenerationEnded,
    InputBlocked,
    NoInput,
    NoSuchKey,
    NoSuchProcess,
    NoThread,
    OutOfFds,
    ProctableError,
    StartCancelled,
    StateDirError,
    SupervisorClosed,
    TeardownError,
    WatcherClosed,
)
from .scanner import Scanner
from .table import Identity, Proc, Reader, Table, identity, parse_stat, read, reader, snapshot

if TYPE_CHECKING:
    from .compat._iter import ProcessInfo, process_iter
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
    from .supervise import AnyEvent, AsyncSupervisor, Event, Replay, RestartPolicy, Supervisor

__version__ = "0.1.0"

# The layers above the table load when first used: ``import proctable`` then costs
# what a table read needs (a one-shot ``proctable ps`` imports no supervisor,
# lineage or asyncio).
_LAZY = {
    **dict.fromkeys(["ProcessInfo", "process_iter"], ".compat._iter"),
    **dict.fromkeys(["ExitFuture", "ExitWatcher", "Probe", "ProbeState", "exit_probe",
                     "terminate", "wait_exit", "zombie_exit"], ".exits"),
    **dict.fromkeys(["Ended", "Lineage", "LineageClosed", "MemberEnd", "Suspect",
                     "TeardownReport"], ".lineage"),
    **dict.fromkeys(["AnyEvent", "Event", "Replay", "RestartPolicy", "Supervisor"],
                    ".supervise"),
    "AsyncSupervisor": ".supervise._async",
}


# Subpackages loaded on first use, as ``proctable.supervise`` after a plain
# ``import proctable`` (an attribute once every layer was imported at once).
_SUBMODULES = frozenset({"bench", "cli", "compat", "exits", "lineage", "pytest_plugin",
                         "serve", "supervise"})


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "AccessDenied",
    "AnyEvent",
    "AsyncSupervisor",
    "Ended",
    "Event",
    "ExitFuture",
    "ExitStatus",
    "ExitUnknown",
    "ExitWatcher",
    "GenerationEnded",
    "Identity",
    "InputBlocked",
    "Lineage",
    "LineageClosed",
    "MemberEnd",
    "NoInput",
    "NoSuchKey",
    "NoSuchProcess",
    "NoThread",
    "OutOfFds",
    "Probe",
    "ProbeState",
    "Proc",
    "ProcessInfo",
    "ProctableError",
    "Reader",
    "Replay",
    "RestartPolicy",
    "Scanner",
    "StartCancelled",
    "StateDirError",
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
