"""The subreaper backend: everything below the lineage's own reaper is a member.

``Lineage.spawn`` runs the lineage's native helper (:mod:`._helper`,
``proctable-lineage reap``): the caller's Popen is a *mirror* (``pt-mirror``) that
passes on every signal sent to it and exits with the command's status, and below it
the *reaper* (``pt-reaper``, ``PR_SET_CHILD_SUBREAPER``) starts the command and
adopts every orphan of the run, so nothing escapes upward. A sample walks down from
the reaper through ``/proc/<pid>/task/<tid>/children`` (kept fds: one pread per
member). The reaper stays until this backend releases it (a line on its control
pipe) and nothing is left below it; if this process dies first, the control pipe's
end (and a pidfd of this process) tells it to kill everything below it.

On a kernel without those files (``CONFIG_PROC_CHILDREN`` off; pretend with
``PROCTABLE_DISABLE=proc_children``) the walk cannot see anything, which must
never read as "no members": the backend falls back to listing /proc by (pid,
inode) and following parents down from the reaper. That look's cost grows with
the host (the listing), not only with the lineage.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from typing import Any, Callable, Optional

from .. import _ended, _pidfd
from .._fdwait import readable
from ..errors import ProctableError
from ..table import Identity, Proc, _has_pidfs
from . import _helper
from ._backend import Backend, BackendUnavailable
from ._members import (
    Listing,
    Member,
    NoChildrenFile,
    boot_ticks,
    children_of,
    fake_row,
    pidfd_open,
    read_safe,
)

__all__ = ["SubreaperBackend"]

log = logging.getLogger("proctable.lineage")

EXACT_WALK_SECONDS = 2.0
"""How often a walk counts every member's threads again."""
LIST_BUDGET = 0.01
"""Without children files, the share of a core the listing of /proc may take: it runs
every interval, or less often on a host where one listing costs more."""

# Why this host refuses PR_SET_CHILD_SUBREAPER (a sandbox that denies the prctl), once a
# reaper said so: from then on the reaper backends are not tried again.
_denied: Optional[str] = None


def _pin_child(pid: int, parent: Optional[Member], parent_fd: Optional[int]) -> Optional[Member]:
    """A helper that is parent's child, pinned by a pidfd opened while parent is
    proven alive after it (an unreaped child's pid names no other process); None
    where that cannot be proven or no pidfd is to be had."""
    if parent is None or parent_fd is None:
        return None
    try:
        fd = pidfd_open(pid)
    except ProcessLookupError:
        return None
    if fd is None:
        return None
    row = read_safe(pid)
    if (row is None or row.ppid != parent.pid or _ended.pidfd_ended(fd)
            or _ended.pidfd_ended(parent_fd)):
        os.close(fd)
        return None
    return Member(pid, row.start_time, fd, row)


