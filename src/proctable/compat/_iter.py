"""psutil-compatible iteration: ``proctable.process_iter(attrs, ad_value)``.

Code written against ``psutil.process_iter(attrs)`` switches by changing the
import: the yielded objects have ``.pid`` and ``.info`` (psutil's keys, value
types and values, Linux semantics), plus the proctable row (``.proc``) and its
``.identity``. The whole table and the files the attributes need are read in
C in one pass (see csrc/pt_extra.c); only the files the asked attributes need
are read.

Every rule below that says "as psutil" follows psutil's Linux code (psutil
5.9-7.x): where psutil raises AccessDenied or ZombieProcess for one attribute,
that attribute is ``ad_value``; a process that vanished is skipped.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Optional

from .. import _extra
from .. import _lowlevel as _ll
from ..errors import OutOfFds
from ..table import Identity, Proc
from . import _decode
from ._decode import (
    COMM_TRUNCATED,
    PF_KTHREAD,
    STATUS,
    Denied,
    Gone,
    guess_exe,
    link_path,
    pcputimes,
    pgids,
    pmem,
    puids,
)
from ._decode import cmdline as parse_cmdline
from ._errors import AccessDenied, NoSuchProcess, ZombieProcess
from ._process import AS_DICT_ATTRS, Process, _total_phymem

__all__ = [
    "OFFERED",
    "ProcessInfo",
    "pcputimes",
    "pgids",
    "pmem",
    "process_iter",
    "puids",
]

OFFERED: tuple[str, ...] = (
    "pid", "ppid", "name", "status", "create_time", "num_threads", "terminal",
    "uids", "gids", "username", "cpu_times", "memory_info", "cmdline", "exe",
)
"""The attributes process_iter offers, in the order ``attrs=None`` gives them."""


# Which extra files each attribute needs (see csrc/pt_extra.c).
_NEEDS = {
    "uids": _extra.X_STATUS, "gids": _extra.X_STATUS, "username": _extra.X_STATUS,
    "memory_info": _extra.X_STATM, "memory_percent": _extra.X_STATM,
    "cmdline": _extra.X_CMDLINE, "exe": _extra.X_EXE,
}
# Offered when named (not with attrs=None): each read per process, by its method.
_LATE = frozenset(a for a in AS_DICT_ATTRS if a not in OFFERED and a not in _NEEDS)
_NOT_ON_THIS_OS = frozenset(_NEEDS) | {"cpu_times"} | _LATE

_TICKS = _ll.TICKS_PER_SECOND
_PAGE = _ll.PAGE_SIZE


class ProcessInfo(Process):
    """One process of :func:`process_iter`: a :class:`proctable.compat.Process`
    (every method of psutil's) with ``info`` (psutil's dict), ``proc`` (the
    proctable row, or None for a pid this caller may not read at all) and
    ``identity``."""

    def __init__(self, pid: int, info: dict[str, Any], proc: Optional[Proc]) -> None:
        self._setup(pid, None if proc is None else proc.start_time, None)
        self.info = info
        self.proc = proc

    @property
    def identity(self) -> Optional[Identity]:
        """The row's process as an Identity (with its pidfs handle where it still
        runs), for terminate, ExitWatcher or Lineage; None without a row."""
        return None if self.proc is None else self.proc.identity

    def __repr__(self) -> str:
        name = self.info.get("name", None if self.proc is None else self.proc.name)
        return f"proctable.ProcessInfo(pid={self.pid}, name={name!r})"

    __str__ = __repr__


class _Lookups:
    """What one iteration looks up once: user names, and /dev when a tty is new."""

    def __init__(self) -> None:
        self.users: dict[int, str] = {}
        self.rescanned = False

    def terminal(self, tty_nr: int) -> Optional[str]:
        # A terminal opened since /dev was scanned: scan again, once per iteration.
        name, scanned = _decode.terminal(tty_nr, rescan=not self.rescanned)
        self.rescanned |= scanned
        return name

    def username(self, uid: int) -> str:
        name = self.users.get(uid)
        if name is None:
            name = self.users[uid] = _decode.username(uid)
        return name


# --- one process -------------------------------------------------------------------


class _Proc:
    """The row and extra record of one process, with psutil's answer per attribute."""

    __slots__ = ("_cmd", "look", "row", "x")

    def __init__(self, row: Proc, x: _extra.Extra, look: _Lookups) -> None:
        self.row = row
        self.x = x
        self.look = look
        self._cmd: Any = None  # list[str], or an exception class to raise

    def zombie(self) -> bool:
        return bool(self.x.flags & _extra.F_ZOMBIE) or self.row.state == "Z"

    def kthread(self) -> bool:
        return bool(self.x.task_flags & PF_KTHREAD)

    def cmdline(self) -> list[str]:
        c = self._cmd
        if c is None:
            c = self._cmd = self._read_cmdline()
        if isinstance(c, list):
            return c
        raise c()

    def _read_cmdline(self) -> Any:
        x = self.x
        if x.err_cmdline:
            return _err_class(x.err_cmdline, f"pid {x.pid}: cmdline")
        raw = x.cmdline
        if raw is None:
            raise AssertionError("cmdline was not read")  # pragma: no cover - _fill_cmdlines
        if not raw:
            # as psutil: empty for a zombie is ZombieProcess (ad_value), else []
            return Denied if self.zombie() else []
        return parse_cmdline(raw)

    def name(self) -> str:
        name = self.row.name
        if len(name) >= COMM_TRUNCATED:
            try:
                cmd = self.cmdline()
            except Denied:
                return name
            if cmd:
                extended = os.path.basename(cmd[0])
                if extended.startswith(name):
                    return extended
        return name

    def exe(self) -> str:
        x = self.x
        err = x.err_exe
        if err == 0 and x.exe is not None:
            return link_path(x.exe)
        if err in (_ENOENT, _ESRCH):
            # as psutil: a zombie's is ZombieProcess; else "" (a kernel thread, an
            # exiting process), which it then tries to guess from argv[0]
            if self.zombie():
                raise Denied()
            try:
                return guess_exe(self.cmdline()) or ""
            except Denied:
                return ""
        if err == _EACCES:
            # as psutil: AccessDenied unless argv[0] names an executable
            guess = guess_exe(self.cmdline())
            if guess is None:
                raise Denied()
            return guess
        raise _err_class(err, f"pid {x.pid}: exe")()

    def uids(self) -> puids:
        u = self.x.uids
        if u is None:
            raise _err_class(self.x.err_status, f"pid {self.x.pid}: status")()
        return puids(*u)

    def gids(self) -> pgids:
        g = self.x.gids
        if g is None:
            raise _err_class(self.x.err_status, f"pid {self.x.pid}: status")()
        return pgids(*g)

    def username(self) -> str:
        u = self.x.uids
        if u is None:
            raise _err_class(self.x.err_status, f"pid {self.x.pid}: status")()
        return self.look.username(u[0])  # the real uid, as psutil

    def memory_info(self) -> pmem:
        m = self.x.statm
        if m is None:
            raise _err_class(self.x.err_statm, f"pid {self.x.pid}: statm")()
        p = _PAGE
        return pmem(m[1] * p, m[0] * p, m[2] * p, m[3] * p, m[4] * p, m[5] * p, m[6] * p)

    def cpu_times(self) -> pcputimes:
        c = self.x.cpu
        t = _TICKS
        return pcputimes(c[0] / t, c[1] / t, c[2] / t, c[3] / t, c[4] / t)


