"""The process table: Proc rows, Table, Identity, snapshot() and read()."""

from __future__ import annotations

import errno
import os
import select
from collections.abc import Iterator, Sequence
from operator import itemgetter
from typing import Any, NamedTuple, Optional, Union, overload

from . import _ended
from . import _lowlevel as _ll
from ._status import ExitStatus, decode_wait_status

__all__ = ["Identity", "Proc", "Table", "identity", "parse_stat", "read", "snapshot"]

_BOOT = _ll.BOOT_EPOCH
_HZ = _ll.TICKS_PER_SECOND
_PAGE = _ll.PAGE_SIZE
_F_HAVE_EXIT = _ll.F_HAVE_EXIT
_F_EXIT_MASKED = _ll.F_EXIT_MASKED
_F_HAVE_UID = _ll.F_HAVE_UID


def _field(index: int, doc: str) -> Any:
    return property(itemgetter(index), doc=doc)


class Proc(tuple):  # type: ignore[type-arg]
    """One process, as one read of its stat line saw it. Immutable.

    A Proc is built straight from the C reader's row (a tuple), and its public
    attributes are computed from those raw values on access, which is what
    keeps a whole-table read close to the cost of the kernel calls.
    """

    __slots__ = ()

    pid: int = _field(0, "Process id.")
    ppid: int = _field(1, "Parent's pid (0 for the kernel's roots).")
    pgid: int = _field(2, "Process group id.")
    sid: int = _field(3, "Session id.")
    tty_nr: int = _field(4, "Controlling terminal's device number (0: none).")
    start_time: int = _field(
        5, "The kernel's start stamp in clock ticks since boot; with pid, the identity."
    )
    num_threads: int = _field(8, "Number of threads.")

    @property
    def create_time(self) -> float:
        """Start time in seconds since the epoch (boot time + start ticks, as ps does)."""
        return float(_BOOT + self[5] / _HZ)

    @property
    def utime(self) -> float:
        """User CPU time in seconds."""
        return float(self[6] / _HZ)

    @property
    def stime(self) -> float:
        """System CPU time in seconds."""
        return float(self[7] / _HZ)

    @property
    def rss(self) -> int:
        """Resident set size in bytes."""
        return int(self[9] * _PAGE)

    @property
    def uid(self) -> Optional[int]:
        """Owner of /proc/<pid> (the effective uid; root for non-dumpable ones); None if unknown."""
        return int(self[10]) if self[12] & _F_HAVE_UID else None

    @property
    def state(self) -> str:
        """The kernel's one-letter state: R, S, D, Z, T, t, X, I, ..."""
        return str(self[13].decode("ascii", "replace"))

    @property
    def name(self) -> str:
        """The comm (up to 15 bytes, 64 for kernel threads); may hold spaces and ')'."""
        return str(self[14].decode("utf-8", "surrogateescape"))

    @property
    def exit(self) -> Optional[ExitStatus]:
        """The exit status of a zombie, where the kernel shows it; else None.

        Set only for a whole-process zombie (state Z, one thread) whose field 52
        this reader may see; see :func:`proctable.exit_probe` for why not.
        """
        if self[13] != b"Z" or not _ended.row_ended(self[13], self[8]):
            return None
        flags = self[12]
        if not flags & _F_HAVE_EXIT or flags & _F_EXIT_MASKED:
            return None
        try:
            return decode_wait_status(int(self[11]))
        except ValueError:
            return None

    @property
    def exit_masked(self) -> bool:
        """True when this is a zombie whose exit status the kernel hides from us."""
        return bool(self[13] == b"Z" and self[12] & _F_EXIT_MASKED)

    @property
    def raw_exit_code(self) -> Optional[int]:
        """Field 52 as printed (None on kernels before 3.5). Meaningful only in state Z."""
        return int(self[11]) if self[12] & _F_HAVE_EXIT else None

    @property
    def identity(self) -> Identity:
        """(pid, start_time) of this row, without a pidfd handle."""
        return Identity(self[0], self[5])

    def as_dict(self) -> dict[str, Any]:
        """The public fields as a plain dict (exit as a dict too), e.g. for JSON."""
        ex = self.exit
        return {
            "pid": self.pid,
            "ppid": self.ppid,
            "pgid": self.pgid,
            "sid": self.sid,
            "start_time": self.start_time,
            "create_time": self.create_time,
            "state": self.state,
            "num_threads": self.num_threads,
            "uid": self.uid,
            "name": self.name,
            "tty_nr": self.tty_nr,
            "utime": self.utime,
            "stime": self.stime,
            "rss": self.rss,
            "exit": None if ex is None else ex._asdict(),
        }

    def __repr__(self) -> str:
        return (
            f"Proc(pid={self.pid}, ppid={self.ppid}, pgid={self.pgid}, sid={self.sid}, "
            f"start_time={self.start_time}, state={self.state!r}, "
            f"num_threads={self.num_threads}, uid={self.uid}, name={self.name!r}, "
            f"exit={self.exit!r})"
        )

    def __reduce__(self) -> Any:
        return (Proc, (tuple(self),))