class SubreaperBackend(Backend):
    mode = "subreaper"

    @classmethod
    def usable(cls, cgroup_parent: Optional[str]) -> Optional[Any]:
        return None if _denied is not None else True

    @classmethod
    def refusal(cls, cgroup_parent: Optional[str]) -> Exception:
        return ProctableError(f"mode={cls.mode!r} needs PR_SET_CHILD_SUBREAPER, which this "
                              f"host denies ({_denied}); use mode='scan'")

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.reaper: Optional[Member] = None
        self.reaper_fd: Optional[int] = None
        self.control_w: Optional[int] = None  # "release" here lets the reaper end
        self.cgroup_parent: Optional[str] = None  # cgroup mode: the reaper makes one here
        self.home: Optional[str] = None  # ... and moves back to this one (its own)
        self.made_cgroup: Optional[str] = None  # ... and this is the one it made
        self.inside = False  # the reaper stayed in that cgroup (could not move back)
        self.no_children = False
        self.reaper_dead = False
        self.listing: Optional[Listing] = None
        self.next_list = 0.0
        self.next_exact = 0.0
        # A durable session's keeper as the reaper: how to release it (instead of the
        # control pipe), and its guard process, which ends after it.
        self.release_keeper: Optional[Callable[[], None]] = None
        self.keeper_guard: Optional[Identity] = None
        # cgroup mode: the reaper's guard (pt-guard), pinned by a pidfd while it was
        # the live reaper's unreaped child; ended here if the reaper dies before it.
        self.guard: Optional[Member] = None
        self.let_go = False  # a durable session left running: its keeper keeps it all

    # -- start ----------------------------------------------------------------------

    def spawn(self, args: list[Any], popen_kwargs: dict[str, Any]) -> Member:
        e = self.e
        kw = dict(popen_kwargs)
        terminal = kw.pop("terminal", None)
        filename = kw.get("executable") or args[0]
        ignore = kw.pop("ignore_signals", [])
        fds: list[int] = []  # ours to close, whatever happens
        control_w = -1
        tell: Optional[int] = None
        # The status comes on a Unix socket: the reaper says "ok" as soon as the
        # command is forked, and passes the pipe on which the command itself tells
        # how its exec went (so we learn it without waiting for the reaper to wake).
        status_sock, peer = socket.socketpair()
        try:
            status_w = peer.detach()
            fds.append(status_w)
            exit_r, exit_w = os.pipe()
            fds += [exit_r, exit_w]
            control_r, control_w = os.pipe()
            fds += [control_r, control_w]
            extra = ["--exit-fd", str(exit_w), "--control-fd", str(control_r)]
            if self.cgroup_parent is not None:
                extra += ["--cgroup-parent", self.cgroup_parent]
                if self.home is not None:
                    extra += ["--home", self.home]
            argv = _helper.prepare("reap", args, kw, status_w, terminal=terminal,
                                   ignore=ignore, extra=tuple(extra))
            kw["pass_fds"] = (*kw["pass_fds"], exit_w, control_r)
            # The Popen owns exit_r from here on, also when it raises (no second close).
            fds.remove(exit_r)
            proc = e.popen(argv, kw, exit_fd=exit_r)
            for fd in (status_w, exit_w, control_r):
                os.close(fd)
                fds.remove(fd)
            line, tell = _helper.read_status_passing(status_sock, 30.0)
        except BaseException:
            if control_w in fds:
                fds.remove(control_w)
                os.close(control_w)
            raise
        finally:
            status_sock.close()
            for fd in fds:
                if fd != control_w:
                    os.close(fd)
        if line and line[0] == b"ok":
            self.control_w = control_w
        else:
            os.close(control_w)  # the reaper ended already, or ends now
            if tell is not None:
                os.close(tell)
                tell = None
        if line and line[0] == b"nosubreaper":
            global _denied
            _denied = b" ".join(line[2:]).decode(errors="replace")
            raise BackendUnavailable(f"this host denies PR_SET_CHILD_SUBREAPER ({_denied}): "
                                     f"mode={self.mode!r} cannot work here")
        if not line or line[0] != b"ok":
            _helper.raise_error(line, filename)
        if tell is not None:  # how the command's exec went, told by the command itself
            err = _helper.exec_outcome(tell, 30.0)
            if err is not None:  # (the reaper ends, and takes its cgroup away)
                _helper.raise_error([b"error", str(err).encode(),
                                     f"{os.fsdecode(filename)}: {os.strerror(err)}".encode()],
                                    filename)
        reaper, cmd, cmd_start, inside = (int(x) for x in line[1:5])
        # The reaper's pidfd of the command, opened while it was an unreaped child:
        # its pidfs handle, even where the command is gone before we can look.
        handle = int(line[5]) if len(line) > 5 and _has_pidfs() else 0
        if len(line) > 6 and line[6] != b"-":
            self.made_cgroup = os.fsdecode(line[6])
        self.inside = bool(inside)
        # cgroup mode: the guard that ends the cgroup if the caller's whole process
        # group is killed (a child of the reaper, never a member).
        guard = int(line[7]) if len(line) > 7 else 0
        e.core.exclude.update({proc.pid, reaper} | ({guard} if guard > 0 else set()))
        rrow = read_safe(reaper)
        if rrow is not None:
            try:
                self.reaper_fd = pidfd_open(reaper)
            except ProcessLookupError:
                self.reaper_fd = None
            self.reaper = Member(reaper, rrow.start_time, None, rrow)
        if guard > 0:
            self.guard = _pin_child(guard, self.reaper, self.reaper_fd)
        self.spawned_cgroup()
        try:
            return e.pin(cmd, cmd_start, handle or None)
        except ProctableError:
            # The command ended already (the reaper reaped it): nothing to pin.
            m = Member(cmd, cmd_start, None, fake_row(cmd, cmd_start))
            m.handle = handle or None
            return m

    def take_keeper(self, keeper: Identity, guard: Identity, command: Identity,
                    cgroup: Optional[str], inside: bool,
                    release: Callable[[], None]) -> Member:
        """Take a durable session's keeper as this lineage's reaper (a new session, or
        one re-adopted after a restart): the keeper is a subreaper that made the
        cgroup and started the command, as the reaper of a spawn does; ``release``
        tells it that the lineage is torn down. The root member, or a stand-in
        where the command has ended already (a fake row: never signalled)."""
        e = self.e
        e.core.exclude.update({keeper.pid, guard.pid})
        try:
            fd = pidfd_open(keeper.pid)
        except ProcessLookupError:
            fd = None
        row = read_safe(keeper.pid)
        if row is None or row.start_time != keeper.start_time or (
                fd is not None and _ended.pidfd_ended(fd)):
            if fd is not None:
                os.close(fd)
            raise ProctableError(f"the session's keeper (pid {keeper.pid}) is gone")
        self.reaper_fd = fd
        self.reaper = Member(keeper.pid, row.start_time, None, row)
        self.keeper_guard = guard
        self.release_keeper = release
        self.made_cgroup = cgroup
        self.inside = inside
        self.spawned_cgroup()
        try:
            return e.pin(command.pid, command.start_time, command.handle)
        except ProctableError:  # it ended while nobody watched (the keeper reaped it)
            m = Member(command.pid, command.start_time, None,
                       fake_row(command.pid, command.start_time))
            m.handle = command.handle
            return m

    def spawned_cgroup(self) -> None:
        """The reaper made the lineage's cgroup (cgroup mode): take it over."""

    def release_reaper(self) -> None:
        """Tell the reaper it may end once nothing is left below it (never from a
        forked copy of this process: the reaper belongs to the process that spawned it)."""
        release, self.release_keeper = self.release_keeper, None
        if release is not None:
            if os.getpid() == self.e.owner:
                release()
            return
        fd, self.control_w = self.control_w, None
        if fd is None:
            return
        try:
            if os.getpid() == self.e.owner:
                os.write(fd, b"release\n")
        except OSError:
            pass  # the reaper is gone already
        finally:
            os.close(fd)

    # -- sampling ---------------------------------------------------------------------

    def _reaper_lost(self) -> bool:
        """The reaper ended while the lineage still has members (killed from
        outside: it only ends once nothing is left below it)."""
        r = self.reaper
        if r is None or self.reaper_dead:
            return self.reaper_dead
        if not self.e.reg.live:
            return False
        if self.reaper_fd is not None:
            gone = _ended.pidfd_ended(self.reaper_fd)
        else:
            gone = _ended.ended(None, read_safe(r.pid), r.start)
        if gone:
            self.reaper_dead = True
            log.warning("lineage: its reaper (pid %d) died while members run: orphans now "
                        "re-parent past it; teardown ends the members it knows", r.pid)
            # Nothing stays below the reaper any more: follow fork events of forks
            # (a child whose parent exits at once is found by its fork, as in scan
            # mode), and walk down from every member rather than from the reaper.
            if self.walks_past_reaper():
                sub = self.e.sub
                if sub is not None:
                    sub.follow()
        return self.reaper_dead

    def walks_past_reaper(self) -> bool:
        """Whether a dead reaper leaves the members' structure to be followed (not
        while a cgroup still holds them all)."""
        return True

    def health(self) -> list[str]:
        if self.reaper is not None and self._reaper_lost():
            return [f"the lineage's reaper (pid {self.reaper.pid}) died while members ran: "
                    "a process orphaned since then re-parents past it and may escape; "
                    "the members recorded are still ended by teardown"]
        return []

    def sample(self, full: bool) -> bool:
        self._reaper_lost()
        if not self.no_children:
            now = time.monotonic()
            exact = full or now >= self.next_exact
            if exact:  # count threads again (a thread's children are in its own file)
                self.next_exact = now + EXACT_WALK_SECONDS
            try:
                self._walk(exact)
            except NoChildrenFile:
                self.no_children = True
                log.debug("lineage: no /proc/<pid>/task/<tid>/children here: listing /proc")
            else:
                return True
        now = time.monotonic()
        if not full and now < self.next_list:
            return True  # everything stays below the reaper meanwhile: only found later
        cpu = time.thread_time()
        try:
            return self._list()
        finally:
            cost = time.thread_time() - cpu
            self.next_list = now + max(self.e.interval, cost / LIST_BUDGET)

    def _walk(self, exact: bool = True) -> None:
        """Walk down from the reaper (a hint: ppid and start time are re-checked
        before a pid is recorded). Not ``exact``: each member's thread count as last
        counted, so a child of a thread started since is found by the next exact
        walk (it stays below the reaper meanwhile, and teardown walks exactly)."""
        reaper = self.reaper
        if reaper is None:
            return
        reg = self.e.reg
        todo = [reaper] if not self.reaper_dead else list(reg.live.values())
        seen: set[int] = set()
        while todo:
            node = todo.pop()
            for pid in children_of(node, exact):
                if pid in seen:
                    continue
                seen.add(pid)
                m = reg.live.get(pid)
                if m is None:
                    m = reg.record_child(pid, node)
                if m is not None:
                    todo.append(m)

    def _list(self) -> bool:
        """No children files: list /proc and follow parents down from the reaper."""
        reaper = self.reaper
        if reaper is None:
            return True
        if self.listing is None:
            self.listing = Listing()
        e = self.e
        new, listed = self.listing.refresh()
        if not listed:
            return False
        for _ in range(8):
            now = boot_ticks()
            member_rows = e.member_rows()
            held = e.reg.held()
            d = e.core.decide([*new, *member_rows], held, now,
                              parents={reaper.pid: reaper.start})
            added = [c for c in d.claims
                     if e.reg.record(c.pid, c.floor, ppid=c.ident, start=c.start_time)]
            if not added:
                break
        reg = e.reg
        # A row whose parent is not known (it exited before it could be read) is
        # read again next time: by then it shows the reaper as its parent.
        self.listing.forget(r.pid for r in new if r.pid not in reg.live
                            and r.ppid not in (0, 1, reaper.pid)
                            and (r.ppid in reg.anchors or self.listing.get(r.ppid) is None))
        return True

    def below_reaper(self) -> Optional[list[int]]:
        """The reaper's children now, or None where that cannot be known."""
        if self.reaper is None:
            return None
        if self.reaper_fd is not None and _ended.pidfd_ended(self.reaper_fd):
            return []  # it ends only once nothing is left below it
        if not self.no_children:
            try:
                return children_of(self.reaper)
            except NoChildrenFile:
                self.no_children = True
        listing = self.listing or Listing()
        self.listing = listing
        listing.refresh()
        return [pid for pid, (_, row) in listing.rows.items() if row.ppid == self.reaper.pid]

    def proven_empty(self) -> bool:
        kids = self.below_reaper()
        return kids is not None and not [p for p in kids if p not in self.e.core.exclude]

    def strays(self) -> list[Proc]:
        out = []
        for pid in self.below_reaper() or []:
            row = read_safe(pid)
            if row is not None and pid not in self.e.reg.live:
                out.append(row)
        return out

    # -- the end --------------------------------------------------------------------------

    def finish(self, timeout: float) -> None:
        """Every member is gone: let the reaper and the mirror end (bounded)."""
        deadline = time.monotonic() + timeout
        self.release_reaper()
        if self.reaper_fd is not None:
            readable([self.reaper_fd], max(0.0, deadline - time.monotonic()))
            self._reap_reaper()
        elif self.reaper is not None:
            # No pidfd here (pidfd_open denied): its row says when it has ended.
            # Without this wait, teardown returned while the reaper was still on
            # its way out (1 in 30 here with two CPU burners beside).
            r, nap = self.reaper, 0.002
            while not _ended.ended(None, read_safe(r.pid), r.start):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(nap, left))
                nap = min(nap * 2, 0.05)
        self._end_guard(max(0.05, deadline - time.monotonic()))
        guard = self.keeper_guard
        if guard is not None:  # a keeper's guard ends after it: wait for that too
            from ._session import reap_if_ours, wait_gone  # noqa: PLC0415

            if wait_gone(guard, max(0.05, deadline - time.monotonic())):
                reap_if_ours(guard)
        self.e.wait_process(max(0.05, deadline - time.monotonic()))

    def _end_guard(self, timeout: float) -> None:
        """The reaper has ended: its guard must be gone too before a teardown is
        reported. The reaper's own end reaps it; a reaper killed from outside left
        it running, re-parented, until it sees the cgroup removed (up to 2 s): it is
        ended by its pidfd and waited for (bounded)."""
        g = self.guard
        if g is None or g.fd is None:
            return
        if self.reaper_fd is not None and not _ended.pidfd_ended(self.reaper_fd):
            return  # the reaper lives on (its wait ran out): it ends its guard itself
        if not _ended.pidfd_ended(g.fd):
            try:
                _pidfd.signal_pinned(g.pid, g.start, g.fd, signal.SIGKILL)
            except PermissionError:
                return
            readable([g.fd], timeout)

    def _reap_reaper(self) -> None:
        """Reap the reaper if it re-parented to us (we are a subreaper, or pid 1)."""
        r = self.reaper
        if r is None or self.reaper_fd is None:
            return
        if not _pidfd.features().waitid_pidfd:
            # waitid(P_PID) only for a zombie child of ours with the reaper's start
            # time: an unreaped child's pid cannot name another process.
            row = read_safe(r.pid)
            if row is None or row.ppid != os.getpid() or row.start_time != r.start \
                    or row.state != "Z":
                return
        _pidfd.reap_child(r.pid, self.reaper_fd)

    def close(self) -> None:
        self.release_reaper()
        if self.guard is not None:
            self.guard.close()
            self.guard = None
        if self.reaper is not None:
            self.reaper.close()
        if self.reaper_fd is not None:
            os.close(self.reaper_fd)
            self.reaper_fd = None

