"""Lineage: every process a run starts (escapes included), and a teardown that proves them gone.

Two layers, as everywhere in proctable:

- the membership rules of the ``scan`` backend, a pure function over tables
  (:func:`scan_members`), tested without processes;
- :class:`Lineage`: a sampler thread that feeds a backend (``cgroup``,
  ``subreaper`` or ``scan``) and records every member as (pid, start time) with
  a pidfd opened when it is first seen; and a teardown that signals only through
  those pidfds, so a reused pid is never hit.
"""

from __future__ import annotations

import enum
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Optional, Union

from . import _lowlevel as _ll
from . import _pidfd
from ._cgroup import Cgroup, own_cgroup, usable_parent
from ._fdwait import readable
from ._procconn import EXIT, FORK, SID, Overrun, ProcConnector, open_connector
from ._status import ExitStatus, decode_wait_status
from .errors import NoSuchProcess, ProctableError, TeardownError
from .table import Identity, Proc, read, snapshot

__all__ = [
    "Ended",
    "Lineage",
    "LineageClosed",
    "MemberEnd",
    "ScanResult",
    "TeardownReport",
    "scan_members",
]

log = logging.getLogger("proctable.lineage")

MODES = ("auto", "cgroup", "subreaper", "scan")


# --- the membership rules (pure) ------------------------------------------------


class ScanResult(NamedTuple):
    """What one application of the scan rules to one table decided."""

    members: dict[int, int]
    """Every member now, pid -> start_time (zombies included: they still lead groups)."""
    groups: dict[int, int]
    """Process groups led by a member, pgid -> the leader's start_time."""
    sessions: dict[int, int]
    """Sessions led by a member, sid -> the leader's start_time."""
    new: list[int]
    """Members this table added, in the order they were found."""
    dropped: list[int]
    """Recorded members whose pid is gone or names another process now."""


def _rows(table: Iterable[Any]) -> list[tuple[int, int, int, int, int]]:
    out = []
    for r in table:
        if isinstance(r, Proc):
            out.append((r.pid, r.ppid, r.pgid, -1 if r.sid is None else r.sid, r.start_time))
        elif isinstance(r, tuple) and not hasattr(r, "_fields"):
            pid, ppid, pgid, sid, start = r
            out.append((pid, ppid, pgid, sid, start))
        else:
            out.append((r.pid, r.ppid, r.pgid, r.sid, r.start_time))
    return out


def scan_members(
    table: Iterable[Any],
    members: Mapping[int, int],
    groups: Mapping[int, int] = {},
    sessions: Mapping[int, int] = {},
) -> ScanResult:
    """Apply the lineage rules to one table of processes.

    ``table`` holds rows with ``pid, ppid, pgid, sid, start_time`` (``Proc`` rows,
    named tuples, or plain ``(pid, ppid, pgid, sid, start_time)`` tuples);
    ``members`` the members recorded so far (pid -> start_time); ``groups`` and
    ``sessions`` those recorded as led by a member (id -> the leader's start_time).

    - A recorded member whose pid is missing, or whose start time differs (the pid
      names another process now), is dropped.
    - A process is a member when its parent is a member and it started no earlier
      than that parent (an older one cannot be its child: the parent's pid was reused).
    - A process is a member when it is in a process group or a session that a
      member leads (or led: the group or session is recorded) and started no
      earlier than that leader. Groups and sessions no member ever led (the
      supervisor's own, which the root only inherited) are never claimed.
    - A recorded group or session is forgotten once no process is in it, or once
      a process that started after its leader holds its id as a pid (the id was
      free, so the old one is over).
    """
    rows = _rows(table)
    by_pid: dict[int, tuple[int, int, int, int, int]] = {}
    kids: dict[int, list[int]] = {}
    in_group: dict[int, list[int]] = {}
    in_session: dict[int, list[int]] = {}
    for row in rows:
        pid, ppid, pgid, sid, _ = row
        by_pid[pid] = row
        kids.setdefault(ppid, []).append(pid)
        in_group.setdefault(pgid, []).append(pid)
        in_session.setdefault(sid, []).append(pid)

    kept: dict[int, int] = {}
    dropped: list[int] = []
    for pid, start in members.items():
        found = by_pid.get(pid)
        if found is not None and found[4] == start:
            kept[pid] = start
        else:
            dropped.append(pid)

    def alive(index: Mapping[int, list[int]], ident: int, start: int) -> bool:
        if ident not in index:
            return False  # empty: over for good
        holder = by_pid.get(ident)
        return holder is None or holder[4] == start

    grp = {g: s for g, s in groups.items() if alive(in_group, g, s)}
    ses = {s_: s for s_, s in sessions.items() if alive(in_session, s_, s)}

    new: list[int] = []
    todo: list[int] = list(kept)

    def claim(pid: int, floor: int) -> None:
        row = by_pid[pid]
        if pid not in kept and row[4] >= floor:
            kept[pid] = row[4]
            new.append(pid)
            todo.append(pid)

    for g, start in grp.items():
        for pid in in_group[g]:
            claim(pid, start)
    for s_, start in ses.items():
        for pid in in_session[s_]:
            claim(pid, start)
    while todo:
        pid = todo.pop()
        row = by_pid[pid]
        start = row[4]
        for k in kids.get(pid, ()):
            claim(k, start)
        if row[2] == pid and pid not in grp:
            grp[pid] = start
            for k in in_group[pid]:
                claim(k, start)
        if row[3] == pid and pid not in ses:
            ses[pid] = start
            for k in in_session[pid]:
                claim(k, start)
    return ScanResult(kept, grp, ses, new, dropped)


