"""What a lineage hands out: teardown reports, member ends, suspects, and its errors."""

from __future__ import annotations

import enum
from typing import NamedTuple, Optional

from .._status import ExitStatus
from ..errors import ProctableError
from ..table import Identity, Proc

__all__ = ["Change", "Ended", "LineageClosed", "MemberEnd", "Suspect", "TeardownReport"]


class LineageClosed(ProctableError, RuntimeError):
    """The lineage was torn down (or closed) already: it has no members and takes
    no calls. A finished teardown's report stays in ``lineage.report``."""


class Ended(str, enum.Enum):
    """How a member ended during teardown."""

    TERM = "term"
    """It exited after our SIGTERM (before any SIGKILL)."""
    KILL = "kill"
    """It was still there at the end of the grace period, and SIGKILL ended it."""
    ALREADY_GONE = "already_gone"
    """It exited before any signal of ours reached it."""
    UNRESOLVED = "unresolved"
    """Its end could not be proven (it may not be signalled, or outlived kill_timeout)."""

    def __str__(self) -> str:
        return self.value


class MemberEnd(NamedTuple):
    """One member in a :class:`TeardownReport`."""

    proc: Proc
    """The member's row as last seen (its name after any exec)."""
    ended: Ended
    seconds: Optional[float]
    """When its end was seen, in seconds from the start of teardown; None if unresolved."""
    exit: Optional[ExitStatus] = None
    """Its exit status, where the kernel still had it (pidfd exit info, or its zombie)."""
    handle: Optional[int] = None
    """The pidfs handle of its pidfd (see :class:`proctable.Identity`), where there is one."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def identity(self) -> Identity:
        """(pid, start time, pidfs handle) of the member."""
        return Identity(self.proc.pid, self.proc.start_time, self.handle)


class Suspect(NamedTuple):
    """A process in a group or session a member leads or led, whose number the
    lineage cannot prove still names that group or session (it may have been freed
    and reused by an unrelated process). Reported, never signalled."""

    proc: Proc
    """Its row when it was seen."""
    via: str
    """``group`` or ``session``: the kind of id it would have been claimed through."""
    id: int
    """That process group or session id."""
    handle: Optional[int] = None
    """The pidfs handle, where there is one."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def identity(self) -> Identity:
        return Identity(self.proc.pid, self.proc.start_time, self.handle)


class TeardownReport(NamedTuple):
    """What :meth:`Lineage.terminate` did: every member, how it ended, how long it took.

    After a failed teardown that was retried, the report covers the whole teardown
    since the first attempt began (``seconds`` and every member's ``seconds`` count
    from there).
    """

    mode: str
    members: tuple[MemberEnd, ...]
    seconds: float
    """Wall time of the whole teardown."""
    grace: float
    kill_timeout: float
    suspects: tuple[Suspect, ...] = ()
    """Processes left alone: their membership rested on an id that may have been reused."""

    def by_end(self, ended: Ended) -> list[MemberEnd]:
        return [m for m in self.members if m.ended is ended]

    @property
    def termed(self) -> list[MemberEnd]:
        return self.by_end(Ended.TERM)

    @property
    def killed(self) -> list[MemberEnd]:
        return self.by_end(Ended.KILL)

    @property
    def already_gone(self) -> list[MemberEnd]:
        return self.by_end(Ended.ALREADY_GONE)

    @property
    def unresolved(self) -> list[MemberEnd]:
        return self.by_end(Ended.UNRESOLVED)

    def __str__(self) -> str:
        counts = ", ".join(
            f"{len(self.by_end(e))} {e}" for e in Ended if self.by_end(e)
        ) or "no members"
        if self.suspects:
            counts += f"; {len(self.suspects)} suspect(s) left alone"
        return f"teardown ({self.mode}) in {self.seconds * 1000:.1f} ms: {counts}"


class Change(NamedTuple):
    """One change of a lineage's membership, as :meth:`Lineage.changes` reports it."""

    kind: str
    """``joined`` (recorded as a member) or ``left`` (seen ended)."""
    proc: Proc
    """Its row at that moment."""
    parent_member: bool = True
    """joined: its parent was a member then (False: re-parented, an orphan)."""
    status: Optional[ExitStatus] = None
    """left: its exit status, where the kernel still had it."""

    @property
    def pid(self) -> int:
        return self.proc.pid

