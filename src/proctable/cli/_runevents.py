"""``proctable run --events``: the life of a run as protocol objects.

Two parts, kept apart on purpose:

- ``RunEvents`` writes the objects (started, joined, escaped, left, signal, exited,
  teardown, restarting, gave_up, end); docs/protocol.md documents each.
- ``lineage_changes()`` is the one place that learns who joined and who left:
  from ``Lineage.changes()``, the lineage's own record of every member it
  recorded (also one that lived shorter than a sample) and of every end, with
  the exit status where the kernel still had it; and who moved to another
  session or group, by comparing the members' rows between two calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

from .._status import ExitStatus
from ..table import Identity, Proc
from ._protocol import JsonLines, args_list, status_object, text

__all__ = ["MemberChange", "MemberTracker", "RunEvents", "lineage_changes"]


class MemberChange(NamedTuple):
    """A process joined the lineage, escaped further, or left it (ended)."""

    kind: str  # "joined", "escaped" or "left"
    proc: Proc
    escaped: tuple[str, ...] = ()
    """joined: how it stands apart from the command (``session``: in another
    session; ``group``: in another process group of the command's session;
    ``orphaned``: its parent is not a member, it was re-parented); escaped: what
    it changed since it joined (``session`` or ``group``)."""
    status: Optional[ExitStatus] = None
    """left: its exit status, where the lineage knows it."""


def _apart(p: Proc, command: Optional[Proc]) -> list[str]:
    """session / group: where p stands apart from the command."""
    if command is None:
        return []
    if p.sid is not None and command.sid is not None and p.sid != command.sid:
        return ["session"]
    if p.pgid != command.pgid:
        return ["group"]
    return []


class MemberTracker:
    """Who the lineage's members were at the last sample, to tell the changes."""

    def __init__(self, root: Optional[Identity]) -> None:
        self.root = root
        self.command: Optional[Proc] = None
        self.current: dict[tuple[int, int], Proc] = {}

    def _is_root(self, p: Proc) -> bool:
        r = self.root
        return r is not None and p.pid == r.pid and p.start_time == r.start_time

    def alive(self) -> list[Proc]:
        """The members at the last sample, the command left out."""
        return [p for p in self.current.values() if not self._is_root(p)]


def lineage_changes(lin: Any, tracker: MemberTracker) -> list[MemberChange]:
    """What changed in the lineage since the last call (see the module's note)."""
    out: list[MemberChange] = []
    for ch in lin.changes():
        p = ch.proc
        key = (p.pid, p.start_time)
        if tracker._is_root(p):
            if ch.kind == "joined":
                tracker.command = p  # the command itself is the run's "started"
            continue
        if ch.kind == "joined":
            how = _apart(p, tracker.command)
            if not ch.parent_member:
                how.append("orphaned")
            tracker.current[key] = p
            out.append(MemberChange("joined", p, tuple(how)))
        elif key in tracker.current:
            del tracker.current[key]
            out.append(MemberChange("left", p, status=ch.status))
    # Moves of members still there: their rows now against the last ones seen.
    for p in lin.members():
        key = (p.pid, p.start_time)
        before = tracker.current.get(key)
        if before is None:
            continue
        if p.sid != before.sid:
            out.append(MemberChange("escaped", p, ("session",)))
        elif p.pgid != before.pgid:
            out.append(MemberChange("escaped", p, ("group",)))
        tracker.current[key] = p
    return out


def _proc_fields(p: Proc) -> dict[str, Any]:
    return {"pid": p.pid, "start_time": p.start_time, "ppid": p.ppid, "pgid": p.pgid,
            "sid": p.sid, "name": text(p.name)}


class RunEvents:
    """The protocol objects of one ``proctable run``, written as they happen."""

    def __init__(self, out: JsonLines) -> None:
        self.out = out
        self.run = 0

    def _emit(self, type_: str, fields: dict[str, Any]) -> None:
        self.out.emit(type_, {"run": self.run, **fields}, stamp=True)

    def started(self, args: Sequence[str], mode: str, root: Optional[Identity],
                pid: int) -> None:
        self.run += 1
        self._emit("started", {
            "pid": root.pid if root is not None else pid,
            "start_time": None if root is None else root.start_time,
            "args": args_list(list(args)),
            "mode": mode,
        })

    def changed(self, change: MemberChange) -> None:
        fields = _proc_fields(change.proc)
        if change.kind == "left":
            fields["status"] = status_object(change.status)
        else:
            fields["escaped"] = list(change.escaped)
        self._emit(change.kind, fields)

    def signal(self, signum: int, name: str, forwarded: bool) -> None:
        self._emit("signal", {"signal": signum, "signal_name": name, "forwarded": forwarded})

    def exited(self, root: Optional[Identity], pid: int, status: Optional[ExitStatus],
               exit_code: int, seconds: float, forced: bool) -> None:
        self._emit("exited", {
            "pid": root.pid if root is not None else pid,
            "start_time": None if root is None else root.start_time,
            "status": status_object(status),
            "exit_code": exit_code,
            "seconds": round(seconds, 6),
            "forced": forced,
        })

    def teardown(self, report: Any, outlived: Sequence[Proc], error: Optional[str],
                 mode: str) -> None:
        left = {(p.pid, p.start_time) for p in outlived}
        members = []
        if report is not None:
            for m in sorted(report.members, key=lambda m: (m.seconds is None, m.seconds or 0.0,
                                                          m.proc.pid)):
                members.append({
                    "pid": m.proc.pid,
                    "start_time": m.proc.start_time,
                    "name": text(m.proc.name),
                    "ended": str(m.ended),
                    "seconds": None if m.seconds is None else round(m.seconds, 6),
                    "status": status_object(m.exit),
                    "outlived": (m.proc.pid, m.proc.start_time) in left,
                })
        self._emit("teardown", {
            "mode": report.mode if report is not None else mode,
            "seconds": None if report is None else round(report.seconds, 6),
            "grace": None if report is None else report.grace,
            "kill_timeout": None if report is None else report.kill_timeout,
            "members": members,
            "error": error,
        })

    def restarting(self, reason: str) -> None:
        self._emit("restarting", {"reason": reason})

    def gave_up(self, reason: str) -> None:
        self._emit("gave_up", {"reason": reason})

    def end(self, exit_code: int, error: Optional[str] = None) -> None:
        self.out.emit("end", {"runs": self.run, "exit_code": exit_code, "error": error},
                      stamp=True)
