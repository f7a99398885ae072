"""The only module that touches the compiled core.

It turns C return codes and errno into Python values and exceptions, and rows
into plain tuples. Nothing above this module sees a cffi object.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import weakref
from typing import Any, Callable, Optional, TypeVar

from .errors import AccessDenied, NoSuchProcess, OutOfFds, ProctableError

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
    "ROW_SIZE",
    "TICKS_PER_SECOND",
    "FdScanner",
    "bpf_pretend",
    "check_pid",
    "floor_read",
    "floor_scan",
    "last_reader",
    "parse_stat_row",
    "parse_statm",
    "read_row",
    "reader",
    "scan_threads",
    "snapshot_rows",
]

try:
    from . import _rows
except ImportError as exc:  # pragma: no cover - a broken install
    raise ImportError(
        "proctable's row type (proctable._rows) is missing: reinstall with "
        "`pip install --force-reinstall proctable`"
    ) from exc

ROW_SIZE = int(ffi.sizeof("pt_proc"))
if ROW_SIZE != _rows.ROW_SIZE:  # pragma: no cover - two builds of proctable.h mixed
    raise ImportError(f"pt_proc is {ROW_SIZE} bytes to cffi but {_rows.ROW_SIZE} to _rows")

F_HAVE_EXIT = int(lib.PT_F_HAVE_EXIT)
F_EXIT_MASKED = int(lib.PT_F_EXIT_MASKED)
F_HAVE_UID = int(lib.PT_F_HAVE_UID)
F_HAVE_MEM = int(lib.PT_F_HAVE_MEM)
F_HAVE_SID = int(lib.PT_F_HAVE_SID)
F_HAVE_CPU = int(lib.PT_F_HAVE_CPU)

WANT_MEM = int(lib.PT_WANT_MEM)
WANT_PROCFS = int(lib.PT_WANT_PROCFS)
WANT_BPF = int(lib.PT_WANT_BPF)

READER_BPF = int(lib.PT_READER_BPF)
# The reader names proctable.reader() and the want bits of each.
READERS = {"auto": 0, "proc": WANT_PROCFS, "bpf": WANT_BPF}
_PRETEND = {"no_btf": int(lib.PT_PRETEND_NO_BTF), "refusal": int(lib.PT_PRETEND_REFUSAL),
            "skip_self": int(lib.PT_PRETEND_SKIP_SELF)}

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

_rows.configure(BOOT_EPOCH, TICKS_PER_SECOND, PAGE_SIZE)

_PARSE_ERRORS = {
    int(lib.PT_ENOPID): "no pid, or a pid out of range",
    int(lib.PT_ENOCOMM): "no (comm), or a comm longer than %d bytes" % lib.PT_COMM_MAX,
    int(lib.PT_ESTATE): "no single-letter state after the comm",
    int(lib.PT_EFIELD): "a field is not a decimal number, or overflows",
    int(lib.PT_ESHORT): "fewer than 24 fields",
}

RowT = TypeVar("RowT", bound="_rows.Row")

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
        return AccessDenied(pid, f"access denied reading pid {pid} (hidepid, or a "
                            "security module, hides it from this user)")
    if err == errno.EBADMSG:
        return ProctableError(f"{what}: the kernel printed a stat line proctable cannot parse"
                              + (f" (pid {pid})" if pid is not None else ""))
    if err in (errno.EMFILE, errno.ENFILE):
        return OutOfFds(err, what)
    if err == errno.ENOTSUP and sys.platform.startswith("linux"):
        # reader="bpf" where it cannot run: say why, as proctable.reader() does
        name, why = reader()
        because = (f"the BPF reader does not run here: {why}" if name != "bpf"
                   else "the BPF reader could not read this table")
        return OSError(err, f"{what}: {because}")
    return OSError(err, f"{what}: {os.strerror(err)}")


class _Buffers(threading.local):
    """Per-thread row buffers, grown as the table grows (C fills, Python owns)."""

    def __init__(self) -> None:
        self.cap = 0
        self.rows: Any = None
        self.denied: Any = None
        self.one: Any = ffi.new("pt_proc *")
        self.one_addr = int(ffi.cast("uintptr_t", self.one))
        self.info: Any = ffi.new("pt_scaninfo *")

    def grow(self, needed: int) -> None:
        # The table grows between calls: leave a quarter more room than seen.
        self.cap = max(self.cap * 2, needed * 5 // 4 + 64, 1024)
        self.rows = ffi.new("pt_proc[]", self.cap)
        self.denied = ffi.new("pt_denied[]", self.cap)
        self.info.denied = self.denied
        self.info.denied_cap = self.cap


_buffers = _Buffers()


def _build(cls: type[RowT], rows: Any, n: int) -> list[RowT]:
    # One pass in C from the buffer to the row objects (see csrc/pt_rows.c).
    return _rows.build(cls, int(ffi.cast("uintptr_t", rows)), n)


def _denied(info: Any) -> list[tuple[int, Optional[int]]]:
    """(pid, uid or None) of every pid the last read listed but could not read."""
    n = min(int(info.ndenied), int(info.denied_cap))
    out = []
    for i in range(n):
        d = info.denied[i]
        out.append((int(d.pid), None if d.uid < 0 else int(d.uid)))
    return out


def _until_it_fits(call: Callable[[], int], info: Any, grow: Callable[[int], None],
                   what: str) -> int:
    """Run a C table read until its rows fit: on ENOSPC grow by what C said it
    needs and try again (the table grows between calls), a bounded number of times.
    EBADMSG leaves the pid of the unparsable line in info.bad_pid."""
    for _attempt in range(8):
        n = call()
        if n >= 0:
            return int(n)
        err = ffi.errno
        if err != errno.ENOSPC:
            pid = int(info.bad_pid) if err == errno.EBADMSG else None
            raise _os_error(err, pid, what)
        grow(int(info.needed))
    raise ProctableError("the process table kept growing faster than it could be read")


def snapshot_rows(cls: type[RowT], threads: int = 0, want: int = WANT_MEM
                  ) -> tuple[list[RowT], list[tuple[int, Optional[int]]]]:
    """All readable rows of the table, sorted by pid, as cls instances, and the
    (pid, uid) of the pids listed that this caller may not read.

    threads: 0 lets C decide from the table's size and the free CPUs (one thread
    below PARALLEL_MIN pids); n > 0 uses at most n threads.
    """
    b = _buffers
    if b.rows is None:
        b.grow(0)
    n = _until_it_fits(lambda: lib.pt_scan(b.rows, b.cap, want, threads, b.info),
                       b.info, b.grow, "reading the process table")
    rows = _build(cls, b.rows, n)
    return rows, (_denied(b.info) if b.info.ndenied else [])


def last_threads() -> int:
    """Threads the last table read of this thread used."""
    return int(_buffers.info.threads)


def _reader_name(code: int) -> str:
    return "bpf" if code == READER_BPF else "proc"


def last_reader() -> str:
    """The reader ("bpf" or "proc") of the last table read of this thread."""
    return _reader_name(int(_buffers.info.reader))


def reader() -> tuple[str, Optional[str]]:
    """("bpf", None) where table reads go through the BPF task iterator, else
    ("proc", why not). Decides on first use (loading the BPF program then)."""
    why = ffi.new("char[]", 512)
    code = int(lib.pt_reader(why, len(why)))
    if code == READER_BPF:
        return "bpf", None
    return "proc", ffi.string(why).decode("utf-8", "replace") or "unknown"


def reader_want(name: str) -> int:
    """The want bits that choose reader name ("auto", "proc" or "bpf")."""
    if not isinstance(name, str):
        raise TypeError(f"reader is a str, not {type(name).__name__}")
    try:
        return READERS[name]
    except KeyError:
        raise ValueError(f"reader must be one of {sorted(READERS)}, not {name!r}") from None


def bpf_pretend(what: str) -> None:
    """Test switch: make this process's reader decision meet a fault ("no_btf",
    "refusal") through the real detection code, or ("skip_self") every BPF pass
    miss this process's record, as the iterator misses a task (its row then comes
    from /proc, the reconciling code's road). Before the first table read only."""
    if lib.pt_bpf_pretend(_PRETEND[what]) != 0:
        raise ProctableError("the reader is decided already (call before any table read)")