_EACCES, _ENOENT, _ESRCH = 13, 2, 3


def _err_class(err: int, what: str) -> Any:
    """The exception class for a file's errno: Denied for a denial, else an OSError
    (house rule: an unexpected error is reported, never swallowed)."""
    if err == _EACCES:
        return Denied
    if err in (_ENOENT, _ESRCH):
        return Gone

    def error() -> OSError:
        if err in (errno.EMFILE, errno.ENFILE):
            return OutOfFds(err, what)  # as a table read out of fds says it
        return OSError(err, f"{what}: {os.strerror(err)}")

    return error


_GETTERS: dict[str, Any] = {
    "pid": lambda p: p.row.pid,
    "ppid": lambda p: p.row.ppid,
    "status": lambda p: STATUS.get(p.row.state, "?"),
    "create_time": lambda p: p.row.create_time,
    "num_threads": lambda p: p.row.num_threads,
    "terminal": lambda p: p.look.terminal(p.row.tty_nr),
    "name": _Proc.name,
    "uids": _Proc.uids,
    "gids": _Proc.gids,
    "username": _Proc.username,
    "cpu_times": _Proc.cpu_times,
    "memory_info": _Proc.memory_info,
    "memory_percent": lambda p: p.memory_info().rss / float(_total_phymem()) * 100,
    "cmdline": _Proc.cmdline,
    "exe": _Proc.exe,
}