_make = tuple.__new__


class Table(Sequence[Proc]):
    """A snapshot of the process table: Proc rows sorted by pid.

    Lookups (``get``, ``in``) and the parent-to-children index are built on
    first use, so a table that is only iterated costs nothing extra.

    ``pid in table`` takes a pid, an Identity or a Proc. (mypy's strict equality
    reports an int there as "non-overlapping", since the items are Procs; use
    ``table.get(pid) is not None`` in code checked that way.)
    """

    __slots__ = ("_by_pid", "_children", "_rows")

    def __init__(self, rows: Sequence[Proc]) -> None:
        self._rows: list[Proc] = list(rows)
        self._by_pid: Optional[dict[int, Proc]] = None
        self._children: Optional[dict[int, list[Proc]]] = None

    @overload
    def __getitem__(self, i: int) -> Proc: ...
    @overload
    def __getitem__(self, i: slice) -> list[Proc]: ...
    def __getitem__(self, i: Union[int, slice]) -> Union[Proc, list[Proc]]:
        return self._rows[i]

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[Proc]:
        return iter(self._rows)

    def __contains__(self, pid: object) -> bool:
        if isinstance(pid, Proc):
            return self.get(pid.pid) == pid
        if isinstance(pid, Identity):
            p = self.get(pid.pid)
            return p is not None and p.start_time == pid.start_time
        return isinstance(pid, int) and pid in self._index()

    def __repr__(self) -> str:
        return f"<Table of {len(self._rows)} processes>"

    def _index(self) -> dict[int, Proc]:
        if self._by_pid is None:
            self._by_pid = {p[0]: p for p in self._rows}
        return self._by_pid

    def get(self, pid: int) -> Optional[Proc]:
        """The row of pid, or None."""
        return self._index().get(pid)

    def _kids(self) -> dict[int, list[Proc]]:
        if self._children is None:
            kids: dict[int, list[Proc]] = {}
            for p in self._rows:
                kids.setdefault(p[1], []).append(p)
            self._children = kids
        return self._children

    def children(self, pid: int) -> list[Proc]:
        """Direct children of pid, by pid.

        A row whose parent pid matches but which started before that parent
        cannot be its child (the parent's pid was reused): it is left out.
        """
        parent = self.get(pid)
        kids = self._kids().get(pid, [])
        if parent is None:
            return list(kids)
        return [k for k in kids if k[5] >= parent[5]]

    def descendants(self, pid: int) -> list[Proc]:
        """Every process below pid (children, their children, ...), breadth first."""
        out: list[Proc] = []
        todo = [pid]
        seen = {pid}
        while todo:
            nxt = []
            for p in todo:
                for k in self.children(p):
                    if k[0] not in seen:
                        seen.add(k[0])
                        out.append(k)
                        nxt.append(k[0])
            todo = nxt
        return out


def _table(rows: list[Proc]) -> Table:
    # A Table over a list that is already fresh: no copy.
    t = Table.__new__(Table)
    t._rows = rows
    t._by_pid = None
    t._children = None
    return t


def snapshot() -> Table:
    """The whole process table, read in one pass, sorted by pid.

    Large tables are read by a few threads at once (in C, with the GIL
    released); below a few hundred processes one thread is faster.
    """
    return _table(_ll.snapshot_rows(0, Proc))


def read(pid: int) -> Optional[Proc]:
    """The row of one process, or None if there is none."""
    row = _ll.read_row(_ll.check_pid(pid))
    return None if row is None else _make(Proc, row)