# --- reports and errors ------------------------------------------------------------


class LineageClosed(ProctableError, RuntimeError):
    """The lineage was torn down already: it has no members and takes no calls."""


class Ended(str, enum.Enum):
    """How a member ended during teardown."""

    TERM = "term"
    """It exited after our SIGTERM (before any SIGKILL)."""
    KILL = "kill"
    """It was still there at the end of the grace period, and SIGKILL ended it."""
    ALREADY_GONE = "already_gone"
    """It exited before any signal of ours reached it."""
    UNRESOLVED = "unresolved"
    """Its end could not be proven (it may not be signalled, or outlived kill_timeout)."""

    def __str__(self) -> str:
        return self.value


class MemberEnd(NamedTuple):
    """One member in a :class:`TeardownReport`."""

    proc: Proc
    """The member's row as last seen (its name after any exec)."""
    ended: Ended
    seconds: Optional[float]
    """When its end was seen, in seconds from the start of teardown; None if unresolved."""
    exit: Optional[ExitStatus] = None
    """Its exit status, where the kernel still had it (pidfd exit info, or its zombie)."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def identity(self) -> Identity:
        return self.proc.identity


class TeardownReport(NamedTuple):
    """What :meth:`Lineage.terminate` did: every member, how it ended, how long it took."""

    mode: str
    members: tuple[MemberEnd, ...]
    seconds: float
    """Wall time of the whole teardown."""
    grace: float
    kill_timeout: float

    def by_end(self, ended: Ended) -> list[MemberEnd]:
        return [m for m in self.members if m.ended is ended]

    @property
    def termed(self) -> list[MemberEnd]:
        return self.by_end(Ended.TERM)

    @property
    def killed(self) -> list[MemberEnd]:
        return self.by_end(Ended.KILL)

    @property
    def already_gone(self) -> list[MemberEnd]:
        return self.by_end(Ended.ALREADY_GONE)

    @property
    def unresolved(self) -> list[MemberEnd]:
        return self.by_end(Ended.UNRESOLVED)

    def __str__(self) -> str:
        counts = ", ".join(
            f"{len(self.by_end(e))} {e}" for e in Ended if self.by_end(e)
        ) or "no members"
        return f"teardown ({self.mode}) in {self.seconds * 1000:.1f} ms: {counts}"


# --- the I/O layer ---------------------------------------------------------------


def _read_safe(pid: int) -> Optional[Proc]:
    """read(pid), with an unreadable row (a stat line caught mid-exit) as None."""
    try:
        return read(pid)
    except ProctableError:
        return None


def _readable(fd: int) -> bool:
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(0))


def _exit_of(m: _Member) -> Optional[ExitStatus]:
    """The member's exit status where the kernel still has it; else None."""
    if m.fd is not None and "pidfd_info" not in _pidfd.disabled():
        try:
            raw = _pidfd.exit_info(m.fd)
        except OSError:
            raw = None
        if raw is not None:
            try:
                return decode_wait_status(raw)
            except ValueError:
                return None
    row = _read_safe(m.pid)
    if row is not None and row.start_time == m.start and (m.fd is None or _readable(m.fd)):
        return row.exit
    return None


