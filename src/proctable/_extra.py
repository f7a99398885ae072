"""The C extra reads behind process_iter (csrc/pt_extra.c), as plain Python values.

With _lowlevel, the only code that touches the compiled core: it owns the
buffers C fills (rows, extra records, the arena of cmdline and exe bytes),
grows them when C says ENOSPC, and turns the records into tuples. Nothing
above it sees a cffi object.
"""

from __future__ import annotations

import errno
import struct
import sys
import threading
from collections.abc import Sequence
from typing import Any, Optional

from . import _lowlevel as _ll
from . import _rows
from ._native import ffi, lib  # the core's second door (see the docstring)
from .errors import ProctableError

__all__ = ["X_CMDLINE", "X_CMDLINE_LONG", "X_EXE", "X_STATM", "X_STATUS", "Extra",
           "read_extra", "scan_extra"]

X_STATUS = int(lib.PT_X_STATUS)
X_STATM = int(lib.PT_X_STATM)
X_CMDLINE = int(lib.PT_X_CMDLINE)
X_EXE = int(lib.PT_X_EXE)
X_CMDLINE_LONG = int(lib.PT_X_CMDLINE_LONG)
X_PROCFS = int(lib.PT_X_PROCFS)
X_BPF = int(lib.PT_X_BPF)
X_CWD = int(lib.PT_X_CWD)
X_ENVIRON = int(lib.PT_X_ENVIRON)
X_FDS = int(lib.PT_X_FDS)
X_NICE = int(lib.PT_X_NICE)
X_PIN = int(lib.PT_X_PIN)
X_DIR = int(lib.PT_X_DIR)

READERS = {"auto": 0, "proc": X_PROCFS, "bpf": X_BPF}
"""The want bits of scan_extra that choose a reader, as _lowlevel.READERS."""

F_GONE = int(lib.PT_X_GONE)
F_ZOMBIE = int(lib.PT_X_ZOMBIE)
F_TRUNCATED = int(lib.PT_X_TRUNCATED)
F_HAVE_CMDLINE = int(lib.PT_X_HAVE_CMDLINE)
F_ENV_TRUNCATED = int(lib.PT_X_ENV_TRUNCATED)
F_PIDFD_ENDED = int(lib.PT_X_PIDFD_ENDED)

SUPPORTED = sys.platform.startswith("linux")

_SIZE = int(ffi.sizeof("pt_extra"))
_WORDS = _SIZE // 8
if _WORDS * 8 != _SIZE:  # pragma: no cover - proctable.h keeps it all int64
    raise ImportError(f"pt_extra is {_SIZE} bytes, not a whole number of int64s")
_FORMAT = struct.Struct(f"={_WORDS}q")


def _at(name: str) -> int:
    return int(ffi.offsetof("pt_extra", name)) // 8


_PID, _FLAGS, _TFLAGS = _at("pid"), _at("flags"), _at("task_flags")
_UID, _GID, _CPU, _STATM = _at("uid"), _at("gid"), _at("cpu"), _at("statm")
_CMD_OFF, _CMD_LEN = _at("cmdline_off"), _at("cmdline_len")
_EXE_OFF, _EXE_LEN = _at("exe_off"), _at("exe_len")
_ERR_STAT, _ERR_STATUS, _ERR_STATM = _at("err_stat"), _at("err_status"), _at("err_statm")
_ERR_CMD, _ERR_EXE = _at("err_cmdline"), _at("err_exe")
_CWD_OFF, _CWD_LEN = _at("cwd_off"), _at("cwd_len")
_ENV_OFF, _ENV_LEN = _at("env_off"), _at("env_len")
_NFDS, _NICE = _at("nfds"), _at("nice")
_PIDFS_INO, _DIR_INO = _at("pidfs_ino"), _at("dir_ino")
_ERR_CWD, _ERR_ENV, _ERR_FDS, _ERR_NICE = (_at("err_cwd"), _at("err_environ"), _at("err_fds"),
                                           _at("err_nice"))


