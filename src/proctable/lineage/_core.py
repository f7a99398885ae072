"""The membership rules: plain data in, decisions out. No I/O, no processes.

Everything that decides who is a member lives in this file; the backends only
feed it rows (what one read of ``/proc/<pid>/stat`` said) and events (what the
proc connector said), and carry out what it decides: record a member (pidfd
first), or report a suspect.

The rules
---------

A process is a **member** when one of these holds:

- *parent*: its parent is a live member (or an ended member that is provably not
  reaped), and it started no earlier than that parent. (An older "child" is a
  reused parent pid.) A fork reported by the event stream is the same rule, at
  once.
- *group* / *session*: it is in a process group or a session that a member leads
  or led (recorded when a member was seen leading it), it started no earlier than
  that leader, **and** the lineage can prove that the group or session never
  emptied since it was recorded. A group or session id is freed as soon as the
  group empties, and an unrelated process may then make a group of the same
  number: claiming through a number needs proof that the number still names the
  recorded group. The proofs:

  1. *held*: a recorded member (alive, or an unreaped zombie) is in that group or
     session at the moment of the claim, held by a pidfd (``held``): while it is
     unreaped the number cannot be freed;
  2. *stream*: an unbroken event stream has watched the number since a moment it
     was proven held, and no process was forked with that pid since
     (``covered``): a new group or session of that number needs a process of
     that pid first;
  3. *born inside* (sessions only): the process started before the last moment
     the session was proven held (``proven_at``, in clock ticks since boot). A
     session id only ever changes to the process's own pid, so it has been in
     that very session since it was born.

  Where none holds, the process is a **suspect**: reported, never signalled.

Groups and sessions no member ever led (the supervisor's own, which the root only
inherited) are never recorded, so never claimed through. A record is forgotten
once the rows show its number empty, or held as a pid by a process that started
after its leader (the number was free in between): the rows passed as
``complete`` must then hold every process that could be in it.

Ending a member is not decided here: :mod:`proctable._ended` decides it, and the
I/O layer tells this core (:meth:`Membership.end`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Optional

from .._ended import row_ended

__all__ = [
    "Claim",
    "Decision",
    "Led",
    "Membership",
    "Row",
    "ScanResult",
    "as_row",
    "scan_members",
]

PARENT = "parent"
GROUP = "group"
SESSION = "session"


class Row(NamedTuple):
    """What one read of a process's stat line said, as plain data."""

    pid: int
    ppid: int
    pgid: int
    sid: Optional[int]
    """None where the kernel did not say (a row is then in no recorded session)."""
    start_time: int
    state: str = "S"
    num_threads: Optional[int] = 1
    """None where unknown (a macOS zombie: one thread)."""


def as_row(r: Any) -> Row:
    """A Row from a Proc, a named tuple with those fields, or a plain tuple of
    5 ``(pid, ppid, pgid, sid, start_time)`` or 7 (with state, num_threads)."""
    if isinstance(r, Row):
        return r
    if hasattr(r, "start_time"):
        return Row(r.pid, r.ppid, r.pgid, r.sid, r.start_time, getattr(r, "state", "S"),
                   getattr(r, "num_threads", 1))
    return Row(*r)


class Led(NamedTuple):
    """A process group or session a member leads or led."""

    leader_start: int
    """The leader's start time: nothing older is claimed through it."""
    session: Optional[int] = None
    """For a group, the session it is in (a group never changes session)."""
    covered: bool = False
    """An unbroken event stream has watched its number since it was proven held."""
    proven_at: Optional[int] = None
    """Sessions: the last clock tick (since boot) at which it was proven held."""


class Claim(NamedTuple):
    """A process the rules make a member (or, among suspects, would make one)."""

    pid: int
    floor: int
    """It must have started no earlier than this (its parent or its group's leader)."""
    via: str
    """``parent``, ``group`` or ``session``."""
    ident: int
    """The parent's pid, the process group id or the session id it came through."""
    start_time: Optional[int] = None
    """Its start time as the row said (None for a fork event: not read yet)."""


class Decision(NamedTuple):
    """What one application of the rules decided."""

    claims: tuple[Claim, ...]
    """Record these as members, in this order (each after a fresh check of its row)."""
    suspects: tuple[Claim, ...]
    """In a recorded group or session that cannot be proven the recorded one."""
    groups: frozenset[int]
    """The recorded groups proven never emptied, now."""
    sessions: frozenset[int]
    """The recorded sessions proven never emptied, now."""


