"""The process table: Proc rows, Table, Identity, snapshot() and read()."""

from __future__ import annotations

import errno
import os
import select
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Optional, Union, overload

from . import _ended, _rows
from . import _lowlevel as _ll
from ._status import ExitStatus, decode_wait_status
from .errors import AccessDenied

__all__ = [
    "Denied",
    "Identity",
    "Proc",
    "Reader",
    "Table",
    "identity",
    "parse_stat",
    "read",
    "reader",
    "snapshot",
]

class Proc(_rows.Row):
    """One process, as one read of the table saw it (its /proc files, or the BPF
    reader's record of the same fields). Immutable.

    A Proc is built in C straight from the reader's row (see csrc/pt_rows.c),
    and its fields are C getters over that copy, which is what keeps a
    whole-table read close to the cost of the kernel calls. A value the kernel
    did not give is None, never 0. Rows compare equal when every field is
    equal; :meth:`same_process` asks whether two rows are of one process.

    Fields: ``pid``, ``ppid``, ``pgid``, ``sid``, ``tty_nr``, ``start_time``
    (clock ticks since boot: with pid, the identity), ``create_time`` (seconds
    since the epoch), ``state``, ``num_threads``, ``utime``, ``stime`` (seconds),
    ``rss``, ``vms`` (bytes), ``uid`` (effective), ``name`` (the comm),
    ``raw_exit_code``, ``exit_masked``, ``kernel_thread``; and ``exit`` and
    ``identity`` below.
    """

    __slots__ = ()

    @property
    def exit(self) -> Optional[ExitStatus]:
        """The exit status of a zombie, where the kernel shows it; else None.

        Set only for a whole-process zombie (state Z, one thread) whose field 52
        this reader may see; see :func:`proctable.exit_probe` for why not.
        """
        raw = self._exit_status_word
        if raw is None:
            return None
        try:
            return decode_wait_status(raw)
        except ValueError:
            return None

    @property
    def identity(self) -> Identity:
        """This row's process as an Identity, with its pidfs handle where the kernel
        has one and the process still runs (or is an unreaped zombie): looked up
        on access (a pidfd open and a stat read, ~15 us), else (pid, start_time)."""
        return _identity_of(self.pid, self.start_time)

    def same_process(self, other: Proc) -> bool:
        """True when other is a row of the same process (same pid and start time),
        whatever its counters say."""
        return self.pid == other.pid and self.start_time == other.start_time

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
            "vms": self.vms,
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
        return (Proc, (self._raw(),))


class Table(Sequence[Proc]):
    """A snapshot of the process table: Proc rows sorted by pid.

    Lookups (``get``, ``in``) and the parent-to-children index are built on
    first use, so a table that is only iterated costs nothing extra.

    ``x in table`` asks "is this process in the table?": x is a pid, an
    :class:`Identity` or a :class:`Proc`, and an Identity or a Proc is in the
    table when a row has the same pid and start time (a later table holds the
    same live process with other counters: it is still in). The table holds no
    pidfs handles, so an Identity's handle is not compared: a dead process is
    ``in`` a table holding its successor started on the same pid within the
    same clock tick. :meth:`Identity.alive` checks the handle against the kernel
    now, and is the exact answer. (mypy's strict
    equality reports an int there as "non-overlapping", since the items are
    Procs; use ``table.get(pid) is not None`` in code checked that way.)

    ``denied`` lists the pids that /proc listed but this caller may not read
    (``hidepid=1``, a security module), with their owner where that is visible:
    they are not rows, since nothing else about them is known.
    """

    __slots__ = ("_by_pid", "_children", "_rows", "denied")

    def __init__(self, rows: Sequence[Proc], denied: Sequence[Denied] = ()) -> None:
        self._rows: list[Proc] = list(rows)
        self._by_pid: Optional[dict[int, Proc]] = None
        self._children: Optional[dict[int, list[Proc]]] = None
        self.denied: tuple[Denied, ...] = tuple(denied)

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
            p = self.get(pid.pid)
            return p is not None and p.start_time == pid.start_time
        if isinstance(pid, Identity):
            p = self.get(pid.pid)
            return p is not None and p.start_time == pid.start_time
        # A bool is no pid (True would be pid 1), as check_pid says.
        return isinstance(pid, int) and not isinstance(pid, bool) and pid in self._index()

    def __repr__(self) -> str:
        return f"<Table of {len(self._rows)} processes>"

    def _index(self) -> dict[int, Proc]:
        if self._by_pid is None:
            self._by_pid = {p.pid: p for p in self._rows}
        return self._by_pid

    def get(self, pid: int) -> Optional[Proc]:
        """The row of pid, or None."""
        return self._index().get(pid)

    def _kids(self) -> dict[int, list[Proc]]:
        if self._children is None:
            kids: dict[int, list[Proc]] = {}
            for p in self._rows:
                kids.setdefault(p.ppid, []).append(p)
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
        return [k for k in kids if k.start_time >= parent.start_time]

    def descendants(self, pid: int) -> list[Proc]:
        """Every process below pid (children, their children, ...), breadth first."""
        out: list[Proc] = []
        todo = [pid]
        seen = {pid}
        while todo:
            nxt = []
            for p in todo:
                for k in self.children(p):
                    if k.pid not in seen:
                        seen.add(k.pid)
                        out.append(k)
                        nxt.append(k.pid)
            todo = nxt
        return out


