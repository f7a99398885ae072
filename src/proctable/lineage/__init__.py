"""Lineage: every process a run starts (escapes included), and a teardown that proves them gone.

The package, lowest first:

- :mod:`._core`: the membership rules, pure (rows and events in, decisions out);
- :mod:`._members`: recorded members (pidfd first), signals, the /proc reads;
- :mod:`._procconn` and :mod:`._hub`: the proc connector, one socket per process
  shared by every lineage;
- one module per backend: :mod:`.cgroup`, :mod:`.subreaper`, :mod:`.scan`, behind
  the one small interface of :mod:`._backend`; :mod:`._helper` runs the native
  helper they share (``proctable-lineage``, built from csrc/pt_lineage.c);
- :mod:`._lineage`: :class:`Lineage`, which picks a backend and drives it.
"""

from __future__ import annotations

from ._core import ScanResult, scan_members
from ._lineage import MODES, Lineage, SpawnedProcess
from ._report import Change, Ended, LineageClosed, MemberEnd, Suspect, TeardownReport

__all__ = [
    "MODES",
    "Change",
    "Ended",
    "Lineage",
    "LineageClosed",
    "MemberEnd",
    "ScanResult",
    "SpawnedProcess",
    "Suspect",
    "TeardownReport",
    "scan_members",
]
