"""The only module that touches the compiled core.

It turns C return codes and errno into Python values and exceptions, and rows
into plain tuples. Nothing above this module sees a cffi object.
"""

from __future__ import annotations

import errno
import os
import struct
import sys
import threading
import weakref
from typing import Any, Callable, Optional, TypeVar

from .errors import AccessDenied, NoSuchProcess, ProctableError

try:
    from ._native import ffi, lib
except ImportError as exc:  # pragma: no cover - a broken install
    raise ImportError(
        "proctable's compiled core (proctable._native) is missing: reinstall with "
        "`pip install --force-reinstall proctable`, or build it with a C compiler and cffi"
    ) from exc

__all__ = [
    "BOOT_EPOCH",
    "PAGE_SIZE",
    "PARALLEL_MIN",
    "PID_MAX",
    "ROW",
    "TICKS_PER_SECOND",
    "FdScanner",
    "check_pid",
    "floor_read",
    "floor_scan",
    "parse_stat_row",
    "read_row",
    "scan_threads",
    "snapshot_rows",
]

# One row, as pt_proc lays it out: 12 x int64, int32 flags, char state, then a
# length-prefixed comm ("p" format), padded to the struct's size.
ROW = struct.Struct("=12qic%dp" % (lib.PT_COMM_MAX + 1))
_PAD = ffi.sizeof("pt_proc") - ROW.size
if _PAD < 0 or _PAD > 8:  # pragma: no cover - a layout change in proctable.h
    raise ImportError(f"pt_proc layout does not match ROW ({ffi.sizeof('pt_proc')} bytes)")
if _PAD:
    ROW = struct.Struct(ROW.format + "%dx" % _PAD)

F_HAVE_EXIT = int(lib.PT_F_HAVE_EXIT)
F_EXIT_MASKED = int(lib.PT_F_EXIT_MASKED)
F_HAVE_UID = int(lib.PT_F_HAVE_UID)

# Largest value a pid_t can hold; larger ints can never name a process.
PID_MAX = 2**31 - 1

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

if sys.platform.startswith("linux"):
    TICKS_PER_SECOND = float(os.sysconf("SC_CLK_TCK"))

    def _boot_epoch() -> float:
        # The convention of ps and psutil: btime from /proc/stat, read once.
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
        raise ProctableError("no btime line in /proc/stat")  # pragma: no cover

    BOOT_EPOCH = _boot_epoch()
else:  # macOS: the reader reports start times in microseconds since the epoch
    TICKS_PER_SECOND = 1_000_000.0
    BOOT_EPOCH = 0.0

_PARSE_ERRORS = {
    int(lib.PT_ENOPID): "no pid, or a pid out of range",
    int(lib.PT_ENOCOMM): "no (comm), or a comm longer than %d bytes" % lib.PT_COMM_MAX,
    int(lib.PT_ESTATE): "no single-letter state after the comm",
    int(lib.PT_EFIELD): "a field is not a decimal number, or overflows",
    int(lib.PT_ESHORT): "fewer than 24 fields",
}

RawRow = tuple[Any, ...]
T = TypeVar("T")

# Pids from which a scan uses more than one thread (see csrc/proctable.h).
PARALLEL_MIN = int(lib.PT_PARALLEL_MIN)


def check_pid(pid: object) -> int:
    """Refuse what cannot be a pid before any kernel call sees it."""
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise TypeError(f"a pid is an int, not {type(pid).__name__}")
    if pid <= 0:
        raise ValueError(f"a pid is a positive int, not {pid}")
    if pid > PID_MAX:
        raise ValueError(f"pid {pid} is out of range (at most {PID_MAX})")
    return pid


def _os_error(err: int, pid: Optional[int], what: str) -> Exception:
    if err == errno.ESRCH and pid is not None:
        return NoSuchProcess(pid)
    if err in (errno.EACCES, errno.EPERM) and pid is not None:
        return AccessDenied(pid, f"access denied reading pid {pid}")
    if err == errno.EBADMSG:
        return ProctableError(f"{what}: the kernel printed a stat line proctable cannot parse"
                              + (f" (pid {pid})" if pid is not None else ""))
    return OSError(err, f"{what}: {os.strerror(err)}")