class Denied(NamedTuple):
    """A pid /proc lists that this caller may not read (hidepid=1, a security module)."""

    pid: int
    uid: Optional[int]
    """The owner of /proc/<pid>, where even that is not hidden; else None."""


def _table(rows: list[Proc], denied: Sequence[tuple[int, Optional[int]]] = ()) -> Table:
    # A Table over a list that is already fresh: no copy.
    t = Table.__new__(Table)
    t._rows = rows
    t._by_pid = None
    t._children = None
    t.denied = tuple(Denied(*d) for d in denied) if denied else ()
    return t


def _want(memory: bool) -> int:
    if not isinstance(memory, bool):
        raise TypeError(f"memory must be a bool, not {type(memory).__name__}")
    return _ll.WANT_MEM if memory else 0


def snapshot(memory: bool = True, *, reader: str = "auto") -> Table:
    """The whole process table, read in one pass, sorted by pid.

    Where this process may load it (root, or CAP_BPF and CAP_PERFMON, on a
    kernel with BTF: see :func:`reader`), the table comes from a BPF task
    iterator, one pass in the kernel, with the same rows /proc gives (from
    the reads after the program's load: a process's first read takes /proc,
    its second starts the load aside, see :func:`reader`). Else /proc is
    read, large tables by a few threads at once (in C, with the GIL
    released) where a second CPU is free; below a few hundred processes one
    thread is faster. ``memory=False`` leaves out rss and vms (None in every
    row), which saves /proc one file read per process (about a third of the
    cost). A pid that this caller may not read (hidepid=1, a security module)
    is not a row: it is listed in ``Table.denied``.

    ``reader="proc"`` reads /proc even where BPF runs; ``reader="bpf"`` reads
    through BPF or raises OSError (ENOTSUP) where it cannot.
    """
    rows, denied = _ll.snapshot_rows(Proc, 0, _want(memory) | _ll.reader_want(reader))
    return _table(rows, denied)


class Reader(NamedTuple):
    """Which reader this process's table reads use, and why not BPF."""

    name: str
    """``"bpf"`` (a BPF task iterator) or ``"proc"`` (/proc; libproc on macOS)."""
    why_not: Optional[str]
    """Why not BPF (no privileges, no BTF, PROCTABLE_DISABLE=bpf, built without
    BPF, ...); None when BPF is the reader."""


def reader() -> Reader:
    """The reader behind :func:`snapshot` and ``Scanner.refresh()`` in this process.

    Decided at once if not decided yet (loading the BPF program then, about
    60 ms of CPU): ``Reader("bpf", None)``, or ``Reader("proc", why)``.
    Without it, a process's first :func:`snapshot` reads /proc and its second
    starts the load on a thread of its own (docs/table.md).
    """
    name, why = _ll.reader()
    return Reader(name, why)