class _Member:
    """A recorded member: its identity, the pidfd opened when it was first seen,
    and (subreaper mode) /proc fds kept open so a walk costs one pread per member."""

    __slots__ = ("children_fd", "denied", "ended", "fd", "kill_at", "pid", "proc", "seen_end",
                 "start", "stopped", "task_fd", "term_at")

    def __init__(self, pid: int, start: int, fd: Optional[int], proc: Proc) -> None:
        self.pid = pid
        self.start = start
        self.fd = fd
        self.proc = proc
        self.task_fd: Optional[int] = None
        self.children_fd: Optional[int] = None
        self.stopped = False
        self.denied = False
        self.term_at: Optional[float] = None
        self.kill_at: Optional[float] = None
        self.ended: Optional[Ended] = None
        self.seen_end: Optional[float] = None

    def close(self) -> None:
        for name in ("fd", "task_fd", "children_fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                try:
                    os.close(fd)
                except OSError:
                    pass

    def close_proc_fds(self) -> None:
        for name in ("task_fd", "children_fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                try:
                    os.close(fd)
                except OSError:
                    pass


def _pidfd_open(pid: int) -> Optional[int]:
    """A pidfd for pid; None where the kernel or the fd limit gives none.
    ProcessLookupError when no process holds pid."""
    if not hasattr(os, "pidfd_open") or "pidfd" in _pidfd.disabled():
        return None
    try:
        return _pidfd.open_pidfd(pid)
    except ProcessLookupError:
        raise
    except OSError:
        return None


# Run by path in a fresh interpreter (-I -S: no site, no environment, fast): it
# needs only the standard library, so any python3 the caller may run will do.
_REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reaper.py")


def _load_reaper_source() -> Optional[str]:
    try:
        with open(_REAPER, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


# Kept from import time: a supervisor that later drops privileges (or runs the
# reaper under a uid that may not read this install) still has the reaper's code.
_REAPER_SOURCE = _load_reaper_source()


def _reaper_script() -> list[str]:
    """How the reaper interpreter gets the reaper: by path, or as -c source where
    this process may no longer read the file."""
    if os.access(_REAPER, os.R_OK) or _REAPER_SOURCE is None:
        return [_REAPER]
    return ["-c", _REAPER_SOURCE]


def _reaper_python() -> str:
    """The interpreter for the reaper: $PROCTABLE_REAPER_PYTHON, else ours, else python3."""
    env = os.environ.get("PROCTABLE_REAPER_PYTHON")
    if env:
        return env
    if sys.executable and os.access(sys.executable, os.X_OK):
        return sys.executable
    return shutil.which("python3") or sys.executable


def _read_line(fd: int, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the lineage's reaper did not start in time")
        r = readable([fd], left)
        if not r:
            continue
        data = os.read(fd, 4096)
        if not data:
            break
        buf += data
    return buf.split(b"\n", 1)[0]


def _check_interval(interval: object) -> float:
    if isinstance(interval, bool) or not isinstance(interval, (int, float)):
        raise TypeError(f"interval must be a number of seconds, not {type(interval).__name__}")
    if not 0 < interval < float("inf"):
        raise ValueError(f"interval must be > 0 seconds, not {interval}")
    return float(interval)


def _check_seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, not {value}")
    return float(value)


def _check_mode(mode: object) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    return str(mode)


Root = Union[int, Identity, "subprocess.Popen[Any]"]


class Lineage:
    """Every process a run starts, escapes included; a context manager.

    ``Lineage(root)`` attaches to a running process (a pid, an :class:`Identity`
    or a ``Popen``) and tracks it by scanning (``mode`` ``auto`` or ``scan``);
    :meth:`spawn` starts a command inside the tracking and can use the stronger
    backends. ``mode`` tells the backend in use: ``cgroup``, ``subreaper`` or
    ``scan``. Leaving the ``with`` block tears the lineage down
    (:meth:`terminate` with its defaults).
    """

    mode: str
    """The backend in use: ``cgroup``, ``subreaper`` or ``scan``."""
    root: Optional[Identity]
    """The command (or the attached root) as (pid, start_time)."""

    def __init__(self, root: Root, interval: float = 0.05, mode: str = "auto") -> None:
        interval = _check_interval(interval)
        mode = _check_mode(mode)
        if mode in ("cgroup", "subreaper"):
            raise ValueError(
                f"mode={mode!r} needs Lineage.spawn (the command must start inside it); "
                "attaching to a running process scans (mode='scan' or 'auto')")
        popen: Optional[subprocess.Popen[Any]] = None
        start: Optional[int] = None
        handle: Optional[int] = None
        if isinstance(root, subprocess.Popen):
            popen = root
            pid = _ll.check_pid(root.pid)
            if root.returncode is not None:
                raise NoSuchProcess(pid, f"no such process: pid {pid} exited already "
                                    f"(returncode {root.returncode})")
        elif isinstance(root, Identity):
            pid = _ll.check_pid(root.pid)
            start, handle = root.start_time, root.handle
        elif isinstance(root, bool) or not isinstance(root, int):
            raise TypeError("root is a pid, a proctable.Identity or a subprocess.Popen, "
                            f"not {type(root).__name__}")
        else:
            pid = _ll.check_pid(root)
        if pid == os.getpid():
            # Teardown stops and kills every member: never this process itself.
            raise ValueError("a lineage cannot be rooted at the calling process itself")
        self._setup("scan", interval, popen, open_connector())
        try:
            m = self._pin_root(pid, start, handle)
            self.root = Identity(pid, m.start, handle)
            self._floor = m.start
            self._start()
        except BaseException:
            self._release()
            raise

    # -- construction ---------------------------------------------------------------

    def _setup(self, mode: str, interval: float, process: Optional[subprocess.Popen[Any]],
               conn: Optional[ProcConnector]) -> None:
        self.mode = mode
        self.interval = interval
        self._process = process
        self.root = None
        self._spawned = False  # process is ours to reap at the end
        self._conn = conn
        self._lock = threading.RLock()
        self._state = "open"  # open -> tearing -> done (or failed: terminate may retry)
        self._members: dict[int, _Member] = {}
        self._by_fd: dict[int, _Member] = {}
        self._poll = select.poll()
        self._ended: list[_Member] = []
        self._tearing = False
        self._t0 = 0.0
        self._floor = 0
        self._own = {os.getpid()}  # never a member: us, and the lineage's own helpers
        # scan state
        self._known: dict[int, int] = {}
        self._groups: dict[int, int] = {}
        self._sessions: dict[int, int] = {}
        self._event_pids: set[int] = set()
        # reaper state
        self._reaper: Optional[_Member] = None
        self._reaper_fd: Optional[int] = None
        self._cg: Optional[Cgroup] = None
        self._cg_inside = False
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._error: Optional[BaseException] = None
        self.samples = 0  # how many looks so far (the sampler's and every other)
        self._filtered: Optional[set[int]] = None

    def _pin_root(self, pid: int, start: Optional[int], handle: Optional[int]) -> _Member:
        try:
            fd = _pidfd_open(pid)
        except ProcessLookupError:
            raise NoSuchProcess(pid, f"no such process: pid {pid} (gone, or reaped already)"
                                ) from None
        try:
            row = read(pid)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        what = None
        if handle is not None and fd is not None and os.fstat(fd).st_ino != handle:
            what = "names another process now"
        elif row is None or (row.state != "Z" and fd is not None and _readable(fd)):
            what = "is gone (or reaped already)"
        elif start is not None and row.start_time != start:
            what = "names another process now"
        if what is not None or row is None:
            if fd is not None:
                os.close(fd)
            raise NoSuchProcess(pid, f"no such process: pid {pid} {what}")
        m = _Member(pid, row.start_time, fd, row)
        self._known[pid] = row.start_time
        if self._conn is not None:
            self._event_pids.add(pid)  # its forks (and exit) may be queued already
        if row.state == "Z":  # exited, unreaped: it still leads its group and session
            if fd is not None:
                os.close(fd)
            m.fd = None
            return m
        self._add(m)
        return m

    @classmethod
    def spawn(cls, args: Any, interval: float = 0.05, mode: str = "auto", *,
              cgroup_parent: Optional[str] = None, **popen_kwargs: Any) -> Lineage:
        """Start ``args`` already inside the tracking; ``lineage.process`` is its Popen.

        ``popen_kwargs`` go to ``subprocess.Popen`` (stdio, cwd, env, sessions, ...).
        In ``cgroup`` and ``subreaper`` modes the Popen is the lineage's small
        reaper, which the command inherits all of that from, and whose returncode
        is the command's own; ``lineage.root`` is the command. ``cgroup_parent``
        names the cgroup v2 directory to create the lineage's cgroup in (default:
        the one this process is in).
        """
        interval = _check_interval(interval)
        mode = _check_mode(mode)
        if popen_kwargs.get("shell"):
            shell = popen_kwargs.pop("executable", None) or "/bin/sh"
            args = [shell, "-c", args] if isinstance(args, (str, bytes)) else [shell, "-c", *args]
        popen_kwargs.pop("shell", None)
        if isinstance(args, (str, bytes, os.PathLike)):
            args = [args]
        args = list(args)
        if not args:
            raise ValueError("empty command")
        cg = None if mode == "scan" else _lineage_cgroup(mode, cgroup_parent)
        self = cls.__new__(cls)
        conn = open_connector()  # before the command starts: every fork of it is seen
        try:
            if mode == "scan":
                self._setup("scan", interval, None, conn)
                self._process = subprocess.Popen(args, **popen_kwargs)
                m = self._pin_spawned(self._process.pid)
            else:
                self._setup("cgroup" if cg is not None else "subreaper", interval, None, conn)
                self._cg = cg
                m = self._start_reaper(args, popen_kwargs)
            self._spawned = True
            self.root = Identity(m.pid, m.start)
            self._floor = m.start
            self._start()
        except BaseException:
            if getattr(self, "_lock", None) is None:
                if conn is not None:
                    conn.close()
                if cg is not None:
                    cg.remove()
            else:
                self._abort_spawn()
            raise
        return self

    def _pin_spawned(self, pid: int) -> _Member:
        """Record our own fresh child (its pid cannot be reused: we have not reaped it)."""
        fd = _pidfd_open(pid)
        row = read(pid)
        if row is None:  # pragma: no cover - our unreaped child always has a row
            raise NoSuchProcess(pid)
        m = _Member(pid, row.start_time, fd, row)
        self._known[pid] = row.start_time
        if self._conn is not None:
            self._event_pids.add(pid)  # its forks (and exit) may be queued already
        if row.state == "Z":
            if fd is not None:
                os.close(fd)
            m.fd = None
            return m
        self._add(m)
        return m

    def _start_reaper(self, args: list[Any], kw: dict[str, Any]) -> _Member:
        status_r, status_w = os.pipe()
        try:
            argv = [_reaper_python(), "-I", "-S", *_reaper_script(),
                    "--ppid", str(os.getpid()), "--status-fd", str(status_w)]
            if self._cg is not None:
                home = own_cgroup()
                argv += ["--cgroup", self._cg.path]
                if home is not None:
                    argv += ["--home", home]
            exe = kw.pop("executable", None)
            if exe is not None:
                argv += ["--exe", os.fsdecode(exe)]
            if not kw.get("restore_signals", True):
                argv.append("--keep-signals")
            argv.append("--")
            argv += [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else a for a in args]
            kw["pass_fds"] = (*tuple(kw.get("pass_fds", ())), status_w)
            self._process = proc = subprocess.Popen(argv, **kw)
            os.close(status_w)
            status_w = -1
            line = _read_line(status_r, 30.0).split()
        finally:
            os.close(status_r)
            if status_w >= 0:
                os.close(status_w)
        if not line or line[0] != b"ok":
            if line and line[0] == b"error":
                err = int(line[1])
                msg = b" ".join(line[2:]).decode(errors="replace")
                raise OSError(err, msg, os.fsdecode(args[0]))
            raise ProctableError("the lineage's reaper failed to start "
                                 f"({(b' '.join(line)).decode(errors='replace') or 'no word'})")
        reaper, cmd, cmd_start, inside = (int(x) for x in line[1:5])
        self._cg_inside = bool(inside)
        self._own.update({proc.pid, reaper})
        rrow = read(reaper)
        if rrow is not None:
            self._reaper = _Member(reaper, rrow.start_time, None, rrow)
            try:
                self._reaper_fd = _pidfd_open(reaper)
            except ProcessLookupError:
                self._reaper_fd = None
        try:
            fd = _pidfd_open(cmd)
        except ProcessLookupError:
            fd = None
            row = None
        else:
            row = _read_safe(cmd)
        if row is None or row.start_time != cmd_start or row.state == "Z" or (
                fd is not None and _readable(fd)):
            # The command ended already (the reaper reaped it): nothing to pin.
            if fd is not None:
                os.close(fd)
            return _Member(cmd, cmd_start, None, row if row is not None else _fake_row(cmd))
        m = _Member(cmd, cmd_start, fd, row)
        self._add(m)
        return m

    def _abort_spawn(self) -> None:
        """spawn failed half-way: end what it started, free what it holds (bounded)."""
        p = self._process
        if p is not None and p.returncode is None:
            try:
                p.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=2.0)
        for m in list(self._members.values()):
            self._send(m, signal.SIGKILL)
        self._release()

    def _start(self) -> None:
        with self._lock:
            self._sample()
        self._thread = threading.Thread(target=self._run, name=f"proctable-lineage-{self.mode}",
                                        daemon=True)
        self._thread.start()

    # -- member bookkeeping -----------------------------------------------------------

    def _add(self, m: _Member) -> None:
        self._members[m.pid] = m
        if self._conn is not None:
            # Alive now, so its exit event is still to come: until then a fork event
            # naming it as the parent is a fork of this member.
            self._event_pids.add(m.pid)
        if m.fd is not None:
            self._by_fd[m.fd] = m
            self._poll.register(m.fd, select.POLLIN)

    def _record(self, pid: int, floor: int, ppid: Optional[int] = None,
                start: Optional[int] = None) -> Optional[_Member]:
        """Record pid as a member, pidfd first; None when it is gone, a zombie, or
        not what the hint said (another parent, too old, another start time)."""
        old = self._members.get(pid)
        if old is not None:
            return old
        if pid in self._own:
            return None
        try:
            fd = _pidfd_open(pid)
        except ProcessLookupError:
            return None
        row = _read_safe(pid)
        ok = (row is not None and row.state != "Z" and row.start_time >= floor
              and (ppid is None or row.ppid == ppid)
              and (start is None or row.start_time == start)
              # our pidfd's process died and the pid was reused before the read
              and (fd is None or not _readable(fd)))
        if not ok or row is None:
            if fd is not None:
                os.close(fd)
            return None
        m = _Member(pid, row.start_time, fd, row)
        self._add(m)
        if self._tearing:
            log.debug("new member during teardown: %r", row)
        return m

    def _end(self, m: _Member) -> None:
        """m is gone: stop tracking it (keep its pidfd until the report, in teardown)."""
        if self._members.get(m.pid) is m:
            del self._members[m.pid]
        if m.fd is not None:
            self._by_fd.pop(m.fd, None)
            try:
                self._poll.unregister(m.fd)
            except (KeyError, ValueError):
                pass
        m.close_proc_fds()
        if self._tearing:
            m.seen_end = time.monotonic() - self._t0
            self._ended.append(m)
        else:
            m.close()

    def _reap_exited(self) -> None:
        """Drop every member whose pidfd polls readable (it exited), or, without a
        pidfd, whose identity no longer matches."""
        for fd, _ in self._poll.poll(0):
            m = self._by_fd.get(fd)
            if m is not None:
                self._end(m)
        for m in [m for m in self._members.values() if m.fd is None]:
            try:
                row = read(m.pid)
            except ProctableError:
                continue  # unknown is not gone
            if row is None or row.start_time != m.start or row.state in ("Z", "X"):
                self._end(m)

    # -- sampling ---------------------------------------------------------------------

    def _sample(self) -> bool:
        """One look for new and ended members; False when the table could not be read."""
        self.samples += 1
        if self._conn is not None:
            self._on_events()  # follow every fork already reported before looking
        if self.mode == "cgroup":
            self._sample_cgroup()
        elif self.mode == "subreaper":
            self._sample_walk()
        else:
            return self._sample_scan()
        self._filter_events()
        return True

    def _filter_events(self) -> None:
        """cgroup and subreaper modes: only events about members wake us (they only
        hurry a sample; the structure catches every process anyway). A scan must see
        every fork: a child's own forks may come before we could widen a filter."""
        conn = self._conn
        if conn is None:
            return
        # Here the events only hurry samples: the live members are all we follow.
        self._event_pids = set(self._members)
        if self._filtered == self._event_pids:
            return
        try:
            conn.only_about(self._event_pids)
            self._filtered = set(self._event_pids)
        except OSError as e:
            log.debug("lineage: no socket filter for proc events: %s", e)
            self._filtered = None

    def _sample_cgroup(self) -> None:
        assert self._cg is not None
        pids = self._cg.procs()
        self._reap_exited()  # after the read: a pid listed and still ours is the same process
        for pid in pids:  # cgroup.procs is the truth here: no parent or age test
            if pid not in self._members:
                self._record(pid, 0)

    def _sample_walk(self) -> None:
        self._reap_exited()
        self._walk()

    def _walk(self) -> None:
        """Walk down from the reaper through /proc/<pid>/task/<tid>/children (a hint:
        ppid and start time are re-checked before a pid is recorded)."""
        reaper = self._reaper
        if reaper is None:
            return
        todo = [reaper]
        seen: set[int] = set()
        while todo:
            node = todo.pop()
            for pid in self._children(node):
                if pid in seen:
                    continue
                seen.add(pid)
                m = self._members.get(pid)
                if m is None:
                    m = self._record(pid, node.start, ppid=node.pid)
                if m is not None:
                    todo.append(m)

    def _children(self, node: _Member) -> list[int]:
        try:
            if node.task_fd is None:
                node.task_fd = os.open(f"/proc/{node.pid}/task",
                                       os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                node.children_fd = os.open(f"/proc/{node.pid}/task/{node.pid}/children",
                                           os.O_RDONLY | os.O_CLOEXEC)
            threads = os.fstat(node.task_fd).st_nlink - 2
            if threads <= 1:
                assert node.children_fd is not None
                data = os.pread(node.children_fd, 1 << 16, 0)
                if len(data) < 1 << 16:
                    return [int(x) for x in data.split()]
            tids = os.listdir(node.task_fd)
        except OSError:
            node.close_proc_fds()
            return []  # it exited: its children re-parented to the reaper
        out: list[int] = []
        for tid in tids:
            try:
                with open(f"/proc/{node.pid}/task/{tid}/children", "rb") as f:
                    out.extend(int(x) for x in f.read().split())
            except OSError:
                continue
        return out

    def _sample_scan(self) -> bool:
        if not self._members and not self._groups and not self._sessions and not (
                self._event_pids) and not any(self._exists(p) for p in self._known):
            return True  # nothing left that could ever add a member
        try:
            table = snapshot()
        except ProctableError as exc:
            log.debug("lineage: table unreadable this time: %s", exc)
            return False
        self._reap_exited()
        known = self._known
        if self._event_pids:
            # A pid the event stream says a member forked, and whose exit it has not
            # reported yet, is that very process (the exit comes before any reuse).
            known = dict(known)
            for pid in self._event_pids:
                row = table.get(pid)
                if row is not None and pid not in known and row.start_time >= self._floor:
                    known[pid] = row.start_time
        res = scan_members(table, known, self._groups, self._sessions)
        self._known, self._groups, self._sessions = res.members, res.groups, res.sessions
        for pid in res.dropped:
            m = self._members.get(pid)
            if m is not None:
                self._end(m)  # its pid names another process now
        for pid in res.new:
            if pid not in self._members:
                self._record(pid, 0, start=res.members[pid])
        return True

    @staticmethod
    def _exists(pid: int) -> bool:
        try:
            return read(pid) is not None
        except ProctableError:
            return True

    # -- the proc connector --------------------------------------------------------------

    def _on_events(self) -> bool:
        """Read queued proc events; True when one concerns us (sample now)."""
        conn = self._conn
        if conn is None:
            return False
        try:
            events = conn.read()
        except Overrun:
            # Lost events: forget exits we may have missed; the sample that follows
            # looks at everything anyway.
            self._event_pids = set(self._members)
            return True
        except OSError:
            return False
        urgent = False
        members = self._members
        # Pids of the lineage by the event stream: added at fork (or when recorded),
        # removed at exit, which the stream reports before any reuse of the pid.
        chain = self._event_pids
        scan = self.mode == "scan"
        for what, a, b, c, d in events:
            if what == FORK:
                if c != d or b not in chain:
                    continue  # a new thread, or not a fork of ours
                urgent = True
                chain.add(d)
                if scan and d not in members:
                    # Record the child at once: its parent may exit before the next
                    # sample and leave it orphaned in a session of its own.
                    parent = members.get(b)
                    floor = parent.start if parent is not None else self._floor
                    m = self._record(d, floor)
                    if m is not None:
                        self._known[d] = m.start
            elif what == EXIT:
                if a == b:
                    chain.discard(b)
                    if b in members:
                        urgent = True
            elif what == SID and b in members:
                urgent = True
        return urgent

    def _run(self) -> None:
        interval = self.interval
        due = time.monotonic() + interval
        fds = [self._wake_r]
        if self._conn is not None:
            fds.append(self._conn.fileno())
        while not self._stop.is_set():
            left = due - time.monotonic()
            try:
                r = readable(fds, max(left, 0.0))
            except OSError:
                r = []
            if self._stop.is_set():
                break
            try:
                with self._lock:
                    if self._state != "open":
                        break
                    urgent = bool(r) and self._on_events()
                    now = time.monotonic()
                    if urgent or now >= due:
                        self._sample()
                        due = now + interval
            except Exception as exc:  # keep sampling; report once
                if self._error is None:
                    log.warning("lineage sampler: %r", exc)
                self._error = exc

    # -- public -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state == "done":
            raise LineageClosed("this lineage was torn down; start a new one")

    def sample(self) -> None:
        """Look for new members now (the sampler thread does so every ``interval``)."""
        self._check_open()
        with self._lock:
            self._check_open()
            if self._state == "open":
                self._sample()

    def members(self) -> list[Proc]:
        """Every live member now (zombies left out), as fresh rows, oldest first."""
        self._check_open()
        with self._lock:
            self._check_open()
            if self._state == "open":
                self._sample()
            return self._fresh_rows()

    def _fresh_rows(self) -> list[Proc]:
        out = []
        for m in list(self._members.values()):
            row = _read_safe(m.pid)
            if row is None or row.start_time != m.start or (
                    m.fd is not None and row.state != "Z" and _readable(m.fd)):
                continue
            m.proc = row
            if row.state == "Z" and (row.num_threads or 1) <= 1:
                continue
            out.append(row)
        out.sort(key=lambda p: (p.start_time, p.pid))
        return out

    @property
    def process(self) -> subprocess.Popen[Any]:
        """The Popen: spawn's (in cgroup and subreaper modes the lineage's mirror
        process, whose returncode is the command's own, set when the command ends),
        or the one given to attach. ProctableError for a lineage attached by pid."""
        if self._process is None:
            raise ProctableError("this lineage was attached by pid or Identity: it has no Popen")
        return self._process

    @property
    def closed(self) -> bool:
        """True once terminate() proved every member gone."""
        return self._state == "done"

    @property
    def sampler_thread(self) -> Optional[threading.Thread]:
        """The sampler thread while it runs (its CPU time is what a lineage costs)."""
        return self._thread

    def __enter__(self) -> Lineage:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._state != "done":
            self.terminate()

    def __repr__(self) -> str:
        root = self.root.pid if self.root is not None else None
        return (f"<Lineage mode={self.mode} root={root} members={len(self._members)} "
                f"state={self._state}>")

    # -- teardown --------------------------------------------------------------------------

    def _send(self, m: _Member, sig: int) -> bool:
        """sig to m through its pidfd; without one, after an identity re-check."""
        if m.denied:
            return False
        try:
            if m.fd is not None:
                signal.pidfd_send_signal(m.fd, sig)
            else:
                row = _read_safe(m.pid)
                if row is None or row.start_time != m.start:
                    return False
                os.kill(m.pid, sig)  # no pidfds here: right after the identity check
        except ProcessLookupError:
            return False
        except PermissionError:
            m.denied = True
            return False
        return True

    def _stop_forks(self) -> None:
        """Stop new forks: freeze the cgroup, or SIGSTOP every member (again for new ones)."""
        if self._cg is not None and not self._cg_inside:
            self._cg.freeze(timeout=0.5)
            self._sample()
        for _ in range(20):
            fresh = [m for m in self._members.values() if not m.stopped]
            if not fresh:
                break
            for m in fresh:
                m.stopped = True
                if self._cg is None or self._cg_inside:
                    self._send(m, signal.SIGSTOP)
            self._sample()

    def _signal_new(self, sig: int, now: float) -> None:
        for m in list(self._members.values()):
            if sig == signal.SIGTERM and m.term_at is None:
                if self._send(m, signal.SIGTERM):
                    m.term_at = now
                self._send(m, signal.SIGCONT)
            elif sig == signal.SIGKILL and m.kill_at is None and self._send(m, signal.SIGKILL):
                m.kill_at = now

    def _structurally_empty(self) -> bool:
        cg = self._cg
        if cg is None:
            return True  # the walk / the scan found nothing after a fresh sample
        if self._cg_inside and self._reaper is not None:
            return set(cg.procs()) <= {self._reaper.pid}
        return not cg.populated()

    def _all_gone(self) -> bool:
        self._reap_exited()
        looked = self._sample()
        return looked and not self._members and self._structurally_empty()

    def _wait_gone(self, deadline: float, sig: int) -> bool:
        extra = []
        if self._conn is not None:
            extra.append((self._conn.fileno(), select.POLLIN))
        if self._cg is not None and self._cg.events_fd >= 0:
            extra.append((self._cg.events_fd, select.POLLPRI))
        for fd, ev in extra:
            self._poll.register(fd, ev)
        try:
            while True:
                self._signal_new(sig, time.monotonic() - self._t0)
                if self._all_gone():
                    return True
                self._signal_new(sig, time.monotonic() - self._t0)
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._poll.poll(max(1, int(min(left, self.interval) * 1000)))
                self._on_events()
        finally:
            for fd, _ in extra:
                try:
                    self._poll.unregister(fd)
                except (KeyError, ValueError):
                    pass

    def terminate(self, grace: float = 5.0, kill_timeout: float = 5.0) -> TeardownReport:
        """Tear the lineage down and prove every member gone.

        Sample; stop new forks (freeze the cgroup, or SIGSTOP every member); SIGTERM
        every member; SIGCONT (thaw); for ``grace`` seconds keep sampling and
        SIGTERM every new member; then SIGKILL what is left (``cgroup.kill``) and
        wait at most ``kill_timeout`` seconds for the proof: each member's pidfd
        polls readable (or its identity no longer matches), and in cgroup mode
        ``populated 0``. Every signal goes through the pidfd opened when the member
        was first recorded. Raises :class:`TeardownError` (with ``survivors``, the
        rows of the members whose end could not be proven) otherwise.
        """
        grace = _check_seconds(grace, "grace")
        kill_timeout = _check_seconds(kill_timeout, "kill_timeout")
        self._check_open()
        self._halt_thread()
        with self._lock:
            self._check_open()
            self._state = "tearing"
            self._tearing = True
            self._t0 = t0 = time.monotonic()
            self._on_events()
            self._reap_exited()
            self._sample()
            self._fresh_rows()
            self._stop_forks()
            self._signal_new(signal.SIGTERM, time.monotonic() - t0)
            if self._cg is not None and not self._cg_inside:
                self._cg.thaw()
            gone = self._wait_gone(t0 + grace, signal.SIGTERM)
            if not gone:
                if self._cg is not None and not self._cg_inside and self._cg.kill():
                    now = time.monotonic() - t0
                    for m in self._members.values():
                        m.kill_at = now  # cgroup.kill reached every one of them
                gone = self._wait_gone(time.monotonic() + kill_timeout, signal.SIGKILL)
            report, survivors = self._report(t0, grace, kill_timeout)
            if not gone:
                self._state = "failed"
                self._tearing = False
                raise TeardownError(
                    f"{len(survivors)} member(s) of the lineage could not be proven gone "
                    f"within grace {grace}s + kill_timeout {kill_timeout}s: "
                    + ", ".join(f"{p.pid} {p.name}" for p in survivors),
                    list(survivors), report)
            self._finish(max(kill_timeout, 1.0))
            self._state = "done"
            return report

    def _report(self, t0: float, grace: float,
                kill_timeout: float) -> tuple[TeardownReport, list[Proc]]:
        ends = []
        for m in self._ended:
            ex = _exit_of(m)
            if m.kill_at is not None and (ex is None or ex.signal == signal.SIGKILL
                                          or m.term_at is None):
                how = Ended.KILL
            elif m.term_at is not None:
                how = Ended.TERM
            else:
                how = Ended.ALREADY_GONE
            ends.append(MemberEnd(m.proc, how, m.seen_end, ex))
        survivors = []
        for m in self._members.values():
            row = _read_safe(m.pid)
            if row is not None and row.start_time == m.start:
                m.proc = row
            survivors.append(m.proc)
            ends.append(MemberEnd(m.proc, Ended.UNRESOLVED, None, None))
        if self._cg is not None and self._members == {}:
            # Never recorded, yet in the cgroup (and not proven gone): say so.
            for pid in self._cg.procs():
                row = _read_safe(pid)
                if row is not None and pid not in self._own:
                    survivors.append(row)
                    ends.append(MemberEnd(row, Ended.UNRESOLVED, None, None))
        ends.sort(key=lambda e: (e.seconds if e.seconds is not None else float("inf"), e.pid))
        report = TeardownReport(self.mode, tuple(ends), time.monotonic() - t0, grace,
                                kill_timeout)
        return report, survivors

    def _halt_thread(self) -> None:
        t = self._thread
        if t is not None and t.is_alive() and t is not threading.current_thread():
            self._stop.set()
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass
            t.join(timeout=5.0)
        self._thread = None

    def _finish(self, timeout: float) -> None:
        """Every member is gone: let the reaper and the mirror end, free everything."""
        deadline = time.monotonic() + timeout
        if self._reaper_fd is not None:
            p = select.poll()
            p.register(self._reaper_fd, select.POLLIN)
            p.poll(max(0, int((deadline - time.monotonic()) * 1000)))
            try:  # reap the reaper if it re-parented to us (we are a subreaper, or pid 1)
                os.waitid(os.P_PIDFD, self._reaper_fd, os.WEXITED | os.WNOHANG)
            except (ChildProcessError, AttributeError, OSError):
                pass
        p_ = self._process
        if p_ is not None and self._spawned:
            try:
                p_.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("lineage: the reaper (pid %d) did not end; killing it", p_.pid)
                p_.kill()
                try:
                    p_.wait(timeout=1.0)
                except subprocess.TimeoutExpired:  # pragma: no cover
                    pass
        self._release()

    def _release(self) -> None:
        self._halt_thread()
        for m in list(self._members.values()) + self._ended:
            m.close()
        self._members.clear()
        self._by_fd.clear()
        self._ended = []
        if self._reaper is not None:
            self._reaper.close()
        if self._reaper_fd is not None:
            os.close(self._reaper_fd)
            self._reaper_fd = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._cg is not None:
            cg, self._cg = self._cg, None
            if cg.populated():
                cg.kill()  # only after a failed spawn: nothing of ours may stay in it
                cg.wait_empty(2.0)
            if not cg.remove(timeout=2.0):
                log.warning("lineage: could not remove cgroup %s", cg.path)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1
        self._tearing = False


def _lineage_cgroup(mode: str, parent: Optional[str]) -> Optional[Cgroup]:
    """A fresh child cgroup for a spawned lineage, or None (subreaper) where there is
    no writable cgroup v2; mode 'cgroup' insists."""
    path = usable_parent(parent) if mode in ("auto", "cgroup") else None
    if path is not None:
        try:
            return Cgroup.create(path)
        except OSError as e:
            log.debug("no lineage cgroup under %s: %s", path, e)
    if mode == "cgroup":
        where = f" under {parent}" if parent else ""
        raise ProctableError("mode='cgroup' needs a writable cgroup v2 (root, or a delegated "
                             f"one); none here{where}")
    return None


def _fake_row(pid: int) -> Proc:
    """A row for a process that is gone before it could be read (name unknown)."""
    return Proc((pid, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0, b"X", b"?"))

