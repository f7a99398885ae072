"""The scan backend: membership rules over what /proc shows, for a running root.

This is what ``Lineage(root)`` gets (a process the lineage did not start), and
``Lineage.spawn(..., mode="scan")``. Nothing keeps an orphan in sight here, so
the rules (:mod:`._core`) decide: a child of a member, or a process in a group or
session a member leads or led that is *proven* to be that very group or session.

What a sample costs, in proportion to the lineage, not to the host:

- each tick (``interval``): the members' ``/proc/<pid>/task/<tid>/children`` and
  stat lines through kept fds (a new child is recorded at once);
- with the proc connector, a fork of a member's child is recorded when the event
  arrives (before its parent could exit and orphan it), an exit ends a member;
- a full look (every ``FULL_SCAN_SECONDS``, after lost events, and for
  ``members()``, ``sample()`` and teardown): /proc listed by (pid, inode), stat
  read only for processes not seen before and for those in the sessions of the
  recorded groups (whose group may have changed), then the rules.

So a process that joins a member-led group with ``setpgid`` (no event reports
that) is found by the next full look, at most ``FULL_SCAN_SECONDS`` later; so is
an orphan whose parent exited between two ticks without the connector.

A spawned command carries the lineage's environment marker
(``PROCTABLE_LINEAGE=<token>``, a random token per lineage, added to what a lineage
it runs in put there), and so does everything it starts that keeps its
environment: a full look claims each process started since the command that
carries it (its pidfd opened before its environment and its row are read), so an
orphan whose parent exited between two ticks, in a session of its own, is found
even without the connector. Only a process whose environment we may read (our
own uid's, or any as root) can be claimed so; its ``environ`` is read through a
live thread where its main thread exited.

What no rule over /proc can see: a process a member starts with
``clone(CLONE_PARENT)``. Its parent is the member's parent, outside the lineage,
and the connector's fork event names that parent too (the kernel reports the new
task's real parent, not the caller), so only a group or session the lineage holds,
or (spawned) the marker, can make it a member. ``health`` says so for every scan
lineage (:data:`CLONE_PARENT_LIMIT`; :data:`MARKER_LIMIT` for a spawned one).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping
from typing import Any, Optional

from .._ended import row_ended
from ..table import Proc
from . import _helper
from ._backend import Backend
from ._core import Claim, as_row
from ._members import (
    Listing,
    Member,
    NoChildrenFile,
    boot_ticks,
    carries_marker,
    children_of,
    stat_of,
)
from ._pdeath import on_lasting_thread

__all__ = ["CLONE_PARENT_LIMIT", "FULL_SCAN_BUDGET", "FULL_SCAN_SECONDS", "MARKER_ENV",
           "MARKER_LIMIT", "ScanBackend", "with_marker"]

FULL_SCAN_SECONDS = 2.0
"""The slow period of the full look (the tick between them is the lineage's interval)."""
FULL_SCAN_BUDGET = 0.0025
"""The share of a core full looks may take on average: on a host where one look costs
more than FULL_SCAN_SECONDS allows, the period stretches (5 ms a look: 2 s; 20 ms: 8 s)."""

CLONE_PARENT_LIMIT = (
    "scan mode cannot see a process that a member starts with clone(CLONE_PARENT): its "
    "parent is the member's parent, outside the lineage, and the kernel's fork event names "
    "that parent too; unless it is in a group or session the lineage holds, it is not a "
    "member and outlives teardown")
"""The standing limit of an attached scan lineage that :meth:`ScanBackend.health` names."""

MARKER_LIMIT = (
    "scan mode finds a process that a member starts with clone(CLONE_PARENT), or whose "
    "parent exits between two looks, only by the lineage's environment marker "
    "(PROCTABLE_LINEAGE) or a group or session the lineage holds: one that replaced its "
    "environment (env -i, an exec with an environment of its own) is not a member "
    "and outlives teardown")
"""The standing limit of a spawned scan lineage that :meth:`ScanBackend.health` names."""

_ROUNDS = 8  # looks in a row while a full look keeps finding members (groups they lead)

MARKER_ENV = "PROCTABLE_LINEAGE"
"""The environment variable that marks a scan-mode spawn's processes (comma-separated
tokens: one per lineage the process runs in)."""
_MARKER_NAME = MARKER_ENV.encode()
_UNSURE_LOOKS = 3  # full looks at which an empty environment (mid-exec) is read again


def with_marker(env: Optional[Mapping[Any, Any]], token: str) -> dict[Any, Any]:
    """``env`` (None: this process's environment) with ``token`` added to the
    marker variable (kept: a lineage this command runs in finds it too)."""
    out = dict(os.environ if env is None else env)
    words = []
    for key in (MARKER_ENV, MARKER_ENV.encode()):  # Popen takes str or bytes keys
        old = out.pop(key, None)
        if old:
            words.append(os.fsdecode(old))
    out[MARKER_ENV] = ",".join([*words, token])
    return out


class ScanBackend(Backend):
    mode = "scan"
    attachable = True
    follows_forks = True

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.listing = Listing()
        self.full_period = FULL_SCAN_SECONDS
        self.period = FULL_SCAN_SECONDS  # stretched by FULL_SCAN_BUDGET
        self.last_full = 0.0
        self.no_children = False  # this kernel has no children files: tick by listing
        self.stream_checked = -1  # the stream's overrun count at the last full look
        self.marker: Optional[bytes] = None  # the token a spawned command carries
        self.unsure: dict[tuple[int, int], int] = {}  # (pid, start): empty environ read

    # -- start ----------------------------------------------------------------------

    def spawn(self, args: list[Any], popen_kwargs: dict[str, Any]) -> Member:
        e = self.e
        # Follow our own forks until the command's pid is known: its first forks
        # (before it could be tracked) are then handed over too. Forks of ours that
        # are not the command are left alone: only a member's forks are recorded.
        e.follow_own_forks()
        kw = dict(popen_kwargs)
        terminal = kw.pop("terminal", None)
        filename = kw.get("executable") or args[0]
        ignore = kw.pop("ignore_signals", [])
        token = secrets.token_hex(16)
        kw["env"] = with_marker(kw.get("env"), token)
        self.marker = token.encode()
        status_r, status_w = os.pipe()
        try:
            # The helper (proctable-lineage exec) prepares the command's signal state
            # and terminal and execs it in place, so the Popen is the command itself.
            # No reaper stands between us and the command: the helper has the kernel
            # kill it if we die (PR_SET_PDEATHSIG, kept across its exec; started on a
            # thread that lives as long as this process). Its own children do not
            # inherit that: only the reaper modes catch them then (docs/lineage.md).
            argv = _helper.prepare("exec", args, kw, status_w, terminal=terminal,
                                   ignore=ignore)
            proc = on_lasting_thread(lambda: e.popen(argv, kw))
            os.close(status_w)
            status_w = -1
            words = _helper.read_status(status_r, 30.0)
        finally:
            for fd in (status_r, status_w):
                if fd >= 0:
                    os.close(fd)
        if words:  # the exec failed: the helper said why (and exits; spawn reaps it)
            _helper.raise_error(words, filename)
        return e.pin(proc.pid, None, None)

    def attach(self, pid: int, start: Optional[int], handle: Optional[int]) -> Member:
        return self.e.pin(pid, start, handle)

    def health(self) -> list[str]:
        # Not a breakage but a standing blind spot: said for every scan lineage, with
        # the way out where there is one (a command it started; an attached one has none).
        if self.marker is not None:
            return [MARKER_LIMIT + " (spawn with mode='subreaper' or 'cgroup', as "
                    "'auto' does where it can, to keep it)"]
        return [CLONE_PARENT_LIMIT + " (a running process can only be attached by scanning: "
                "start the command with Lineage.spawn and a reaper mode to keep it)"]

    # -- sampling ---------------------------------------------------------------------

    def sample(self, full: bool) -> bool:
        now = time.monotonic()
        full = full or now - self.last_full >= self.period
        if full:
            self.last_full = now
            self.stream_checked = self.e.overruns_seen()
            cpu = time.thread_time()
            try:
                return self._look(full=True)
            finally:
                # The slow period stretches where one full look costs more than
                # FULL_SCAN_BUDGET of a core allows (a host of many thousand processes).
                cost = time.thread_time() - cpu
                self.period = max(self.full_period, cost / FULL_SCAN_BUDGET)
        if self.e.stream_unbroken() and self.stream_checked == self.e.overruns_seen():
            # Every fork of a member since the last full look was reported, and
            # recorded as it came: nothing for a walk to find.
            return True
        return self._look(full=False)

    def _look(self, full: bool) -> bool:
        if not full and self.no_children:
            return True  # no children files here: only full looks (and events) find them
        if not self.no_children:
            try:
                self._walk(stats=full)
            except NoChildrenFile:
                self.no_children = True
        return self._full() if full else True

    def _walk(self, stats: bool) -> None:
        """Each live member's children (recorded at once), and with ``stats`` its
        stat line (a group or session it leads now)."""
        e = self.e
        reg = e.reg
        todo = list(reg.live.values())
        seen: set[int] = set()
        while todo:
            m = todo.pop()
            if m.pid in seen:
                continue
            seen.add(m.pid)
            for pid in children_of(m):
                if pid in reg.live or pid in e.core.exclude:
                    continue
                child = reg.record_child(pid, m)
                if child is not None:
                    todo.append(child)
            if stats:
                row = stat_of(m)
                if row is not None:
                    m.proc = row
                    e.core.observe(as_row(row))

    def _full(self) -> bool:
        e = self.e
        core = e.core
        e.events()
        new, listed = self.listing.refresh()
        if not listed:
            return False
        sessions = {led.session for led in core.groups.values() if led.session is not None}
        sessions |= set(core.sessions)
        fresh = {r.pid: r for r in new}
        if sessions:
            stale = [p for p in self.listing.in_sessions(sessions) if p not in fresh]
            for r in self.listing.reread(stale):
                fresh[r.pid] = r
        for ident in core.watch_ids():  # who holds each recorded number as a pid
            if ident not in fresh:
                got = self.listing.get(ident)
                if got is not None:
                    fresh[ident] = got
        if self.marker is not None:
            self._claim_marked(new)
        candidates = list(fresh.values())
        decision = None
        for _ in range(_ROUNDS):
            # The stream is told every number recorded so far (the last round's new
            # members may lead some) before their proof is read: a number is covered
            # only from a moment the forks of its pid were reported to us.
            e.watch_numbers()
            now = boot_ticks()
            member_rows = e.member_rows()  # after the candidates' rows, before held
            for row in member_rows:
                core.observe(as_row(row))  # cover by what they are in now
            held = e.reg.held()
            if e.stream_unbroken():
                core.cover(held)
            # Read the socket to the end (not only what the hub thread handed out
            # so far, which may lag on a loaded host): the fork of every process
            # the candidates' rows could show was queued before those rows were
            # read, and a fork with a recorded number's pid uncovers it now.
            e.events(sync=True)
            # A member's child by its row's parent pid only while the member is
            # proven unreaped after the rows were read (it may have died and its pid
            # been reused since the look began): held, or (no pidfd) read just now.
            alive = held | {r.pid for r in member_rows if r.pid in e.reg.live
                            and e.reg.live[r.pid].fd is None}
            decision = core.decide([*candidates, *member_rows], held, now, complete=True,
                                   alive=alive)
            added = [c for c in decision.claims if self._record(c) is not None]
            if not added:
                break
            if not self.no_children:
                try:
                    self._walk(stats=True)  # what the new members started before they were seen
                except NoChildrenFile:
                    self.no_children = True
        self._settle(new, decision.claims if decision is not None else ())
        by_pid = {r.pid: r for r in candidates}
        e.suspects = [(c, by_pid[c.pid]) for c in
                      (decision.suspects if decision is not None else ()) if c.pid in by_pid]
        return True

    def _claim_marked(self, new: list[Proc]) -> None:
        """Record every process not seen before that carries the lineage's marker:
        started no earlier than the command, and (unless we are root) of our uid,
        whose environment alone we may read. One caught with an empty environment
        (mid-exec) is read again at the next few full looks."""
        marker = self.marker
        assert marker is not None
        said: list[Optional[bool]] = []  # what check() read for this row

        def check(pid: int) -> bool:
            said.append(carries_marker(pid, _MARKER_NAME, marker))
            return said[-1] is True

        e = self.e
        reg, core = e.reg, e.core
        euid = os.geteuid()
        again = []
        listed = self.listing.rows
        self.unsure = {k: n for k, n in self.unsure.items() if k[0] in listed}
        for r in new:
            if (r.pid in reg.live or r.pid in reg.anchors or r.pid in core.exclude
                    or r.start_time < core.floor or r.pid == 2 or r.ppid == 2  # kthreads
                    or row_ended(r.state, r.num_threads)
                    or (euid != 0 and r.uid is not None and r.uid != euid)):
                continue
            said.clear()
            if reg.record(r.pid, core.floor, start=r.start_time, check=check) is not None:
                self.unsure.pop((r.pid, r.start_time), None)
                continue
            if said and said[-1] is None:
                key = (r.pid, r.start_time)
                left = self.unsure.get(key, _UNSURE_LOOKS)
                if left > 0:
                    self.unsure[key] = left - 1
                    again.append(r.pid)  # listed anew (and read again) next time
                else:
                    del self.unsure[key]
        self.listing.forget(again)

    def _record(self, c: Claim) -> Optional[Member]:
        reg = self.e.reg
        if c.via == "parent":
            return reg.record(c.pid, c.floor, start=c.start_time, ppid=c.ident)
        if c.via == "group":
            return reg.record(c.pid, c.floor, start=c.start_time, pgid=c.ident)
        return reg.record(c.pid, c.floor, start=c.start_time, sid=c.ident)

    def _settle(self, new: list[Proc], claims: Any) -> None:
        """Keep the rows just read, except those whose parent could not be told
        (read again next time: a re-parented orphan shows its new parent then)."""
        reg = self.e.reg
        unclear = [r.pid for r in new
                   if r.pid not in reg.live and r.ppid not in reg.live
                   and (r.ppid in reg.anchors or self.listing.get(r.ppid) is None)
                   and r.ppid > 1]
        self.listing.forget(unclear)
