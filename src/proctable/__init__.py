"""proctable: a fast process table, exits that runtimes lose, lineage and teardown.

See the README for a tour; the public names are listed in ``__all__``.
"""

from __future__ import annotations

from ._status import ExitStatus, decode_wait_status
from .errors import AccessDenied, NoSuchProcess, ProctableError, TeardownError
from .exits import Probe, ProbeState, exit_probe, zombie_exit
from .table import Identity, Proc, Table, identity, parse_stat, read, snapshot

__version__ = "0.1.0"

__all__ = [
    "AccessDenied",
    "ExitStatus",
    "Identity",
    "NoSuchProcess",
    "Probe",
    "ProbeState",
    "Proc",
    "ProctableError",
    "Table",
    "TeardownError",
    "__version__",
    "decode_wait_status",
    "exit_probe",
    "identity",
    "parse_stat",
    "read",
    "snapshot",
    "zombie_exit",
]
