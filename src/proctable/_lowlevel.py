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
from typing import Any, Optional

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
    "PID_MAX",
    "ROW",
    "TICKS_PER_SECOND",
    "check_pid",
    "floor_scan",
    "parse_stat_row",
    "read_row",
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


_buffers = _Buffers()


def snapshot_rows() -> list[RawRow]:
    """All rows of the table, sorted by pid, as raw tuples in ROW's layout."""
    b = _buffers
    if b.rows is None:
        b.cap = 1024
        b.rows = ffi.new("pt_proc[]", b.cap)
    for _attempt in range(8):
        n = lib.pt_snapshot(b.rows, b.cap, b.needed)
        if n >= 0:
            return list(ROW.iter_unpack(ffi.buffer(b.rows, n * ROW.size)))
        err = ffi.errno
        if err != errno.ENOSPC:
            pid = int(b.needed[0]) if err == errno.EBADMSG else None
            raise _os_error(err, pid, "reading the process table")
        # The table grows between calls: leave a quarter more room than seen.
        b.cap = max(b.cap * 2, int(b.needed[0]) * 5 // 4 + 64)
        b.rows = ffi.new("pt_proc[]", b.cap)
    raise ProctableError("the process table kept growing faster than it could be read")


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


def floor_scan() -> int:
    """The C floor: walk /proc and read every stat file, no parsing, no rows."""
    n = lib.pt_floor_scan()
    if n < 0:
        raise _os_error(ffi.errno, None, "floor scan")
    return int(n)