def _check_attrs(attrs: Optional[Iterable[str]]) -> tuple[str, ...]:
    if attrs is None:
        return _offered_here()
    if not isinstance(attrs, (list, tuple, set, frozenset)):
        raise TypeError(f"invalid attrs type {type(attrs)}")  # psutil's message
    names = list(dict.fromkeys(attrs))
    unknown = [a for a in names if a not in AS_DICT_ATTRS]
    if unknown:
        raise ValueError(
            "process_iter() does not offer "
            + ", ".join(repr(a) for a in unknown)
            + "; it offers: " + ", ".join(AS_DICT_ATTRS))
    if not names:
        return _offered_here()  # psutil: an empty list means every attribute
    if not _extra.SUPPORTED:
        here = [a for a in names if a in _NOT_ON_THIS_OS]
        if here:
            raise NotImplementedError(
                f"{', '.join(here)}: only on Linux for now (the table attributes work here)")
    return tuple(names)


def _offered_here() -> tuple[str, ...]:
    if _extra.SUPPORTED:
        return OFFERED
    return tuple(a for a in OFFERED if a not in _NOT_ON_THIS_OS)


def _want(attrs: tuple[str, ...]) -> int:
    want = 0
    for a in attrs:
        want |= _NEEDS.get(a, 0)
    if want & _extra.X_EXE and os.geteuid() != 0:
        # Other users' exe links are denied, and psutil then guesses from argv[0]:
        # read every cmdline in the same pass rather than many again afterwards.
        want |= _extra.X_CMDLINE
    if "name" in attrs and not want & _extra.X_CMDLINE:
        # psutil extends a 15-character comm from argv[0]: C reads the command
        # lines of those (and of no kernel thread) in the same pass
        want |= _extra.X_CMDLINE_LONG
    return want


class _Last(threading.local):
    reader = ""


_last = _Last()


def last_reader() -> str:
    """The reader ("bpf" or "proc") behind this thread's last process_iter table
    ("" before the first); for benchmarks and tests."""
    return _last.reader


def process_iter(attrs: Optional[Iterable[str]] = None,
                 ad_value: Any = None, *, reader: str = "auto") -> Iterator[ProcessInfo]:
    """Every process, sorted by pid, as psutil's ``process_iter(attrs, ad_value)``
    gives them (Linux semantics), read in one C pass.

    ``attrs`` names the ``info`` keys from :data:`OFFERED`; None (or an empty
    list, as in psutil) gives all of them. A name not offered raises ValueError
    (at the call, before anything is read). A value that psutil would refuse
    with AccessDenied or ZombieProcess is ``ad_value``; a process that exits
    during the read is left out. A pid this caller may not read at all
    (``hidepid=1``) is yielded as psutil yields it: every value but ``pid`` is
    ``ad_value``, and ``proc`` is None.

    Where the BPF reader runs (see :func:`proctable.reader`), the table, the
    cpu times and the ids (``uids``, ``gids``, ``username``) come from its
    records, and only ``memory_info``, ``cmdline`` and ``exe`` (and the command
    lines of names cut at 15 bytes) are read from /proc. ``reader="proc"``
    reads /proc even there; ``reader="bpf"`` reads through BPF or raises
    OSError (ENOTSUP) where it cannot, as :func:`proctable.snapshot` does.
    """
    names = _check_attrs(attrs)
    table_want = _ll.reader_want(reader)  # a bad reader is refused here, before any read
    return _iterate(names, ad_value, table_want, _extra.READERS.get(reader, 0))