class Membership:
    """The members of one lineage and the groups and sessions they lead, as data.

    ``floor`` is the root's start time; ``exclude`` pids are never members (the
    caller itself, the lineage's own helpers).
    """

    def __init__(self, floor: int, exclude: Iterable[int] = ()) -> None:
        self.floor = floor
        self.exclude = set(exclude)
        self.members: dict[int, int] = {}
        """Live members: pid -> start time."""
        self.anchors: dict[int, int] = {}
        """Ended members not known to be reaped: they may still hold their group's
        or session's number (an unreaped zombie does)."""
        self.rows: dict[int, Row] = {}
        """The last row seen of each member and anchor."""
        self.groups: dict[int, Led] = {}
        self.sessions: dict[int, Led] = {}
        self.watching: frozenset[int] = frozenset()
        """The numbers the stream reports the reuse of (:meth:`watch`): only those
        can be covered."""

    # -- what the I/O layer reports --------------------------------------------------

    def add(self, row: Row) -> None:
        """``row`` was recorded as a member (its pidfd opened before the row was read)."""
        self.members[row.pid] = row.start_time
        self.anchors.pop(row.pid, None)
        self.rows[row.pid] = row
        self._note_leader(row)

    def anchor(self, row: Row) -> None:
        """``row`` was recorded, but it has ended already (an unreaped zombie root)."""
        self.members.pop(row.pid, None)
        self.anchors[row.pid] = row.start_time
        self.rows[row.pid] = row
        self._note_leader(row)

    def observe(self, row: Row) -> None:
        """A fresh row of a member or an anchor (ignored where it names another process)."""
        start = self.members.get(row.pid, self.anchors.get(row.pid))
        if start is None or start != row.start_time:
            return
        self.rows[row.pid] = row
        self._note_leader(row)

    def end(self, pid: int) -> None:
        """The member ended (by the one predicate); it stays an anchor until reaped."""
        start = self.members.pop(pid, None)
        if start is not None:
            self.anchors[pid] = start

    def reaped(self, pid: int) -> None:
        """The anchor is reaped (or its pid can no longer be vouched for): forget it."""
        self.anchors.pop(pid, None)
        if pid not in self.members:
            self.rows.pop(pid, None)

    def _note_leader(self, row: Row) -> None:
        pid, start = row.pid, row.start_time
        if row.pgid == pid:
            led = self.groups.get(pid)
            if led is None or led.leader_start != start:
                self.groups[pid] = Led(start, row.sid)
        if row.sid == pid:
            led = self.sessions.get(pid)
            if led is None or led.leader_start != start:
                self.sessions[pid] = Led(start)

    # -- events ------------------------------------------------------------------------

    def fork(self, parent: int, child: int) -> Optional[Claim]:
        """The stream reports that ``parent`` (a pid it follows for this lineage)
        forked the process ``child``: the child to record at once, or None."""
        self._uncover(child)  # the number names a new process: the stream proves no more
        if child in self.members or child in self.exclude:
            return None
        floor = self.members.get(parent, self.anchors.get(parent, self.floor))
        return Claim(child, floor, PARENT, parent)

    def watched(self, child: int) -> None:
        """A process was forked with a pid this lineage watches (a recorded number)."""
        self._uncover(child)

    def overrun(self) -> None:
        """Events were lost: no number is covered by the stream any more."""
        self.groups = {g: led._replace(covered=False) for g, led in self.groups.items()}
        self.sessions = {s: led._replace(covered=False) for s, led in self.sessions.items()}

    def _uncover(self, ident: int) -> None:
        led = self.groups.get(ident)
        if led is not None and led.covered:
            self.groups[ident] = led._replace(covered=False)
        led = self.sessions.get(ident)
        if led is not None and led.covered:
            self.sessions[ident] = led._replace(covered=False)

    def watch_ids(self) -> set[int]:
        """The numbers whose reuse the stream must report (see :meth:`cover`)."""
        return set(self.groups) | set(self.sessions)

    def watch(self, ids: Iterable[int]) -> None:
        """From now on the stream reports every fork of a pid in ``ids``, and only
        those: a number it no longer watches is covered no more."""
        self.watching = frozenset(ids)
        for ident in set(self.groups) | set(self.sessions):
            if ident not in self.watching:
                self._uncover(ident)

    def cover(self, held: Iterable[int]) -> None:
        """Each recorded number that the stream watches (:meth:`watch`, called
        before the rows of ``held`` were read) and that is proven held now is
        covered from here. The caller must read the stream to the end before it
        relies on a cover (a fork reported but not read yet uncovers only then).
        A number recorded after the last :meth:`watch` is not covered: forks of
        its pid were not reported to us."""
        held = set(held)
        watching = self.watching
        for g, led in list(self.groups.items()):
            if not led.covered and g in watching and self._held_in(held, 2, g):
                self.groups[g] = led._replace(covered=True)
        for s, led in list(self.sessions.items()):
            if not led.covered and s in watching and self._held_in(held, 3, s):
                self.sessions[s] = led._replace(covered=True)

    def _held_in(self, held: set[int], field: int, ident: int) -> bool:
        """A held member or anchor whose last row is in that group (2) or session (3)."""
        rows = self.rows
        for pid in held:
            row = rows.get(pid)
            if row is not None and row[field] == ident:
                return True
        return False

    # -- the rules over rows -------------------------------------------------------------

    def decide(self, rows: Iterable[Any], held: Iterable[int], now: Optional[int] = None,
               complete: bool = False, parents: Optional[Mapping[int, int]] = None,
               alive: Optional[Iterable[int]] = None) -> Decision:
        """Apply the rules to ``rows``.

        ``held``: members and anchors whose pidfd says they are not reaped, checked
        *after* their rows in ``rows`` were read (and those after the rows of the
        others). ``now``: the clock tick since boot read before the members' rows,
        for the born-inside proof of sessions. ``complete``: ``rows`` hold every
        process that could be in a recorded group or session (then an empty or
        reused number is forgotten). ``parents``: more pids whose children are
        members (pid -> start time), like the lineage's own reaper.
        ``alive``: the live members proven not reaped *after* the rows were read
        (held, or read again through a kept fd); only their children are claimed
        by the parent rule (a row's parent pid names a member only while that
        member is unreaped). None: every live member.
        """
        table = [as_row(r) for r in rows]
        held = set(held) & (set(self.members) | set(self.anchors))
        for r in table:
            if r.pid in self.members or r.pid in self.anchors:
                self.observe(r)
        self._forget(table, complete)

        groups = frozenset(g for g, led in self.groups.items()
                           if led.covered or self._held_in(held, 2, g))
        sessions = frozenset(s for s, led in self.sessions.items()
                             if led.covered or self._held_in(held, 3, s))
        if now is not None:
            for s in sessions:
                self.sessions[s] = self.sessions[s]._replace(proven_at=now)

        extra = parents
        live = self.members if alive is None else set(alive) & set(self.members)
        parents = {p: self.members[p] for p in live}
        parents.update({p: self.anchors[p] for p in held if p in self.anchors})
        if extra:
            parents.update(extra)
        kids: dict[int, list[Row]] = {}
        for r in table:
            kids.setdefault(r.ppid, []).append(r)
        claims: list[Claim] = []
        suspects: list[Claim] = []
        claimed: set[int] = set()

        def by_parent(parent: int, start: int) -> None:
            todo = [(parent, start)]
            while todo:
                p, st = todo.pop()
                for k in kids.get(p, ()):
                    if (k.start_time >= st and k.pid not in claimed and self._open(k)):
                        claimed.add(k.pid)
                        claims.append(Claim(k.pid, st, PARENT, p, k.start_time))
                        todo.append((k.pid, k.start_time))

        for p, st in parents.items():
            by_parent(p, st)
        for r in table:
            if r.pid in claimed or not self._open(r):
                continue
            through = self._through(r, groups, sessions)
            if through is None:
                continue
            claim, proven = through
            if proven:
                claimed.add(r.pid)
                claims.append(claim)
                by_parent(r.pid, r.start_time)
            else:
                suspects.append(claim)
        suspects = [s for s in suspects if s.pid not in claimed]
        return Decision(tuple(claims), tuple(suspects), groups, sessions)

    def _open(self, r: Row) -> bool:
        """Could r become a member at all? (Not one already, not excluded, not ended.)"""
        return (r.pid not in self.members and r.pid not in self.anchors
                and r.pid not in self.exclude and not row_ended(r.state, r.num_threads))

    def _through(self, r: Row, groups: frozenset[int],
                 sessions: frozenset[int]) -> Optional[tuple[Claim, bool]]:
        """The group or session claim for r, and whether it is proven; None if none."""
        found: Optional[tuple[Claim, bool]] = None
        led = self.groups.get(r.pgid)
        if led is not None and r.start_time >= led.leader_start:
            found = (Claim(r.pid, led.leader_start, GROUP, r.pgid, r.start_time),
                     r.pgid in groups)
            if found[1]:
                return found
        led = None if r.sid is None else self.sessions.get(r.sid)
        if led is not None and r.sid is not None and r.start_time >= led.leader_start:
            proven = r.sid in sessions or (led.proven_at is not None
                                           and r.start_time < led.proven_at
                                           and r.pid != r.sid)
            if proven or found is None:
                return (Claim(r.pid, led.leader_start, SESSION, r.sid, r.start_time), proven)
        return found

    def _forget(self, table: list[Row], complete: bool) -> None:
        """Forget a record whose number a newer process holds as its pid (the number
        was free in between), and, where the rows are complete, an empty one."""
        by_pid = {r.pid: r for r in table}
        in_group = {r.pgid for r in table}
        in_session = {r.sid for r in table if r.sid is not None}
        # A row whose session the kernel did not say could be in any: no session is
        # known empty then.
        sessions_complete = complete and all(r.sid is not None for r in table)
        for member_pid in list(self.members) + list(self.anchors):
            row = self.rows.get(member_pid)
            if row is not None:
                in_group.add(row.pgid)
                if row.sid is not None:
                    in_session.add(row.sid)

        def over(ident: int, led: Led, used: set[int], known: bool) -> bool:
            if known and ident not in used:
                return True  # empty: over for good
            holder = by_pid.get(ident)
            return holder is not None and holder.start_time != led.leader_start

        self.groups = {g: led for g, led in self.groups.items()
                       if not over(g, led, in_group, complete)}
        self.sessions = {s: led for s, led in self.sessions.items()
                         if not over(s, led, in_session, sessions_complete)}