def scan_threads(npids: int, threads: int = 0) -> int:
    """The thread count a scan of npids pids uses when asked for threads."""
    return int(lib.pt_scan_threads(npids, threads))


def read_row(cls: type[RowT], pid: int, want: int = WANT_MEM) -> Optional[RowT]:
    """One row, or None when there is no such process. AccessDenied when this
    caller may not read it (hidepid=1, an LSM)."""
    b = _buffers
    if lib.pt_read(pid, want, b.one) != 0:
        err = ffi.errno
        if err == errno.ESRCH:
            return None
        raise _os_error(err, pid, f"reading pid {pid}")
    return _rows.build(cls, b.one_addr, 1)[0]


def parse_statm(line: bytes) -> tuple[int, int]:
    """(vms, rss) in pages from a statm line, with the C parser; ValueError if malformed."""
    if not isinstance(line, (bytes, bytearray, memoryview)):
        raise TypeError(f"parse_statm takes bytes, not {type(line).__name__}")
    data = bytes(line)
    one = ffi.new("pt_proc *")
    rc = lib.pt_parse_statm(data, len(data), one)
    if rc != 0:
        raise ValueError(f"malformed statm line: {_PARSE_ERRORS.get(rc, rc)}")
    return int(one.vms), int(one.rss)


def parse_stat_row(cls: type[RowT], line: bytes) -> RowT:
    """Parse one stat line with the C parser; ValueError when it is malformed."""
    if not isinstance(line, (bytes, bytearray, memoryview)):
        raise TypeError(f"parse_stat takes bytes, not {type(line).__name__}")
    data = bytes(line)
    one = ffi.new("pt_proc *")
    rc = lib.pt_parse_stat(data, len(data), one)
    if rc != 0:
        raise ValueError(f"malformed stat line: {_PARSE_ERRORS.get(rc, rc)}")
    return _build(cls, one, 1)[0]