def psutil_process_iter(attrs: Optional[Iterable[str]] = None, ad_value: Any = None, *,
                        reader: str = "auto") -> Iterator[ProcessInfo]:
    """psutil's ``process_iter()`` (``proctable.compat.process_iter``): as
    :func:`process_iter`, but with psutil's meaning of attrs: None reads no
    attribute (the processes of one table read, whose methods read what they
    are asked), an empty list every one of ``AS_DICT_ATTRS``."""
    if attrs is None:
        return process_iter(["pid"], ad_value, reader=reader)
    if isinstance(attrs, (list, tuple, set, frozenset)) and not attrs:
        return process_iter(AS_DICT_ATTRS, ad_value, reader=reader)
    return process_iter(attrs, ad_value, reader=reader)


def _iterate(names: tuple[str, ...], ad_value: Any, table_want: int,
             extra_want: int) -> Iterator[ProcessInfo]:
    want = _want(names)
    if _extra.SUPPORTED and (want & ~_extra.X_CMDLINE_LONG or "cpu_times" in names):
        rows, extras, denied = _extra.scan_extra(Proc, want | extra_want)
        _last.reader = _extra.last_reader()
    else:
        # Nothing but the stat line: the table as snapshot(memory=False) reads it
        # (through BPF where that runs); truncated names get their command lines
        # in a second pass (_fill_cmdlines).
        rows, denied = _ll.snapshot_rows(Proc, 0, table_want)
        extras = [_extra.Extra.empty(r.pid) for r in rows]
        want &= ~_extra.X_CMDLINE_LONG
        _last.reader = _ll.last_reader()
    look = _Lookups()
    late = [a for a in names if a in _LATE]
    getters = [(a, _GETTERS[a]) for a in names if a not in _LATE]
    procs = [_Proc(r, x, look) for r, x in zip(rows, extras)]
    _fill_cmdlines(procs, names, want)
    out: list[tuple[int, Optional[_Proc]]] = [(p.row.pid, p) for p in procs]
    if denied:
        out += [(pid, None) for pid, _uid in denied]
        out.sort(key=lambda e: e[0])
    before = _previous.get()
    now: dict[int, ProcessInfo] = {}
    finished = False
    try:
        for pid, p in out:
            if p is None:
                # /proc denies its files; what asks no file (nice) is still read
                obj = ProcessInfo(pid, {a: (pid if a == "pid" else ad_value) for a in names},
                                  None)
                if late and not _late(obj, late, ad_value, names):
                    continue
                yield obj
                continue
            info = {}
            try:
                for a, get in getters:
                    try:
                        info[a] = get(p)
                    except Denied:
                        info[a] = ad_value
            except Gone:
                continue  # psutil's NoSuchProcess: it vanished under us
            obj = ProcessInfo(pid, info, p.row)
            old = before.get(pid)
            if old is not None and old._start == obj._start:
                # psutil hands out the same Process again: its cpu_percent() baseline
                obj._last_sys_cpu, obj._last_proc_cpu = old._last_sys_cpu, old._last_proc_cpu
            now[pid] = obj
            if late and not _late(obj, late, ad_value, names):
                continue
            yield obj
        finished = True
    finally:
        _previous.set(now, complete=finished)