class _Buffers(threading.local):
    """Per-thread row buffer, grown as the table grows (C fills, Python owns)."""

    def __init__(self) -> None:
        self.cap = 0
        self.rows: Any = None
        self.one: Any = ffi.new("pt_proc *")
        self.needed: Any = ffi.new("size_t *")

    def grow(self, needed: int) -> None:
        # The table grows between calls: leave a quarter more room than seen.
        self.cap = max(self.cap * 2, needed * 5 // 4 + 64, 1024)
        self.rows = ffi.new("pt_proc[]", self.cap)


_buffers = _Buffers()


def _unpack(rows: Any, n: int, make: Callable[[RawRow], T]) -> list[T]:
    # One pass from the C buffer to the caller's row objects: no list of
    # intermediate tuples is kept.
    return list(map(make, ROW.iter_unpack(ffi.buffer(rows, n * ROW.size))))


def _until_it_fits(call: Callable[[], int], needed: Any, grow: Callable[[int], None],
                   what: str) -> int:
    """Run a C table read until its rows fit: on ENOSPC grow by what C said it
    needs and try again (the table grows between calls), a bounded number of times.
    EBADMSG leaves the pid of the unparsable line in needed."""
    for _attempt in range(8):
        n = call()
        if n >= 0:
            return int(n)
        err = ffi.errno
        if err != errno.ENOSPC:
            pid = int(needed[0]) if err == errno.EBADMSG else None
            raise _os_error(err, pid, what)
        grow(int(needed[0]))
    raise ProctableError("the process table kept growing faster than it could be read")


def _identity(row: RawRow) -> RawRow:
    return row


def snapshot_rows(threads: int = 0, make: Optional[Callable[[RawRow], Any]] = None) -> list[Any]:
    """All rows of the table, sorted by pid, as make(raw tuple) (default: the tuple).

    threads: 0 lets C decide from the table's size (one thread below
    PARALLEL_MIN pids); n > 0 uses at most n threads.
    """
    b = _buffers
    if b.rows is None:
        b.grow(0)
    n = _until_it_fits(lambda: lib.pt_scan(b.rows, b.cap, b.needed, threads),
                       b.needed, b.grow, "reading the process table")
    return _unpack(b.rows, n, make or _identity)


def scan_threads(npids: int, threads: int = 0) -> int:
    """The thread count a scan of npids pids uses when asked for threads."""
    return int(lib.pt_scan_threads(npids, threads))


def read_row(pid: int) -> Optional[RawRow]:
    """One row, or None when there is no such process."""
    one = _buffers.one
    if lib.pt_read(pid, one) != 0:
        err = ffi.errno
        if err == errno.ESRCH:
            return None
        raise _os_error(err, pid, f"reading pid {pid}")
    return ROW.unpack(ffi.buffer(one, ROW.size))


def parse_stat_row(line: bytes) -> RawRow:
    """Parse one stat line with the C parser; ValueError when it is malformed."""
    if not isinstance(line, (bytes, bytearray, memoryview)):
        raise TypeError(f"parse_stat takes bytes, not {type(line).__name__}")
    data = bytes(line)
    one = ffi.new("pt_proc *")
    rc = lib.pt_parse_stat(data, len(data), one)
    if rc != 0:
        raise ValueError(f"malformed stat line: {_PARSE_ERRORS.get(rc, rc)}")
    return ROW.unpack(ffi.buffer(one, ROW.size))


def floor_scan(threads: Optional[int] = None) -> int:
    """The C floor: walk /proc and read every stat file, no parsing, no rows.

    threads None: the one-pass floor of pt_snapshot (pt_floor_scan). Else the
    floor of snapshot_rows(threads): the same two passes, buffer and threads.
    """
    if threads is None:
        n = lib.pt_floor_scan()
        if n < 0:
            raise _os_error(ffi.errno, None, "floor scan")
        return int(n)
    b = _buffers
    if b.rows is None:
        b.grow(0)
    return _until_it_fits(lambda: lib.pt_floor_scan_mt(b.rows, b.cap, b.needed, threads),
                          b.needed, b.grow, "floor scan")


def _close_scanner(state: Any, _keep: list[Any]) -> None:
    # A finalizer: it holds the slot arrays (in _keep) alive until the fds
    # they name are closed, and never refers to the FdScanner itself.
    lib.pt_scanner_close(state)


class FdScanner:
    """pt_scanner and its caller-owned memory; not thread-safe (Scanner locks)."""

    def __init__(self, max_fds: int, threads: int = 0, cap: int = 1024) -> None:
        self.threads = threads
        self._state: Any = ffi.new("pt_scanner *")
        self._needed: Any = ffi.new("size_t *")
        self._cap = max(cap, 1)
        self._rows: Any = ffi.new("pt_proc[]", self._cap)
        slots = ffi.new("pt_fdslot[]", self._cap)
        spare = ffi.new("pt_fdslot[]", self._cap)
        lib.pt_scanner_init(self._state, slots, spare, self._cap, max_fds)
        self._keep: list[Any] = [slots, spare]
        self._finalizer = weakref.finalize(self, _close_scanner, self._state, self._keep)

    @property
    def open_fds(self) -> int:
        """fds held between refreshes, the /proc dirfd included."""
        return int(self._state.open_fds)

    @property
    def max_fds(self) -> int:
        return int(self._state.max_fds)

    def _grow(self, needed: int) -> None:
        cap = max(self._cap * 2, needed * 5 // 4 + 64)
        slots = ffi.new("pt_fdslot[]", cap)
        spare = ffi.new("pt_fdslot[]", cap)
        if lib.pt_scanner_resize(self._state, slots, spare, cap) != 0:  # pragma: no cover
            raise _os_error(ffi.errno, None, "growing the scanner")
        self._keep[:] = [slots, spare]
        self._rows = ffi.new("pt_proc[]", cap)
        self._cap = cap

    def refresh(self, make: Callable[[RawRow], T]) -> list[T]:
        """Every row, sorted by pid, as make(raw tuple)."""
        if not self._finalizer.alive:
            raise ValueError("the scanner is closed")
        n = _until_it_fits(
            lambda: lib.pt_scanner_refresh(self._state, self._rows, self._cap, self._needed,
                                           self.threads),
            self._needed, self._grow, "refreshing the process table")
        return _unpack(self._rows, n, make)

    def close(self) -> None:
        """Close every fd; the scanner cannot refresh afterwards."""
        self._finalizer()


def floor_read(pid: int) -> int:
    """The C floor of read_row: open/read/fstat/close of one stat file, no parsing."""
    n = lib.pt_floor_read(pid)
    if n < 0:
        raise _os_error(ffi.errno, pid, f"floor read of pid {pid}")
    return int(n)