def read(pid: int, memory: bool = True) -> Optional[Proc]:
    """The row of one process, or None if there is none.

    AccessDenied (a PermissionError) when the process exists but this caller
    may not read it (hidepid=1, a security module). ``memory=False`` leaves out
    rss and vms (None), one file read less.
    """
    return _ll.read_row(Proc, _ll.check_pid(pid), _want(memory))


def parse_stat(line: bytes) -> Proc:
    """Decode one Linux /proc/<pid>/stat line. ValueError when it is malformed."""
    return _ll.parse_stat_row(Proc, line)


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


class _IdentityFields(NamedTuple):
    pid: int
    start_time: int
    handle: Optional[int] = None


class Identity(_IdentityFields):
    """A process as (pid, start_time): a pid alone can name another process later.

    ``handle`` is the pidfd inode number where pidfds live on pidfs (Linux 6.9+):
    the kernel never reuses it, so it tells apart a pid reused within one clock
    tick, which (pid, start_time) cannot.

    Checked when made: ``TypeError`` for a pid, start time or handle that is not
    an int, ``ValueError`` for a pid <= 0 or a negative start time or handle.
    """

    __slots__ = ()

    def __new__(cls, pid: int, start_time: int, handle: Optional[int] = None) -> Identity:
        # One line of checks on the common path: an Identity is made for many rows.
        if (type(pid) is int and type(start_time) is int and pid > 0 and start_time >= 0
                and (handle is None or (type(handle) is int and handle >= 0))):
            return tuple.__new__(cls, (pid, start_time, handle))
        return tuple.__new__(cls, _identity_fields(pid, start_time, handle))

    def current(self, memory: bool = True) -> Optional[Proc]:
        """This process's row now, or None when the pid is gone or names another process.

        ``memory=False`` reads it without rss and vms (one file read less).
        """
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
            row = read(self.pid, memory)
            if row is None or row.start_time != self.start_time:
                return None
            if fd is not None and not _ended.row_ended(row.state, row.num_threads) and (
                    _ended.pidfd_ended(fd)):
                return None  # ours ended and the pid went to another process meanwhile
            return row
        finally:
            if fd is not None:
                os.close(fd)

    def exists(self) -> bool:
        """The process exists, running or as an unreaped zombie."""
        return self.current(memory=False) is not None

    def alive(self) -> bool:
        """The process exists and has not exited (a zombie is not alive).

        False once the pid is gone or names another process. A process whose
        main thread exited while other threads run is alive. Where /proc hides
        the process from this caller (hidepid, a security module), an identity
        with a handle is answered by its pidfd alone; without one, AccessDenied.
        """
        try:
            return not _ended.ended(None, self.current(memory=False))
        except AccessDenied:
            if self.handle is None:
                raise
            try:
                fd, ino = _pidfd_inode(self.pid)
            except ProcessLookupError:
                return False
            if fd is None:
                raise
            try:
                return ino == self.handle and not _ended.pidfd_ended(fd)
            finally:
                os.close(fd)


def _identity_fields(pid: object, start_time: object, handle: object
                     ) -> tuple[int, int, Optional[int]]:
    """Identity's fields checked one by one, with an error that names the wrong one
    (int subclasses other than bool are taken as ints)."""
    return (_identity_field("pid", pid, 1), _identity_field("start_time", start_time, 0),
            None if handle is None else _identity_field("handle", handle, 0))


def _identity_field(name: str, v: object, least: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"Identity.{name} must be an int, not {type(v).__name__} ({v!r})")
    if v < least:
        raise ValueError(f"Identity.{name} must be >= {least}, not {v}")
    return int(v)


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
        row = _ll.read_row(Proc, pid, 0)
        if row is None:
            return None
        if fd is not None and not _ended.row_ended(row.state, row.num_threads) and (
                _ended.pidfd_ended(fd)):
            # Our pidfd's process ended and the pid was reused in between.
            return None
        return Identity(pid, row.start_time, ino)
    finally:
        if fd is not None:
            os.close(fd)


def _identity_of(pid: int, start_time: int) -> Identity:
    """Identity(pid, start_time) with the pidfs handle where the process that
    holds pid now is that one; without a handle where it is gone or unknown."""
    try:
        now = identity(pid)
    except (OSError, ValueError):
        now = None
    if now is not None and now.start_time == start_time:
        return now
    return Identity(pid, start_time)