def _late(obj: ProcessInfo, late: list[str], ad_value: Any, names: tuple[str, ...]) -> bool:
    """The attributes read per process by their methods, into obj.info (in the
    order of names); False when the process is gone (psutil's NoSuchProcess:
    it is not yielded)."""
    info = obj.info
    with obj.oneshot():
        for a in late:
            try:
                info[a] = getattr(obj, a)()
            except (AccessDenied, ZombieProcess):
                info[a] = ad_value
            except NoSuchProcess:
                return False
    obj.info = {a: info[a] for a in names}
    return True


class _Previous:
    """The objects of the last whole iteration, by pid: the next one carries each
    process's cpu_percent() baseline over, as psutil's cached Process objects do."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_pid: dict[int, ProcessInfo] = {}

    def get(self) -> dict[int, ProcessInfo]:
        with self._lock:
            return self._by_pid

    def set(self, now: dict[int, ProcessInfo], complete: bool) -> None:
        with self._lock:
            if complete:
                self._by_pid = now
            else:  # an iteration left early: keep the rest of the old ones too
                self._by_pid = {**self._by_pid, **now}


_previous = _Previous()


def _fill_cmdlines(procs: list[_Proc], names: tuple[str, ...], want: int) -> None:
    """Command lines the first pass did not read but psutil's rules need: names
    of 15 characters or more (extended from argv[0]) and exe guesses. Read in a
    second C pass for those processes only, each proven still the same process."""
    if want & _extra.X_CMDLINE:
        for p in procs:
            if p.x.flags & _extra.F_TRUNCATED:
                p._cmd = _read_long_cmdline(p.row)
        return
    by_name, by_exe = "name" in names, "exe" in names
    if not (by_name or by_exe):
        return
    late = []
    for p in procs:
        if not by_exe and len(p.row.name) < COMM_TRUNCATED:
            continue  # most rows: nothing to extend, no exe to guess
        x = p.x
        if x.flags & (_extra.F_HAVE_CMDLINE | _extra.F_TRUNCATED) or x.err_cmdline:
            if x.flags & _extra.F_TRUNCATED:
                p._cmd = _read_long_cmdline(p.row)
            continue  # read in the first pass (X_CMDLINE_LONG)
        if (by_name and len(p.row.name) >= COMM_TRUNCATED) or (
                by_exe and x.err_exe in (_ENOENT, _EACCES)):
            if p.kthread():
                p._cmd = []  # a kernel thread has no command line
            elif p.zombie():
                p._cmd = Denied  # as psutil: a zombie's cmdline is ZombieProcess
            else:
                late.append(p)
    if not late:
        return
    got = _extra.read_extra([(p.row.pid, p.row.start_time, _extra.X_CMDLINE) for p in late])
    for p, x in zip(late, got):
        if x.flags & _extra.F_GONE:
            p._cmd = Gone
        elif x.flags & _extra.F_TRUNCATED:
            p._cmd = _read_long_cmdline(p.row)
        elif x.err_cmdline:
            p._cmd = _err_class(x.err_cmdline, f"pid {x.pid}: cmdline")
        elif not x.cmdline:
            p._cmd = Denied if x.flags & _extra.F_ZOMBIE else []
        else:
            p._cmd = parse_cmdline(x.cmdline)


def _read_long_cmdline(row: Proc) -> Any:
    """A command line longer than C's 64 KiB scratch: read here, then proven to be
    of the same process (its (pid, start time) still holds)."""
    try:
        with open(f"/proc/{row.pid}/cmdline", "rb") as f:
            raw = f.read()
    except PermissionError:
        return Denied
    except (FileNotFoundError, ProcessLookupError):
        return Gone
    if Identity(row.pid, row.start_time).current(memory=False) is None:
        return Gone
    return parse_cmdline(raw) if raw else []


def _cache_clear() -> None:
    """psutil's ``process_iter.cache_clear()``: forget the last iteration's objects
    (the next one starts every cpu_percent() baseline afresh)."""
    _previous.set({}, complete=True)


process_iter.cache_clear = _cache_clear  # type: ignore[attr-defined]
psutil_process_iter.cache_clear = _cache_clear  # type: ignore[attr-defined]