# --- the first round's pure function, on the same rules ------------------------------


class ScanResult(NamedTuple):
    """What one application of the rules to one whole table decided."""

    members: dict[int, int]
    """Every member now, pid -> start_time (recorded zombies included: they still hold
    their group's number)."""
    groups: dict[int, int]
    """Process groups led by a member, pgid -> the leader's start_time."""
    sessions: dict[int, int]
    """Sessions led by a member, sid -> the leader's start_time."""
    new: list[int]
    """Members this table added, in the order they were found."""
    dropped: list[int]
    """Recorded members whose pid is gone or names another process now."""
    suspects: tuple[int, ...] = ()
    """In a recorded group or session that no recorded member in the table (nor
    ``covered``) proves to be the recorded one: never members."""


def scan_members(
    table: Iterable[Any],
    members: Mapping[int, int],
    groups: Mapping[int, int] = {},
    sessions: Mapping[int, int] = {},
    covered: Iterable[int] = (),
) -> ScanResult:
    """The rules (see the module) applied to one whole table, as the first round's
    scan did it: a compatibility function over :class:`Membership`.

    ``table`` holds rows with ``pid, ppid, pgid, sid, start_time`` (``Proc`` rows,
    named tuples, or plain tuples); ``members`` the members recorded so far (pid ->
    start_time); ``groups`` and ``sessions`` those recorded as led by a member (id ->
    the leader's start_time); ``covered`` the ids an unbroken event stream covers.
    Every recorded member found in the table with its start time is taken as held
    (a caller that holds no pidfds must not claim more than that). The result is a
    fixpoint: applied again to the same table it adds nothing.
    """
    rows = [as_row(r) for r in table]
    by_pid = {r.pid: r for r in rows}
    kept = {p: s for p, s in members.items() if p in by_pid and by_pid[p].start_time == s}
    dropped = [p for p in members if p not in kept]
    floor = min(kept.values(), default=0)
    core = Membership(floor)
    cov = set(covered)
    for g, s in groups.items():
        core.groups[g] = Led(s, None, g in cov)
    for s_, s in sessions.items():
        core.sessions[s_] = Led(s, None, s_ in cov)
    for p in kept:
        core.add(by_pid[p])
    new: list[int] = []
    suspects: tuple[Claim, ...] = ()
    while True:
        d = core.decide(rows, set(core.members), complete=True)
        suspects = d.suspects
        if not d.claims:
            break
        for c in d.claims:
            core.add(by_pid[c.pid])
            new.append(c.pid)
    return ScanResult(
        dict(core.members),
        {g: led.leader_start for g, led in core.groups.items()},
        {s: led.leader_start for s, led in core.sessions.items()},
        new,
        dropped,
        tuple(c.pid for c in suspects),
    )