class Extra:
    """One process's extra data, over the raw record C filled (one tuple of
    int64s, unpacked in bulk); a value is None where its err_* is set."""

    __slots__ = ("_arena", "_w")

    def __init__(self, words: tuple[int, ...], arena: bytes) -> None:
        self._w = words
        self._arena = arena

    @classmethod
    def empty(cls, pid: int) -> Extra:
        """A record with nothing read (where the reader does not exist)."""
        words = [0] * _WORDS
        words[_PID] = pid
        return cls(tuple(words), b"")

    @property
    def pid(self) -> int:
        return self._w[_PID]

    @property
    def flags(self) -> int:
        return self._w[_FLAGS]

    @property
    def task_flags(self) -> int:
        return self._w[_TFLAGS]

    @property
    def uids(self) -> Optional[tuple[int, ...]]:
        w = self._w
        return None if w[_ERR_STATUS] else w[_UID:_UID + 3]

    @property
    def gids(self) -> Optional[tuple[int, ...]]:
        w = self._w
        return None if w[_ERR_STATUS] else w[_GID:_GID + 3]

    @property
    def cpu(self) -> tuple[int, ...]:
        """utime, stime, cutime, cstime, blkio, in clock ticks."""
        return self._w[_CPU:_CPU + 5]

    @property
    def statm(self) -> Optional[tuple[int, ...]]:
        w = self._w
        return None if w[_ERR_STATM] else w[_STATM:_STATM + 7]

    @property
    def cmdline(self) -> Optional[bytes]:
        """Its bytes, where the command line was read (PT_X_HAVE_CMDLINE)."""
        w = self._w
        if not w[_FLAGS] & F_HAVE_CMDLINE:
            return None
        off = w[_CMD_OFF]
        return self._arena[off:off + w[_CMD_LEN]]

    @property
    def exe(self) -> Optional[bytes]:
        w = self._w
        if w[_ERR_EXE]:
            return None
        off = w[_EXE_OFF]
        return self._arena[off:off + w[_EXE_LEN]]

    @property
    def cwd(self) -> Optional[bytes]:
        """The cwd link's target (X_CWD), None where err_cwd is set."""
        w = self._w
        if w[_ERR_CWD]:
            return None
        off = w[_CWD_OFF]
        return self._arena[off:off + w[_CWD_LEN]]

    @property
    def environ(self) -> Optional[bytes]:
        """The environ bytes (X_ENVIRON), None where err_environ or F_ENV_TRUNCATED."""
        w = self._w
        if w[_ERR_ENV] or w[_FLAGS] & F_ENV_TRUNCATED:
            return None
        off = w[_ENV_OFF]
        return self._arena[off:off + w[_ENV_LEN]]

    @property
    def pidfs_ino(self) -> int:
        """X_PIN: the inode of the pidfd opened first (0: none could be had)."""
        return self._w[_PIDFS_INO]

    @property
    def dir_ino(self) -> int:
        """X_PIN (before the stat line) or X_DIR (after it): the inode of
        /proc/<pid>, 0 where it could not be looked up."""
        return self._w[_DIR_INO]

    @property
    def nfds(self) -> int:
        return self._w[_NFDS]

    @property
    def nice(self) -> int:
        return self._w[_NICE]

    @property
    def err_cwd(self) -> int:
        return self._w[_ERR_CWD]

    @property
    def err_environ(self) -> int:
        return self._w[_ERR_ENV]

    @property
    def err_fds(self) -> int:
        return self._w[_ERR_FDS]

    @property
    def err_nice(self) -> int:
        return self._w[_ERR_NICE]

    @property
    def err_stat(self) -> int:
        return self._w[_ERR_STAT]

    @property
    def err_status(self) -> int:
        return self._w[_ERR_STATUS]

    @property
    def err_statm(self) -> int:
        return self._w[_ERR_STATM]

    @property
    def err_cmdline(self) -> int:
        return self._w[_ERR_CMD]

    @property
    def err_exe(self) -> int:
        return self._w[_ERR_EXE]


def _records(buf: Any, n: int, arena: bytes) -> list[Extra]:
    return [Extra(w, arena) for w in _FORMAT.iter_unpack(ffi.buffer(buf, n * _SIZE))]