def floor_scan(threads: int = 0, want: int = WANT_MEM) -> int:
    """The C floor of snapshot_rows(threads, want=want): the same listing and the
    same system calls per process, no parsing, no rows. Returns the count read."""
    b = _buffers
    if b.rows is None:
        b.grow(0)
    return _until_it_fits(lambda: lib.pt_floor_scan(b.rows, b.cap, want, threads, b.info),
                          b.info, b.grow, "floor scan")


def _close_scanner(state: Any, _keep: list[Any]) -> None:
    # A finalizer: it holds the slot arrays (in _keep) alive until the fds
    # they name are closed, and never refers to the FdScanner itself.
    lib.pt_scanner_close(state)


_FD_ERRORS = (errno.EMFILE, errno.ENFILE)


class FdScanner:
    """pt_scanner and its caller-owned memory; not thread-safe (Scanner locks).

    ``floor=True`` makes it the benchmark floor of a scanner: the same kept fds
    and reads, no parsing, and refresh() returns the count read.
    """

    def __init__(self, max_fds: int, threads: int = 0, cap: int = 1024,
                 want: int = WANT_MEM, floor: bool = False) -> None:
        self.threads = threads
        self.degraded: Optional[str] = None
        self._floor = floor
        self._state: Any = ffi.new("pt_scanner *")
        self._info: Any = ffi.new("pt_scaninfo *")
        self._cap = max(cap, 1)
        self._rows: Any = ffi.new("pt_proc[]", self._cap)
        self._denied: Any = ffi.new("pt_denied[]", self._cap)
        slots = ffi.new("pt_fdslot[]", self._cap)
        spare = ffi.new("pt_fdslot[]", self._cap)
        lib.pt_scanner_init(self._state, slots, spare, self._cap, max_fds, want)
        self._keep: list[Any] = [slots, spare]
        self._finalizer = weakref.finalize(self, _close_scanner, self._state, self._keep)
        self.denied: list[tuple[int, Optional[int]]] = []

    @property
    def open_fds(self) -> int:
        """fds held between refreshes, the /proc dirfd included."""
        return int(self._state.open_fds)

    @property
    def max_fds(self) -> int:
        return int(self._state.max_fds)

    @property
    def last_reader(self) -> str:
        """The reader ("bpf" or "proc") of the last refresh."""
        return _reader_name(int(self._info.reader))

    def _grow(self, needed: int) -> None:
        cap = max(self._cap * 2, needed * 5 // 4 + 64)
        slots = ffi.new("pt_fdslot[]", cap)
        spare = ffi.new("pt_fdslot[]", cap)
        if lib.pt_scanner_resize(self._state, slots, spare, cap) != 0:  # pragma: no cover
            raise _os_error(ffi.errno, None, "growing the scanner")
        self._keep[:] = [slots, spare]
        self._rows = ffi.new("pt_proc[]", cap)
        self._denied = ffi.new("pt_denied[]", cap)
        self._cap = cap

    def _pass(self) -> int:
        info = self._info
        info.denied = self._denied
        info.denied_cap = self._cap
        fn = lib.pt_scanner_floor if self._floor else lib.pt_scanner_refresh
        return int(fn(self._state, self._rows, self._cap, self.threads, info))

    def _degrade(self, err: int) -> bool:
        """Out of fds (EMFILE/ENFILE): give back every kept fd and keep at most half
        as many from now on, down to none (open, read, close each time, as a
        snapshot does). False once there is nothing left to give back."""
        held = self.max_fds
        if held == 0:
            return False
        lib.pt_scanner_close(self._state)
        self._state.max_fds = held // 2
        self.degraded = (f"{os.strerror(err)}: now keeping at most {held // 2} fds "
                         f"(was {held})")
        return True

    def refresh(self, cls: type[RowT]) -> list[RowT]:
        """Every readable row, sorted by pid, as cls instances; the pids this
        caller may not read are in ``self.denied`` afterwards."""
        if not self._finalizer.alive:
            raise ValueError("the scanner is closed")
        for _attempt in range(40):
            n = self._pass()
            if n >= 0:
                break
            err = ffi.errno
            if err == errno.ENOSPC:
                self._grow(int(self._info.needed))
                continue
            if err in _FD_ERRORS and self._degrade(err):
                continue
            pid = int(self._info.bad_pid) if err == errno.EBADMSG else None
            raise _os_error(err, pid, "refreshing the process table")
        else:
            raise ProctableError("the process table kept growing faster than it could be read")
        self.denied = _denied(self._info) if self._info.ndenied else []
        if self._floor:
            return n  # type: ignore[return-value]
        return _build(cls, self._rows, n)

    def close(self) -> None:
        """Close every fd; the scanner cannot refresh afterwards."""
        self._finalizer()


def floor_read(pid: int, want: int = WANT_MEM) -> int:
    """The C floor of read_row: the same system calls for one process, no parsing."""
    n = lib.pt_floor_read(pid, want)
    if n < 0:
        raise _os_error(ffi.errno, pid, f"floor read of pid {pid}")
    return int(n)
