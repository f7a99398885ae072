"""Scanner: the process table, re-read fast by keeping stat fds open."""

from __future__ import annotations

import resource
import threading
from types import TracebackType
from typing import Optional

from . import _lowlevel as _ll
from .table import Proc, Table, _table, _want

__all__ = ["Scanner", "default_max_fds"]

# Never more than this many kept fds by default, however high the limit.
_DEFAULT_CEILING = 32768


def _half_soft_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return 2**31 - 1
    return int(soft) // 2


def default_max_fds() -> int:
    """The default cap: half of RLIMIT_NOFILE's soft limit (512 under the usual
    1024), and at most 32768."""
    return min(_half_soft_limit(), _DEFAULT_CEILING)


class Scanner:
    """The whole process table, refreshed again and again at less cost.

    ``snapshot()`` opens, reads and closes ``/proc/<pid>/stat`` (and ``statm``)
    for every process. A Scanner keeps those files open between refreshes,
    with an ``O_PATH`` fd of each ``/proc/<pid>`` directory, and re-reads them
    with ``pread``: no path walk, no open, no close. Each ``refresh()`` lists
    ``/proc`` again, opens only the pids it has not seen, and closes the fds of
    pids that are gone. A reused pid cannot hide behind a kept fd: the kernel
    fails the read of an fd whose process is gone (ESRCH), and the Scanner then
    opens the pid afresh, so the new process shows with its own start time, as
    in a snapshot.

    **File descriptors.** A Scanner holds up to ``max_fds`` fds between
    refreshes, its ``/proc`` directory fd included, all ``O_CLOEXEC``: three a
    process (stat, statm, the directory; two with ``memory=False``). The
    default is half of the soft ``RLIMIT_NOFILE`` (512 under the common
    ``ulimit -n`` of 1024, so about 170 processes kept) and at most 32768; a
    larger ``max_fds`` is lowered to half the soft limit, so that a Scanner
    never takes more than half of the process's fds. Processes beyond the cap
    are read as ``snapshot()`` reads them (open, read, close) on every refresh:
    still correct, only slower. ``max_fds=0`` keeps nothing open. ``open_fds``
    tells how many are held now. When the process runs out of fds anyway
    (EMFILE, ENFILE: other code took them), a refresh gives back every kept fd,
    halves ``max_fds`` and reads on; ``degraded`` then says so.

    **uid.** Every refresh reads each process's owner afresh from its kept
    directory fd (``fstat``), so a daemon that drops root with ``setuid()``
    shows its new uid at the next refresh (a kept *file*'s owner is only
    updated by a path lookup, and a non-dumpable process's files are root's).

    **Threads.** Large tables are read by a few C threads at once where a
    second CPU is free (``threads``: None decides; 1 uses one). A Scanner is
    thread-safe: refreshes from several Python threads run one at a time.

    **Lifetime.** ``close()`` closes every fd; so do leaving a ``with`` block
    and garbage collection. A closed Scanner raises ``ValueError`` on refresh.
    On platforms without kept fds (macOS) a refresh is a ``snapshot()``.

    **BPF.** Where the BPF reader runs (:func:`proctable.reader`), a refresh
    is one pass of the BPF task iterator, cheaper than any kept fd: the
    Scanner then keeps no fds (``open_fds`` is 0). ``reader="proc"`` keeps
    the /proc behaviour above; ``reader="bpf"`` insists on BPF (OSError
    ENOTSUP where it cannot run), as for :func:`proctable.snapshot`.
    """

    def __init__(self, max_fds: Optional[int] = None, threads: Optional[int] = None,
                 memory: bool = True, *, reader: str = "auto") -> None:
        if max_fds is None:
            cap = default_max_fds()
        else:
            if isinstance(max_fds, bool) or not isinstance(max_fds, int):
                raise TypeError(f"max_fds is an int, not {type(max_fds).__name__}")
            if max_fds < 0:
                raise ValueError(f"max_fds must be >= 0, not {max_fds}")
            cap = min(max_fds, _half_soft_limit())
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise ValueError(f"threads must be None or a positive int, not {threads!r}")
        want = _want(memory) | _ll.reader_want(reader)
        self._lock = threading.Lock()
        self._fds = _ll.FdScanner(cap, threads or 0, want=want)

    @property
    def degraded(self) -> Optional[str]:
        """Why this Scanner keeps fewer fds than it was given (it ran out), or None."""
        return self._fds.degraded

    @property
    def max_fds(self) -> int:
        """The most fds this Scanner keeps open between refreshes."""
        return self._fds.max_fds

    @property
    def open_fds(self) -> int:
        """The fds it keeps open now (the /proc directory fd included)."""
        return self._fds.open_fds

    @property
    def last_reader(self) -> str:
        """The reader of the last refresh: ``"bpf"`` or ``"proc"``."""
        return self._fds.last_reader

    def refresh(self) -> Table:
        """The whole process table now, sorted by pid (as ``snapshot()``)."""
        with self._lock:
            rows = self._fds.refresh(Proc)
            return _table(rows, self._fds.denied)

    def close(self) -> None:
        """Close every fd the Scanner holds. Safe to call more than once."""
        with self._lock:
            self._fds.close()

    def __enter__(self) -> Scanner:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Scanner max_fds={self.max_fds} open_fds={self.open_fds}>"