class _Buffers(threading.local):
    """Per-thread buffers, grown as the table and its command lines grow."""

    def __init__(self) -> None:
        self.cap = 0
        self.rows: Any = None
        self.extra: Any = None
        self.denied: Any = None
        self.arena_cap = 0
        self.arena: Any = None
        self.used: Any = ffi.new("size_t *")
        self.info: Any = ffi.new("pt_scaninfo *")

    def grow(self, needed: int) -> None:
        # The table grows between calls: a quarter more room than seen.
        self.cap = max(self.cap * 2, needed * 5 // 4 + 64, 1024)
        self.rows = ffi.new("pt_proc[]", self.cap)
        self.extra = ffi.new("pt_extra[]", self.cap)
        self.denied = ffi.new("pt_denied[]", self.cap)
        self.info.denied = self.denied
        self.info.denied_cap = self.cap

    def grow_arena(self, needed: int) -> None:
        self.arena_cap = max(self.arena_cap * 2, needed * 5 // 4 + 4096, 64 * 1024)
        self.arena = ffi.new("char[]", self.arena_cap)


_buffers = _Buffers()


def _unsupported() -> NotImplementedError:
    return NotImplementedError(f"the extra process reads are Linux-only, not {sys.platform}")


def scan_extra(cls: type[_ll.RowT], want: int, threads: int = 0
               ) -> tuple[list[_ll.RowT], list[Extra], list[tuple[int, Optional[int]]]]:
    """The whole table and every process's extra data (want: X_*) in one pass:
    (rows sorted by pid, their Extra records in the same order, denied pids)."""
    n = _scan_pass(want, threads)
    b = _buffers
    arena = (ffi.buffer(b.arena, int(b.used[0]))[:]
             if want & (X_CMDLINE | X_EXE | X_CMDLINE_LONG) else b"")
    rows = _ll._build(cls, b.rows, int(n))
    denied = _ll._denied(b.info) if b.info.ndenied else []
    return rows, _records(b.extra, int(n), arena), denied


def last_reader() -> str:
    """The reader ("bpf" or "proc") of this thread's last scan_extra."""
    return _ll._reader_name(int(_buffers.info.reader))


def floor_scan_extra(want: int, threads: int = 0) -> int:
    """pt_scan_extra alone, for benchmarks: the C pass with no Python rows or
    records built. Returns the processes read."""
    return _scan_pass(want, threads)


def _scan_pass(want: int, threads: int) -> int:
    """pt_scan_extra into the shared buffers, grown and retried while the C pass
    says they are too small (ENOSPC); the number of processes read."""
    if not SUPPORTED:
        raise _unsupported()
    b = _buffers
    if b.rows is None:
        b.grow(0)
    if b.arena is None:
        b.grow_arena(0)
    for _attempt in range(8):
        n = lib.pt_scan_extra(b.rows, b.extra, b.cap, want, b.arena, b.arena_cap, b.used,
                              threads, b.info)
        if n >= 0:
            return int(n)
        err = ffi.errno
        if err != errno.ENOSPC:
            pid = int(b.info.bad_pid) if err == errno.EBADMSG else None
            raise _ll._os_error(err, pid, "reading the process table")
        if int(b.info.needed) > b.cap:
            b.grow(int(b.info.needed))
        if int(b.used[0]) > b.arena_cap:
            b.grow_arena(int(b.used[0]))
    raise ProctableError("the process table kept growing faster than it could be read")


def read_extra(wanted: Sequence[tuple[int, int, int]], threads: int = 0) -> list[Extra]:
    """The extra data of the given (pid, start_time, want) processes, in that
    order; a process that exited or whose pid now names another process has
    F_GONE set."""
    if not SUPPORTED:
        raise _unsupported()
    n = len(wanted)
    if n == 0:
        return []
    recs = ffi.new("pt_extra[]", n)
    for i, (pid, start, want) in enumerate(wanted):
        r = recs[i]
        r.pid = pid
        r.start_time = start
        r.want = want
    b = _buffers
    if b.arena is None:
        b.grow_arena(0)
    for _attempt in range(8):
        rc = lib.pt_read_extra(recs, n, b.arena, b.arena_cap, b.used, threads)
        if rc >= 0:
            break
        err = ffi.errno
        if err != errno.ENOSPC:
            raise _ll._os_error(err, None, "reading process files")
        b.grow_arena(int(b.used[0]))
    else:  # pragma: no cover - only a command line growing 8 times in a row
        raise ProctableError("command lines kept growing faster than they could be read")
    arena = ffi.buffer(b.arena, int(b.used[0]))[:]
    return _records(recs, n, arena)


class _One(threading.local):
    """Per-thread buffers of read_one: one record, one row, an arena."""

    def __init__(self) -> None:
        self.x: Any = ffi.new("pt_extra *")
        self.row: Any = ffi.new("pt_proc *")
        self.row_addr = int(ffi.cast("uintptr_t", self.row))
        self.used: Any = ffi.new("size_t *")
        self.cap = 16 * 1024
        self.arena: Any = ffi.new("char[]", self.cap)


_one = _One()


def read_one(cls: type[_ll.RowT], pid: int, start_time: int, want: int
             ) -> tuple[Extra, _ll.RowT]:
    """One process's extra data (want: X_*) and its stat line as a cls row, read on
    this thread, the stat line last: F_GONE where it exited or the pid names
    another process than start_time says (-1: any), or a thread. The row is
    meaningful only where neither F_GONE nor err_stat is set."""
    if not SUPPORTED:
        raise _unsupported()
    b = _one
    x = b.x
    for _attempt in range(8):
        x.pid = pid
        x.start_time = start_time
        x.want = want
        if lib.pt_read_one(x, b.row, b.arena, b.cap, b.used) == 0:
            break
        err = ffi.errno
        if err != errno.ENOSPC:
            raise _ll._os_error(err, None, f"reading pid {pid}")
        b.cap = max(b.cap * 2, int(b.used[0]) * 5 // 4)
        b.arena = ffi.new("char[]", b.cap)
    else:  # pragma: no cover - only blobs growing 8 times in a row
        raise ProctableError("a process's files kept growing faster than they could be read")
    used = int(b.used[0])
    arena = ffi.buffer(b.arena, used)[:] if used else b""
    rec = Extra(_FORMAT.unpack(ffi.buffer(x, _SIZE)), arena)
    return rec, _rows_build(cls, b.row_addr)


def _rows_build(cls: type[_ll.RowT], addr: int) -> _ll.RowT:
    return _rows.build(cls, addr, 1)[0]


def pid_exists(pid: int) -> Optional[bool]:
    """Does a process (not a thread id) hold pid, and does /proc show it to this
    caller? None where pidfds cannot be had here (ask otherwise)."""
    if not SUPPORTED:
        return None
    got = int(lib.pt_pid_exists(pid))
    return None if got < 0 else bool(got)


def list_pids() -> list[int]:
    """The pids /proc lists to this caller, sorted."""
    if not SUPPORTED:
        raise _unsupported()
    b = _pids
    for _attempt in range(8):
        n = lib.pt_list_pids(b.buf, b.cap)
        if n < 0:
            raise _ll._os_error(ffi.errno, None, "listing /proc")
        if n <= b.cap:
            return list(ffi.unpack(b.buf, n))
        b.cap = n * 5 // 4 + 64
        b.buf = ffi.new("int64_t[]", b.cap)
    raise ProctableError("the process table kept growing faster than it could be listed")


class _Pids(threading.local):
    def __init__(self) -> None:
        self.cap = 4096
        self.buf: Any = ffi.new("int64_t[]", self.cap)


_pids = _Pids()


def parse_status_ids(data: bytes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(uids, gids) from a status file, with the C parser; ValueError if malformed."""
    one = ffi.new("pt_extra *")
    rc = lib.pt_parse_status_ids(data, len(data), one)
    if rc != 0:
        raise ValueError(f"no parsable Uid:/Gid: lines ({rc})")
    return tuple(one.uid), tuple(one.gid)


def parse_stat_cpu(data: bytes) -> tuple[int, tuple[int, ...], int]:
    """(task flags, the five cpu fields, the PT_X_* flags) of a stat line; ValueError
    if malformed."""
    one = ffi.new("pt_extra *")
    rc = lib.pt_parse_stat_cpu(data, len(data), one)
    if rc != 0:
        raise ValueError(f"malformed stat line ({rc})")
    return int(one.task_flags), tuple(one.cpu), int(one.flags)


def parse_statm_all(data: bytes) -> tuple[int, ...]:
    """The seven statm fields (pages), with the C parser; ValueError if malformed."""
    one = ffi.new("pt_extra *")
    rc = lib.pt_parse_statm_all(data, len(data), one)
    if rc != 0:
        raise ValueError(f"malformed statm line ({rc})")
    return tuple(one.statm)