def parse_stat(line: bytes) -> Proc:
    """Decode one Linux /proc/<pid>/stat line. ValueError when it is malformed."""
    return _make(Proc, _ll.parse_stat_row(line))


# --- identity ---------------------------------------------------------------

_pidfs: Optional[bool] = None


def _has_pidfs() -> bool:
    """Do pidfds carry unique inode numbers (pidfs, Linux 6.9+)? Checked once."""
    global _pidfs
    if _pidfs is None:
        # Decided in a local and published once: another thread must never read a
        # provisional False (it would pin identities without their handle).
        found = False
        if hasattr(os, "pidfd_open") and hasattr(select, "epoll"):
            try:
                a = os.pidfd_open(os.getpid())
            except OSError:
                a = -1
            if a >= 0:
                try:
                    # Anonymous-inode pidfds (older kernels) share their one inode with
                    # every anonymous-inode file, an epoll fd among them. (Not compared
                    # with the parent's pidfd: pid 1 of a container has no parent.)
                    with select.epoll() as ep:
                        anon = os.fstat(ep.fileno())
                    mine = os.fstat(a)
                    found = (mine.st_dev, mine.st_ino) != (anon.st_dev, anon.st_ino)
                except OSError:
                    found = False
                finally:
                    os.close(a)
        _pidfs = found
    return _pidfs


def _pidfd_inode(pid: int) -> tuple[Optional[int], Optional[int]]:
    """Open a pidfd for pid: (fd, inode) on pidfs, (None, None) where unavailable.

    Raises ProcessLookupError when the pid is gone.
    """
    if not _has_pidfs():
        return None, None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.EINVAL):
            # Not a thread-group leader (a thread id): no process holds this pid.
            raise ProcessLookupError(errno.ESRCH, f"pid {pid} is not a process") from None
        if e.errno in (errno.ENOSYS, errno.EPERM, errno.EACCES, errno.EMFILE, errno.ENFILE):
            return None, None
        raise
    return fd, os.fstat(fd).st_ino


class Identity(NamedTuple):
    """A process as (pid, start_time): a pid alone can name another process later.

    ``handle`` is the pidfd inode number where pidfds live on pidfs (Linux 6.9+):
    the kernel never reuses it, so it tells apart a pid reused within one clock
    tick, which (pid, start_time) cannot.
    """

    pid: int
    start_time: int
    handle: Optional[int] = None

    def current(self) -> Optional[Proc]:
        """This process's row now, or None when the pid is gone or names another process."""
        st, handle = self.start_time, self.handle
        if isinstance(st, bool) or not isinstance(st, int):
            raise TypeError(f"Identity.start_time must be an int, not {type(st).__name__}")
        if handle is not None and (isinstance(handle, bool) or not isinstance(handle, int)):
            raise TypeError(f"Identity.handle must be an int or None, not {type(handle).__name__}")
        fd, ino = (None, None)
        if self.handle is not None:
            try:
                fd, ino = _pidfd_inode(self.pid)
            except ProcessLookupError:
                return None
        try:
            if fd is not None and ino != self.handle:
                return None
            row = read(self.pid)
            if row is None or row.start_time != self.start_time:
                return None
            return row
        finally:
            if fd is not None:
                os.close(fd)

    def exists(self) -> bool:
        """The process exists, running or as an unreaped zombie."""
        return self.current() is not None

    def alive(self) -> bool:
        """The process exists and has not exited (a zombie is not alive).

        False once the pid is gone or names another process. A process whose
        main thread exited while other threads run is alive.
        """
        return not _ended.ended(None, self.current())


def identity(pid: int) -> Optional[Identity]:
    """The identity of the process that holds pid now, or None if there is none.

    The pidfd is opened before the stat line is read, and checked afterwards not
    to have exited, so the handle and the start time name the same process.
    """
    pid = _ll.check_pid(pid)
    try:
        fd, ino = _pidfd_inode(pid)
    except ProcessLookupError:
        return None
    try:
        row = _ll.read_row(pid)
        if row is None:
            return None
        if fd is not None and not _ended.row_ended(row[13], row[8]) and _ended.pidfd_ended(fd):
            # Our pidfd's process died and the pid was reused in between.
            return None
        return Identity(pid, row[5], ino)
    finally:
        if fd is not None:
            os.close(fd)
