"""Recorded members and the /proc reads every backend shares (the thin I/O layer).

- :class:`Member`: a recorded member, with the pidfd opened *before* its row was
  read (so the pid, the start time and the pidfs handle name one process), and the
  /proc fds kept open for cheap re-reads (a kept fd answers ESRCH once its process
  is reaped, so it can never read a process that reused the pid).
- :class:`Registry`: the live members, the ended ones not yet known to be reaped
  (anchors: they may still hold their group's number), signals through pidfds,
  and the one predicate (:mod:`proctable._ended`) applied to all of them.
- :func:`children_of` / :func:`stat_of`: the O(lineage) walk of a sample.
- :class:`Listing`: /proc listed by (pid, inode), stat read only for pairs not
  seen before: a reused pid gets a new inode, so a full look costs one listing
  plus the new processes.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import select
import time
import weakref
from collections.abc import Iterable
from typing import Callable, Optional

from .. import _ended, _pidfd
from .. import _lowlevel as _ll
from .._status import ExitStatus, decode_wait_status
from ..errors import OutOfFds, ProctableError
from ..table import Identity, Proc, _has_pidfs, parse_stat, read
from ._core import Membership, as_row
from ._report import Change

__all__ = ["Listing", "Member", "NoChildrenFile", "Registry", "boot_ticks", "carries_marker",
           "children_of", "fake_row", "handle_of", "pidfd_open", "read_safe", "stat_of"]

log = logging.getLogger("proctable.lineage")

_CHILDREN_MAX = 1 << 16


# Kept /proc fds (a member's task directory, children file and stat file) only save
# path lookups. Once the process ran out of fds, every lineage stops keeping them
# (see relieve_fds), so that the fds left go to what cannot do without one.
_keep_proc_fds = True
_registries: weakref.WeakSet[Registry] = weakref.WeakSet()


def _out_of_fds(e: OSError) -> bool:
    return e.errno in (errno.EMFILE, errno.ENFILE)


def relieve_fds() -> None:
    """Out of fds: close every kept /proc fd of every lineage, and keep none from now
    on (pidfds stay: they are what signals go through)."""
    global _keep_proc_fds
    _keep_proc_fds = False
    for reg in list(_registries):
        for m in [*reg.live.values(), *reg.anchors.values()]:
            m.close_proc_fds()
    log.warning("lineage: out of file descriptors: no /proc fds are kept open any more")


def read_safe(pid: int) -> Optional[Proc]:
    """read(pid) without memory figures (a lineage needs none), with an unreadable
    row (a stat line caught mid-exit, a pid hidden from us) as None. Out of fds is
    not "unreadable": OutOfFds propagates (unknown is not gone)."""
    try:
        return read(pid, memory=False)
    except OutOfFds:
        raise
    except ProctableError:
        return None


def _close(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


# fds a lineage leaves free for what cannot do without one (reading /proc, a
# cgroup's files, a pipe): a member's pidfd that would leave fewer is not kept.
FD_RESERVE = 8


def _soft_nofile() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 2**31 - 1 if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def pidfd_open(pid: int) -> Optional[int]:
    """A pidfd for pid; None where the kernel or the fd limit gives none, or where
    keeping it would leave fewer than FD_RESERVE fds free (the kernel hands out the
    lowest free number, so every number below it is taken). The member is then
    tracked by (pid, start time), each signal after an identity check.
    ProcessLookupError when no process holds pid."""
    if not hasattr(os, "pidfd_open") or "pidfd" in _pidfd.disabled():
        return None
    try:
        fd = _pidfd.open_pidfd(pid)
    except ProcessLookupError:
        raise
    except OSError:
        return None
    if fd >= _soft_nofile() - FD_RESERVE:
        os.close(fd)
        relieve_fds()
        return None
    return fd


def handle_of(fd: Optional[int]) -> Optional[int]:
    """The pidfs inode number of a pidfd (never reused), where pidfds live on pidfs."""
    if fd is None or not _has_pidfs():
        return None
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return None


class Member:
    """A recorded member: identity, pidfd, kept /proc fds, and its teardown stamps."""

    __slots__ = ("children_fd", "denied", "fd", "handle", "keep", "kill_at", "kill_sent", "pid",
                 "proc", "seen_end", "start", "stat_fd", "stopped", "task_fd", "term_at",
                 "term_sent", "threads")

    def __init__(self, pid: int, start: int, fd: Optional[int], proc: Proc) -> None:
        self.pid = pid
        self.start = start
        self.fd = fd
        self.handle = handle_of(fd)
        self.proc = proc
        self.threads = proc.num_threads or 1  # as last counted (see children_of)
        self.task_fd: Optional[int] = None
        self.children_fd: Optional[int] = None
        self.stat_fd: Optional[int] = None
        self.stopped = False
        self.denied = False
        self.term_at: Optional[float] = None  # first SIGTERM, seconds into the teardown
        self.kill_at: Optional[float] = None
        self.term_sent = False  # in this teardown attempt
        self.kill_sent = False
        self.seen_end: Optional[float] = None
        self.keep = False  # its pidfd stays open for the report

    @property
    def identity(self) -> Identity:
        return Identity(self.pid, self.start, self.handle)

    def close_proc_fds(self) -> None:
        for name in ("task_fd", "children_fd", "stat_fd"):
            fd = getattr(self, name)
            setattr(self, name, None)
            _close(fd)

    def close(self) -> None:
        self.close_proc_fds()
        fd, self.fd = self.fd, None
        _close(fd)

    def __repr__(self) -> str:
        return f"<Member {self.pid} {self.proc.name!r}>"


def fake_row(pid: int, start: int = 0) -> Proc:
    """A row for a process that was gone before it could be read (name unknown)."""
    return Proc((pid, 0, 0, 0, 0, start, 0, 0, 0, 0, 0, 0, 0, 0, b"X", b"?"))


class Registry:
    """Every member of one lineage, live or ended, and how to reach them."""

    def __init__(self, core: Membership) -> None:
        _registries.add(self)
        self.core = core
        self.live: dict[int, Member] = {}
        self.anchors: dict[int, Member] = {}
        self.history: list[Member] = []  # ended since the teardown began: for the report
        self._by_fd: dict[int, Member] = {}
        self.poll = select.poll()
        self.tearing = False
        self.t0 = 0.0
        self.on_end: Optional[Callable[[Member], None]] = None  # the engine's
        # Membership changes, as they happen, once Lineage.changes() asked for them.
        self.log: Optional[list[Change]] = None

    # -- recording ------------------------------------------------------------------

    def record(self, pid: int, floor: int, *, ppid: Optional[int] = None,
               start: Optional[int] = None, pgid: Optional[int] = None,
               sid: Optional[int] = None,
               reparented_from: Optional[int] = None,
               check: Optional[Callable[[int], bool]] = None) -> Optional[Member]:
        """Record pid as a member, pidfd first; None when it is gone, has ended, or
        is not what the caller's reason says (parent, start time, group, session).

        ``ppid``: a child of that member (or anchor, or one of the lineage's own
        helpers), proven so only while that member still holds its pid after the
        child's row was read. ``reparented_from``: a child of that ended member,
        re-parented since, so its row must show another parent now. ``check(pid)``:
        a reading of /proc/<pid> that must say yes (the environment marker); made
        after the pidfd was opened and before the row is read, so that the row's
        proof (not ended) covers it: the pid named this process all along."""
        old = self.live.get(pid)
        if old is not None:
            return old
        if pid in self.core.exclude or pid in self.anchors:
            return None
        parent = None
        if ppid is not None and ppid not in self.core.exclude:
            parent = self.live.get(ppid) or self.anchors.get(ppid)
            if parent is None:
                return None  # not a member (its own claim was refused): no parent proof
        try:
            fd = pidfd_open(pid)
        except ProcessLookupError:
            return None
        try:
            claimed = check is None or check(pid)
        except BaseException:
            _close(fd)
            raise
        if not claimed:
            _close(fd)
            return None
        row = read_safe(pid)
        ok = (row is not None and row.start_time >= floor
              and (ppid is None or row.ppid == ppid)
              and (reparented_from is None or row.ppid != reparented_from)
              and (start is None or row.start_time == start)
              and (pgid is None or row.pgid == pgid)
              and (sid is None or row.sid == sid)
              # ended, or (pidfd readable, row live) the pid was reused before the read
              and not _ended.ended(fd, row))
        if ok and parent is not None and not _holds_pid(parent):
            # The row names the parent's pid, but that member is reaped now: in a pid
            # space that wraps the pid may name a newer process already, whose child
            # this is. (A child of the member itself was re-parented at its exit.)
            ok = False
        if not ok or row is None:
            _close(fd)
            return None
        m = Member(pid, row.start_time, fd, row)
        self.add(m)
        if self.tearing:
            log.debug("new member during teardown: %r", row)
        return m

    def record_child(self, pid: int, parent: Member) -> Optional[Member]:
        """Record pid, named as parent's child (by its children file, or a fork
        event): its row must show parent as its parent, unless parent has ended
        meanwhile (its children were re-parented then), and it must not be older."""
        m = self.record(pid, parent.start, ppid=parent.pid)
        if m is None and pid not in self.live and self._has_ended(parent):
            # Re-parented at the parent's exit; a row that still shows the parent's
            # pid is a child of whatever holds that pid now.
            m = self.record(pid, parent.start, reparented_from=parent.pid)
        return m

    @staticmethod
    def _has_ended(m: Member) -> bool:
        if m.fd is not None:
            return _ended.pidfd_ended(m.fd)
        try:
            return _ended.ended(None, read(m.pid, memory=False), m.start)
        except ProctableError:
            return False

    def add(self, m: Member) -> None:
        if self.log is not None:
            self.log.append(Change("joined", m.proc, parent_member=m.proc.ppid in self.live))
        self.live[m.pid] = m
        self.core.add(as_row(m.proc))
        if m.fd is not None:
            self._by_fd[m.fd] = m
            self.poll.register(m.fd, select.POLLIN)

    def anchor(self, m: Member) -> None:
        """A member recorded after it ended, kept for its pidfd: it may still hold
        its group's and session's numbers. Without a pidfd its stat file is opened
        now, while its start time says it is m: the kept fd is what tells later
        that m is not reaped (:meth:`unreaped`), so that its forks reported late
        (a quick shell's ``nohup cmd &``) are still known as its own."""
        self.anchors[m.pid] = m
        self.core.anchor(as_row(m.proc))
        if m.fd is None:
            stat_of(m)

    # -- ending ------------------------------------------------------------------------

    def end(self, m: Member) -> None:
        """m has ended: no longer live; its pidfd stays while it may be unreaped."""
        if self.live.get(m.pid) is m:
            del self.live[m.pid]
        if m.fd is not None:
            self._by_fd.pop(m.fd, None)
            try:
                self.poll.unregister(m.fd)
            except (KeyError, ValueError):
                pass
        m.close_proc_fds()
        self.core.end(m.pid)
        if self.log is not None:
            self.log.append(Change("left", m.proc, status=self.exit_of(m)))
        if self.on_end is not None:
            self.on_end(m)
        if self.tearing:
            m.seen_end = time.monotonic() - self.t0
            m.keep = True
            self.history.append(m)
        if m.fd is not None:
            self.anchors[m.pid] = m
        else:
            self.core.reaped(m.pid)
            if not m.keep:
                m.close()

    def reap_ended(self) -> list[Member]:
        """End every live member the one predicate says has ended: its pidfd polls
        readable, or (no pidfd) its identity no longer matches or its row ended."""
        out = []
        for fd, _ in self.poll.poll(0):
            m = self._by_fd.get(fd)
            if m is not None:
                out.append(m)
        for m in [m for m in self.live.values() if m.fd is None]:
            try:
                row = read(m.pid, memory=False)
            except ProctableError:
                continue  # unknown is not ended
            if _ended.ended(None, row, m.start):
                out.append(m)
            elif row is not None:
                m.proc = row
        for m in out:
            self.end(m)
        return out

    def held(self) -> set[int]:
        """Members and anchors provably not reaped now (their pidfd says so); an
        anchor found reaped is forgotten (its fd closed, unless the report needs it)."""
        out = set()
        for m in self.live.values():
            if m.fd is not None and (not _ended.pidfd_ended(m.fd)
                                     or _pidfd.still_there(m.fd, m.pid, m.start)):
                out.add(m.pid)
        for m in list(self.anchors.values()):
            if m.fd is not None and _pidfd.still_there(m.fd, m.pid, m.start):
                out.add(m.pid)
            elif m.fd is None and self.unreaped(m):
                pass  # kept for its forks; no proof of a number without a pidfd
            else:
                self.drop_anchor(m)
        return out

    @staticmethod
    def unreaped(m: Member) -> bool:
        """m's pid still names m: its pidfd says it is not reaped; without a pidfd,
        its kept stat fd still reads (it answers ESRCH once m is reaped, never for
        a process that reused the pid), or, where no fd is kept, its pid still
        shows its start time."""
        if m.fd is not None:
            return _pidfd.still_there(m.fd, m.pid, m.start)
        return stat_of(m) is not None

    def drop_anchor(self, m: Member) -> None:
        if self.anchors.get(m.pid) is m:
            del self.anchors[m.pid]
        self.core.reaped(m.pid)
        if not m.keep:
            m.close()

    # -- rows and signals -----------------------------------------------------------------

    def fresh(self, m: Member) -> Optional[Proc]:
        """m's row now (through its kept stat fd where there is one), None when it
        names no process of m's identity."""
        row = stat_of(m)
        if row is None:
            return None
        m.proc = row
        self.core.observe(as_row(row))
        return row

    def live_rows(self) -> list[Proc]:
        """Fresh rows of every live member; those the predicate says ended are ended."""
        self.reap_ended()
        out = []
        for m in list(self.live.values()):
            try:
                row = read(m.pid, memory=False)
            except ProctableError:
                continue  # unreadable now: unknown is not ended
            if _ended.ended(m.fd, row, m.start):
                self.end(m)
                continue
            if row is None or row.start_time != m.start:
                continue  # cannot be, with our pidfd unreadable: leave it to the next look
            m.proc = row
            self.core.observe(as_row(row))
            out.append(row)
        out.sort(key=lambda p: (p.start_time, p.pid))
        return out

    def send(self, m: Member, sig: int) -> bool:
        """sig to m through its pidfd; without one, right after an identity re-check."""
        if m.denied:
            return False
        try:
            # Through the pidfd where the kernel lets us; else by pid, right
            # after the identity check (and, with a pidfd, that it has not ended).
            if not _pidfd.signal_pinned(m.pid, m.start, m.fd, sig):
                return False
        except ProcessLookupError:
            return False
        except OutOfFds:
            relieve_fds()  # the identity check needs an fd: free some, try again later
            return False
        except PermissionError:
            m.denied = True
            return False
        return True

    def exit_of(self, m: Member) -> Optional[ExitStatus]:
        """m's exit status where the kernel still has it; else None."""
        if m.fd is not None and _pidfd.features().pidfd_info:
            try:
                raw = _pidfd.exit_info(m.fd)
            except OSError:
                raw = None
            if raw is not None:
                try:
                    return decode_wait_status(raw)
                except ValueError:
                    return None
        row = read_safe(m.pid)
        if row is not None and row.start_time == m.start and (
                m.fd is None or _ended.pidfd_ended(m.fd)):
            return row.exit
        return None

    def close(self) -> None:
        for m in [*self.live.values(), *self.anchors.values(), *self.history]:
            m.close()
        self.live.clear()
        self.anchors.clear()
        self.history.clear()
        self._by_fd.clear()
        self.poll = select.poll()


# --- the O(lineage) walk --------------------------------------------------------------


def _no_children_file() -> bool:
    return "proc_children" in _pidfd.disabled()


class NoChildrenFile(Exception):
    """This kernel has no /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN off)."""


def _open_children(pid: int) -> int:
    path = f"/proc/{pid}/task/{pid}/children"
    if _no_children_file():  # PROCTABLE_DISABLE=proc_children: as without the file
        raise FileNotFoundError(path)
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def children_of(m: Member, exact: bool = True) -> list[int]:
    """m's children now, through /proc/<pid>/task/<tid>/children (kept fds).

    Each thread has its own children file. ``exact`` counts m's threads now (an
    fstat of its task directory, the costly part); otherwise the count last seen
    decides whether the main thread's file is all there is to read.

    A hint: the caller re-checks each child's parent and start time when recording
    it. [] once m is gone (its children re-parented). NoChildrenFile where the
    kernel has no such file.
    """
    # fds opened now by path name m only if m is proven unreaped after they were
    # opened (m may have died, and its pid been reused, since it was recorded).
    fresh = m.task_fd is None or m.children_fd is None
    try:
        if m.task_fd is None:
            m.task_fd = os.open(f"/proc/{m.pid}/task", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if m.children_fd is None:
            m.children_fd = _open_children(m.pid)
        if exact:
            m.threads = os.fstat(m.task_fd).st_nlink - 2
        threads = m.threads
        if fresh and not Registry.unreaped(m):
            m.close_proc_fds()
            return []  # gone: what the fds show may be another process's
        if threads <= 1:
            data = os.pread(m.children_fd, _CHILDREN_MAX, 0)
            if len(data) < _CHILDREN_MAX:
                return [int(x) for x in data.split()]
        tids = os.listdir(m.task_fd)
    except OSError as e:
        if _out_of_fds(e):
            m.close_proc_fds()
            raise OutOfFds(e.errno or errno.EMFILE,
                           f"reading the children of pid {m.pid}") from None
        return _children_failed(m, e)
    finally:
        if not _keep_proc_fds:
            m.close_proc_fds()
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{m.pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except OSError as e:
            if _out_of_fds(e):
                raise OutOfFds(e.errno or errno.EMFILE,
                           f"reading the children of pid {m.pid}") from None
            continue
    return out


def _children_failed(m: Member, e: OSError) -> list[int]:
    """children_of's answer when a read failed (not for want of fds)."""
    if isinstance(e, FileNotFoundError):
        if m.task_fd is not None and os.path.isdir(f"/proc/{m.pid}/task"):
            still = _same_process(m)
            if still:
                raise NoChildrenFile() from None
        m.close_proc_fds()
        return []
    m.close_proc_fds()
    return []  # it is gone: its children re-parented


def _holds_pid(m: Member) -> bool:
    """m still holds its pid (running, or an unreaped zombie): the pid names m."""
    return Registry.unreaped(m)  # one predicate for the fact


def _same_process(m: Member) -> bool:
    row = read_safe(m.pid)
    return row is not None and row.start_time == m.start and (
        m.fd is None or not _ended.pidfd_ended(m.fd))


def stat_of(m: Member) -> Optional[Proc]:
    """m's stat row through a kept fd (it answers ESRCH once m is reaped, never for
    a process that reused the pid); None when m is gone. OutOfFds when there is no
    fd to read it with (unknown is not gone)."""
    try:
        if m.stat_fd is None:
            new = os.open(f"/proc/{m.pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            row = _parse(os.pread(new, 4096, 0))
            if row is None or row.start_time != m.start or not _keep_proc_fds:
                os.close(new)
                return None if row is None or row.start_time != m.start else row
            m.stat_fd = new
            return row
        return _parse(os.pread(m.stat_fd, 4096, 0))
    except OSError as e:
        old, m.stat_fd = m.stat_fd, None
        _close(old)
        if _out_of_fds(e):
            raise OutOfFds(e.errno or errno.EMFILE, f"reading pid {m.pid}") from None
        return None


def _parse(data: bytes) -> Optional[Proc]:
    try:
        return parse_stat(data)
    except ValueError:
        return None


# --- the environment marker ------------------------------------------------------------


def _environ(path: str) -> Optional[bytes]:
    """The environment block at path: b"" where the task has no memory to read it
    from (a main thread that exited: ESRCH; caught mid-exec: empty), None where it
    may not be read (another user's, a non-dumpable process) or is gone. OutOfFds
    when no fd is left to read it with."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except ProcessLookupError:
        return b""
    except OSError as e:
        if _out_of_fds(e):
            raise OutOfFds(e.errno or errno.EMFILE, f"reading {path}") from None
        return None


def carries_marker(pid: int, name: bytes, token: bytes) -> Optional[bool]:
    """Does the environment of pid hold ``name=...`` with ``token`` among its
    comma-separated words? False where it says no or cannot be read (a marker is
    only ever a claim on a process whose environment we may read); None where it
    is empty: caught mid-exec, or a process whose main thread exited and none of
    whose other threads could be read.

    The main thread of a process whose ``main`` called ``pthread_exit`` has no
    memory left to read (its ``environ`` answers ESRCH, or EACCES to a reader
    that is not root): its environment is read through another, live thread
    (``/proc/<pid>/task/<tid>/environ``: the same memory)."""
    data = _environ(f"/proc/{pid}/environ")
    if not data:
        denied = data is None
        try:
            tids = [t for t in os.listdir(f"/proc/{pid}/task") if t != str(pid)]
        except OSError:
            tids = []
        for tid in tids:
            got = _environ(f"/proc/{pid}/task/{tid}/environ")
            if got:
                data = got
                break
            denied = denied or got is None
        if not data:
            # One thread, unreadable: another user's (or gone). Empty: mid-exec.
            return False if denied else None
    prefix = name + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(prefix) and token in entry[len(prefix):].split(b","):
            return True
    return False


# --- the (pid, inode) listing --------------------------------------------------------


class Listing:
    """/proc by (pid, inode): each look reads the stat line only of pairs not seen before.

    The rows it keeps may be stale in what a process can change (its group, its
    session by setsid, its parent by re-parenting): :meth:`reread` refreshes those
    that could matter; a row whose parent could not be classified is not kept, so
    that it is read again next time.
    """

    def __init__(self) -> None:
        self.rows: dict[int, tuple[int, Proc]] = {}

    def refresh(self) -> tuple[list[Proc], bool]:
        """(rows of the pairs not seen before, read now), and whether /proc was listed."""
        rows = self.rows
        seen: set[int] = set()
        fresh: list[tuple[int, int]] = []
        try:
            with os.scandir("/proc") as it:
                for e in it:
                    name = e.name
                    if not name[0].isdigit():  # not a process ("self", "sys", ...)
                        continue
                    pid = int(name)
                    seen.add(pid)
                    ino = e.inode()  # from getdents: no system call
                    old = rows.get(pid)
                    if old is None or old[0] != ino:
                        fresh.append((pid, ino))
        except OSError as e:
            log.debug("lineage: /proc unreadable: %s", e)
            return [], False
        new = []
        for pid, ino in fresh:
            row = read_safe(pid)
            if row is None:
                rows.pop(pid, None)
                continue
            rows[pid] = (ino, row)
            new.append(row)
        if len(rows) != len(seen):  # some are gone: forget them
            for pid in [p for p in rows if p not in seen]:
                del rows[pid]
        return new, True

    def forget(self, pids: Iterable[int]) -> None:
        """Read these again next time (their row could not be classified)."""
        for pid in pids:
            self.rows.pop(pid, None)

    def in_sessions(self, sids: set[int]) -> list[int]:
        return [pid for pid, (_, row) in self.rows.items() if row.sid in sids]

    def reread(self, pids: Iterable[int]) -> list[Proc]:
        out = []
        for pid in pids:
            old = self.rows.get(pid)
            row = read_safe(pid)
            if row is None:
                self.rows.pop(pid, None)
                continue
            if old is not None and old[1].start_time == row.start_time:
                self.rows[pid] = (old[0], row)
            else:
                self.rows.pop(pid, None)  # another process now: listed anew next time
            out.append(row)
        return out

    def get(self, pid: int) -> Optional[Proc]:
        got = self.rows.get(pid)
        return None if got is None else got[1]


def boot_ticks() -> int:
    """Clock ticks since boot now, on the clock start times are stamped with."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _ll.TICKS_PER_SECOND)
