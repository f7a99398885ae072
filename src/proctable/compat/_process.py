"""psutil's process API on Linux: ``Process``, ``pids``, ``pid_exists``, ``wait_procs``.

Each method gives what psutil 7 gives for the same process (value, type, and
the exception class where psutil raises), with the answers read through the
C core: one read per file, with the stat line read last as the proof that the
pid still names the process the object was made for. Where psutil's rules look
odd (a kernel thread's ``environ()`` is NoSuchProcess, because the kernel says
ESRCH; ``children()`` is AccessDenied as soon as one process of the host is
unreadable), they are kept: code that worked against psutil keeps working.

Where identity matters this does better than psutil, which checks a pid's
start time only in some calls:

- a Process is (pid, start time) and, where pidfds live on pidfs, the pidfd's
  inode (never reused). Every method answers for that process: once the pid
  names another one, a getter raises NoSuchProcess, ``is_running()`` is False,
  and a signal is sent through a pidfd proven to be of it, never to the pid's
  next owner;
- ``wait()`` of a process that is not our child returns its exit code once it
  is a zombie (field 52 of its stat line), where psutil waits for its reaping
  and returns None;
- ``children(recursive=True)`` reads the table once through the BPF reader
  where it runs, else the children files of the tree (a cost in proportion to
  the tree); ``wait_procs()`` polls every pidfd at once.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable, NamedTuple, Optional, TypeVar

from .. import _ended, _extra, _pidfd
from .. import _lowlevel as _ll
from .. import errors as _errors
from .._fdwait import readable
from ..exits import ProbeState, exit_probe
from ..table import Proc, _has_pidfs, snapshot
from . import _decode
from ._decode import COMM_TRUNCATED, PF_KTHREAD, STATUS, Denied, pcputimes, pgids, pmem, puids
from ._errors import AccessDenied, NoSuchProcess, TimeoutExpired, ZombieProcess

__all__ = ["Negsignal", "Process", "pid_exists", "pids", "wait_procs"]

T = TypeVar("T")

_TICKS = _ll.TICKS_PER_SECOND
_PAGE = _ll.PAGE_SIZE
_UNSET: Any = object()

# The negated signal numbers psutil's wait() returns for a signal death (an IntEnum:
# equal to the int, and named, as psutil's Negsignal).
Negsignal: Any = enum.IntEnum(  # type: ignore[misc]
    "Negsignal", [(s.name, -s.value) for s in signal.Signals])


def _negsig(num: int) -> int:
    try:
        return Negsignal(num)
    except ValueError:
        return num


def _exit_code(raw: int) -> Optional[int]:
    """psutil's value of a wait status: the exit code, or the negated signal."""
    if os.WIFEXITED(raw):
        return os.WEXITSTATUS(raw)
    if os.WIFSIGNALED(raw):
        return _negsig(-os.WTERMSIG(raw))
    return None


def _check_pid(pid: object) -> int:
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise TypeError(f"a pid is an int, not {type(pid).__name__}")
    if pid < 0:
        raise ValueError(f"a pid is a positive int or 0, not {pid}")
    return pid


def _hidden(pid: int) -> bool:
    """/proc hides pid from this caller as if no process held it (hidepid=2), which
    psutil reports as NoSuchProcess."""
    return not os.path.lexists(f"/proc/{pid}")


class _Here(NamedTuple):
    """What the pidfd family may do here now (the kernel, less PROCTABLE_DISABLE),
    asked once per call that needs it."""

    pidfd: bool
    signal: bool
    waitid: bool  # waitid(P_PIDFD)


def _here() -> _Here:
    if _pidfd.DISABLE_ENV in os.environ:
        f = _pidfd.features()
        return _Here(f.pidfd, f.pidfd_signal, f.waitid_pidfd)
    k = _pidfd._probe_kernel()
    return _Here(k.pidfd, k.pidfd and k.signal, k.pidfd and k.waitid_pidfd)


def _pidfds() -> bool:
    """pidfd_open works here (and PROCTABLE_DISABLE does not turn it off)."""
    if _pidfd.DISABLE_ENV in os.environ:
        return _pidfd.features().pidfd
    return _pidfd._probe_kernel().pidfd


def _pidfd_signals() -> bool:
    if _pidfd.DISABLE_ENV in os.environ:
        return _pidfd.features().pidfd_signal
    return _pidfd._probe_kernel().signal


def _proc_ino(pid: int) -> Optional[int]:
    """The inode of /proc/<pid>: it stays the same while that process holds the
    pid (its dentry is tied to the process), and a reused pid gets a new one."""
    try:
        return os.stat(f"/proc/{pid}").st_ino
    except OSError:
        return None


def _open_pidfd(pid: int, here: Optional[_Here] = None) -> Optional[int]:
    """A pidfd of the process holding pid; None where pidfds cannot be had here.
    NoSuchProcess when no process holds it (a thread id is no process)."""
    if not (here or _here()).pidfd:
        return None
    try:
        return os.pidfd_open(pid)
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.ENOENT, errno.EINVAL):
            raise NoSuchProcess(pid, None, f"no process has pid {pid}") from None
        if e.errno in (errno.EMFILE, errno.ENFILE, errno.EPERM, errno.ENOSYS, errno.EACCES):
            return None  # out of fds, or a sandbox: answer without one
        raise


def _handle_of(fd: Optional[int]) -> Optional[int]:
    return os.fstat(fd).st_ino if fd is not None and _has_pidfs() else None


def _pin_new(pid: int) -> tuple[Optional[int], Optional[int], Optional[int]]:
    """(start time, pidfs handle, /proc/<pid> inode) of the process that holds pid
    now: NoSuchProcess where none does (a thread id included). In one C call, a
    pidfd is opened first and the inode looked up, then the stat line is read:
    a pidfd that has not ended after the read (or ended with the row) is the
    row's process, and so is the inode. Where /proc denies the stat line
    (hidepid=1), start time None."""
    for _attempt in range(3):
        x, row = _extra.read_one(Proc, pid, -1, _extra.X_PIN)
        handle = (x.pidfs_ino or None) if _has_pidfs() else None
        ino = x.dir_ino or None
        if x.err_stat == errno.EACCES:
            if _hidden(pid):
                raise NoSuchProcess(pid, None, f"no process has pid {pid}")
            return None, handle, ino
        if x.err_stat:
            raise OSError(x.err_stat, f"pid {pid}: stat: {os.strerror(x.err_stat)}")
        if x.flags & _extra.F_GONE:
            raise NoSuchProcess(pid, None, f"no process has pid {pid}")
        if x.flags & _extra.F_PIDFD_ENDED and not _ended.row_ended(row.state, row.num_threads):
            continue  # the pidfd's process ended and another took the pid: again
        return row.start_time, handle, ino
    raise NoSuchProcess(pid, None, f"pid {pid} changed hands while it was read")


_total_mem: Optional[int] = None


def _total_phymem() -> int:
    """MemTotal in bytes, read once (psutil keeps its first virtual_memory().total)."""
    global _total_mem
    if _total_mem is None:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    _total_mem = int(line.split()[1]) * 1024
                    break
            else:  # pragma: no cover - every Linux prints it
                raise ValueError("no MemTotal line in /proc/meminfo")
    return _total_mem


_cpus = (0, -1.0)  # (online CPUs, when counted)


def _online_cpus() -> int:
    """sysconf(SC_NPROCESSORS_ONLN), as psutil's cpu_count() (counted again after a
    second: CPUs go on and off line rarely, and the call costs microseconds)."""
    global _cpus
    n, when = _cpus
    now = time.monotonic()
    if now - when > 1.0:
        n = os.sysconf("SC_NPROCESSORS_ONLN") or 1
        _cpus = (n, now)
    return n


_lowest: Optional[int] = None

# children()'s road: "auto" (the table through BPF where it runs, else the children
# files), or "walk", "table", "table-proc" (the table through /proc): to time each.
_children_road = "auto"


def _children_files(pid: int) -> Optional[list[int]]:
    """The pids in pid's threads' children files ([] once it is gone); None where
    the kernel has no such file (CONFIG_PROC_CHILDREN off, or turned off by
    PROCTABLE_DISABLE=proc_children)."""
    if "proc_children" in _pidfd.disabled():
        return None
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone (or hidden): its children, if any, are not ours to list
    out: list[int] = []
    for tid in tids:
        try:
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if tid == str(pid) and os.path.isdir(f"/proc/{pid}/task/{tid}"):
                return None  # the thread is there, its children file is not
            continue  # the thread ended
        except OSError:
            continue
        try:
            chunks = []
            while True:
                data = os.read(fd, 65536)
                if not data:
                    break
                chunks.append(data)
        except OSError:
            chunks = []
        finally:
            os.close(fd)
        out.extend(int(x) for x in b"".join(chunks).split())
    return out


def _lists_denied() -> bool:
    """Is /proc mounted hidepid=1 (noaccess): it lists the pids it denies, and psutil's
    children() says AccessDenied for them. (Read from /proc/self/mountinfo: the
    last proc mount on /proc.)"""
    opts = ""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and fields[4] == b"/proc" and b" - proc " in line:
                    opts = line.rsplit(b" ", 1)[-1].decode("ascii", "replace")
    except OSError:
        return True  # unknown: the table road, which tells denials as psutil does
    return any(o in ("hidepid=1", "hidepid=noaccess") for o in opts.strip().split(","))


def _lowest_pid() -> int:
    """The lowest pid of the last pids() (psutil's rule for parent() of the first
    process: it has none)."""
    if _lowest is None:
        pids()
    assert _lowest is not None
    return _lowest


# What each value reads through the C core besides the stat line (pt_read_one's want).
_X_NEEDS = {
    "uids": _extra.X_STATUS, "gids": _extra.X_STATUS, "username": _extra.X_STATUS,
    "memory_info": _extra.X_STATM, "memory_percent": _extra.X_STATM,
    "cmdline": _extra.X_CMDLINE, "exe": _extra.X_EXE | _extra.X_CMDLINE,
    "name": _extra.X_CMDLINE_LONG, "cwd": _extra.X_CWD, "environ": _extra.X_ENVIRON,
    "num_fds": _extra.X_FDS, "nice": _extra.X_NICE,
}
def _cpu_times(x: _extra.Extra) -> pcputimes:
    c = x.cpu
    t = _TICKS
    return pcputimes(c[0] / t, c[1] / t, c[2] / t, c[3] / t, c[4] / t)


class Process:
    """A process, as ``psutil.Process(pid)`` (the caller's own when pid is None).

    NoSuchProcess when no process holds pid (a thread id included, which
    psutil accepts: its pid_exists() says False for it). The object stands
    for that process, as (pid, start time) and, where pidfds live on pidfs,
    the pidfd's inode: once the pid names another process every method raises
    NoSuchProcess, and ``is_running()`` says False.
    """

    def __init__(self, pid: Optional[int] = None) -> None:
        pid = os.getpid() if pid is None else _check_pid(pid)
        if pid == 0 or pid > _ll.PID_MAX:
            raise NoSuchProcess(pid, None, f"no process has pid {pid}")
        start, handle, ino = _pin_new(pid)
        self._setup(pid, start, handle)
        self._ino = ino

    # Per-object state beyond identity starts as these class defaults, so that a
    # Process made from a table row (process_iter, children) costs four attributes.
    _name: Optional[str] = None
    _gone = False
    _cache: Optional[list[tuple[int, _extra.Extra, Proc]]] = None  # oneshot: reads so far
    _last_sys_cpu: Optional[float] = None
    _last_proc_cpu: Optional[pcputimes] = None
    _exitcode: Any = _UNSET
    _ino: Optional[int] = None  # the inode of /proc/<pid> while this process holds the pid

    def _setup(self, pid: int, start: Optional[int], handle: Optional[int]) -> None:
        self._pid = pid
        self._start = start
        self._handle = handle
        self._ident = (pid, None if start is None else start / _TICKS)

    @classmethod
    def _of_row(cls, row: Proc) -> Process:
        """The Process of a table row (no kernel call; identity by start time)."""
        p = cls.__new__(cls)
        p._setup(row.pid, row.start_time, None)
        return p

    # --- identity, equality ---------------------------------------------------------

    @property
    def pid(self) -> int:
        """The process's pid."""
        return self._pid

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Process):
            return NotImplemented
        return self._ident == other._ident

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self._ident)

    def __str__(self) -> str:
        info = [f"pid={self._pid}"]
        with self.oneshot():
            try:
                info.append(f"name={self.name()!r}")
                info.append(f"status={self.status()!r}")
            except ZombieProcess:
                info.append("status='zombie'")
            except NoSuchProcess:
                info.append("status='terminated'")
            except AccessDenied:
                pass
        if self._exitcode not in (_UNSET, None):
            info.append(f"exitcode={self._exitcode!r}")
        if self._start is not None:
            started = _ll.BOOT_EPOCH + self._start / _TICKS
            info.append("started=" + time.strftime("%H:%M:%S", time.localtime(started)))
        return f"proctable.compat.Process({', '.join(info)})"

    __repr__ = __str__

    # --- reads -------------------------------------------------------------------------

    def _gone_error(self, msg: Optional[str] = None) -> NoSuchProcess:
        return NoSuchProcess(self._pid, self._name, msg)

    def _denied_error(self) -> Exception:
        if _hidden(self._pid):
            return self._gone_error()
        return AccessDenied(self._pid, self._name)

    def _read(self, want: int) -> tuple[_extra.Extra, Proc]:
        """The files of want (X_*) and the stat line, read in one C call, the stat
        line last: the proof that they were of this process (NoSuchProcess where
        the pid names another one now). In oneshot, each file is read once."""
        cache = self._cache
        if cache is not None:
            for had, hx, hrow in cache:
                if want & ~had == 0:
                    return hx, hrow
        start = -1 if self._start is None else self._start
        proof = self._ino
        x, row = _extra.read_one(Proc, self._pid, start,
                                 want if proof is None else want | _extra.X_DIR)
        if x.err_stat:
            if x.err_stat == errno.EACCES:
                raise self._denied_error()
            raise OSError(x.err_stat, f"pid {self._pid}: stat: {os.strerror(x.err_stat)}")
        if x.flags & _extra.F_GONE:
            self._gone = self._start is not None
            raise self._gone_error()
        if proof is not None and x.dir_ino != proof and not self.still_ours():
            # The start time matched, but the pid went to another process within
            # the same clock tick (its /proc inode and pidfs handle are new).
            self._gone = True
            raise self._gone_error("the pid names another process now")
        if cache is not None:
            cache.append((want & ~_extra.X_CMDLINE_LONG, x, row))
        return x, row

    def _row(self) -> Proc:
        return self._read(0)[1]

    def _zombie_error(self, row: Optional[Proc] = None) -> ZombieProcess:
        return ZombieProcess(self._pid, self._name, None if row is None else row.ppid)

    def _file_error(self, err: int, what: str, x: _extra.Extra, row: Proc) -> Exception:
        """psutil's mapping of a failed /proc file read: a denial is AccessDenied;
        a file that is gone, ZombieProcess for a zombie, else NoSuchProcess."""
        if err == errno.EACCES:
            return self._denied_error()
        if err in (errno.ENOENT, errno.ESRCH):
            if x.flags & _extra.F_ZOMBIE:
                return self._zombie_error(row)
            return self._gone_error()
        return OSError(err, f"pid {self._pid}: {what}: {os.strerror(err)}")

    def _os_error(self, e: OSError) -> Exception:
        """psutil's mapping of an error of a read by pid (made in Python)."""
        if isinstance(e, PermissionError):
            return AccessDenied(self._pid, self._name)
        if isinstance(e, (ProcessLookupError, FileNotFoundError)):
            z = self._zombie_now()
            if z is not None:
                return z
            if isinstance(e, ProcessLookupError) or not os.path.exists(
                    f"/proc/{self._pid}/stat"):
                return self._gone_error()
        return e

    def _zombie_now(self) -> Optional[ZombieProcess]:
        """ZombieProcess where the stat line says state Z now (psutil's test)."""
        try:
            row = _ll.read_row(Proc, self._pid, 0)
        except (OSError, _errors.ProctableError):
            return None
        if row is None or row.state != "Z":
            return None
        return self._zombie_error(row)

    def still_ours(self) -> bool:
        """Does the pid still name this process? Then whatever was read by pid since
        this object was made was read of it (a process holds its pid from its
        start until it is reaped, and never gets it back).

        First the inode of /proc/<pid>: it stays while the process holds the pid,
        and a reused pid gets another. Where it changed (or was never known), the
        pidfs handle where the object has one (Process(pid) on Linux 6.9+: exact
        even for a pid reused within one clock tick), else the start time of the
        stat line. Where /proc denies that (hidepid) and no handle is known: True,
        unknown, as psutil, which never checks."""
        ino = _proc_ino(self._pid)
        if ino is not None and ino == self._ino:
            return True
        same = self._by_handle()
        if same is None:
            try:
                row = _ll.read_row(Proc, self._pid, 0)
            except _errors.AccessDenied:
                return ino is not None  # hidepid=1: it is there, whose it is is unknown
            if row is None:
                return False
            same = self._start is None or row.start_time == self._start
        if same and ino is not None:
            self._ino = ino  # looked up before the proof: this process's
        return same

    def _by_handle(self) -> Optional[bool]:
        """Is a pidfd of the pid now this object's (its pidfs inode)? None where the
        object has no handle, or pidfds cannot be had."""
        if self._handle is None or not _has_pidfs():
            return None
        try:
            fd = _open_pidfd(self._pid)
        except NoSuchProcess:
            return False
        if fd is None:
            return None
        try:
            return os.fstat(fd).st_ino == self._handle
        finally:
            os.close(fd)

    def _ours_fd(self, here: Optional[_Here] = None) -> Optional[int]:
        """A pidfd of this process (None without pidfds): NoSuchProcess where the pid
        names another process, or none. The caller closes it."""
        fd = _open_pidfd(self._pid, here)
        if fd is None:
            if not self.still_ours():
                raise self._gone_error("the pid names another process now")
            return None
        try:
            if self._handle is not None and _has_pidfs():
                ours = os.fstat(fd).st_ino == self._handle
            else:
                ours = self.still_ours()  # after the open: the pidfd was of this one
        except BaseException:
            os.close(fd)
            raise
        if not ours:
            os.close(fd)
            raise self._gone_error("the pid names another process now")
        return fd

    def _proven(self, read: Callable[[], T]) -> T:
        """read() (a /proc read or a call by pid, in Python), then the proof that
        the pid still names this process, so that what was read was of it."""
        try:
            value = read()
        except OSError as e:
            raise self._os_error(e) from None
        if not self.still_ours():
            raise self._gone_error("the pid names another process now")
        return value

    # --- the getters: each reads what it needs, then psutil's rule over it ----------------

    def ppid(self) -> int:
        """The parent's pid (0 for pid 1 and kthreadd)."""
        return self._read(0)[1].ppid

    def name(self) -> str:
        """The comm; one cut at 15 bytes is extended from argv[0] where that starts
        with it, as psutil does."""
        return self._v_name(*self._read(_extra.X_CMDLINE_LONG))

    def status(self) -> str:
        """psutil's status string (``running``, ``sleeping``, ``zombie``, ...)."""
        return STATUS.get(self._read(0)[1].state, "?")

    def create_time(self) -> float:
        """Seconds since the epoch (boot time + start ticks), as psutil computes it."""
        if self._start is None:
            return self._read(0)[1].create_time
        return _ll.BOOT_EPOCH + self._start / _TICKS

    def terminal(self) -> Optional[str]:
        """The controlling terminal's path, or None."""
        return _decode.terminal(self._read(0)[1].tty_nr)[0]

    def num_threads(self) -> int:
        """The number of threads."""
        return self._v_num_threads(*self._read(0))

    def cpu_times(self) -> pcputimes:
        """pcputimes(user, system, children_user, children_system, iowait), seconds."""
        return _cpu_times(self._read(0)[0])

    def memory_info(self) -> pmem:
        """pmem(rss, vms, shared, text, lib, data, dirty) in bytes (all of statm)."""
        return self._v_memory_info(*self._read(_extra.X_STATM))

    def memory_percent(self, memtype: str = "rss") -> float:
        """A memory_info() field as a percentage of the host's memory (MemTotal)."""
        if memtype in ("uss", "pss", "swap"):
            raise NotImplementedError(
                f"memory_percent({memtype!r}) needs memory_full_info(), which "
                "proctable.compat does not offer")
        if memtype not in pmem._fields:
            raise ValueError(f"memtype must be one of {(*pmem._fields, 'uss', 'pss', 'swap')},"
                             f" not {memtype!r}")
        value: int = getattr(self.memory_info(), memtype)
        return (value / float(_total_phymem())) * 100

    def uids(self) -> puids:
        """puids(real, effective, saved)."""
        return self._v_uids(*self._read(_extra.X_STATUS))

    def gids(self) -> pgids:
        """pgids(real, effective, saved)."""
        return self._v_gids(*self._read(_extra.X_STATUS))

    def username(self) -> str:
        """The name of the real uid's user (psutil's rule), or the uid as a string."""
        return _decode.username(self.uids().real)

    def cmdline(self) -> list[str]:
        """The command line (empty for a kernel thread; ZombieProcess for a zombie's)."""
        return self._v_cmdline(*self._read(_extra.X_CMDLINE))

    def exe(self) -> str:
        """The executable's path (the exe link; where it is denied, argv[0] if that
        is an absolute path to an executable; "" for a kernel thread)."""
        return self._v_exe(*self._read(_extra.X_EXE))

    def cwd(self) -> str:
        """The working directory ("" where the kernel has none to show)."""
        return self._v_cwd(*self._read(_extra.X_CWD))

    def environ(self) -> dict[str, str]:
        """The environment it started with (or set since in its own memory)."""
        return self._v_environ(*self._read(_extra.X_ENVIRON))

    def nice(self, value: Optional[int] = None) -> Optional[int]:
        """The nice value; with value, set it (the pid checked to be this process's
        just before)."""
        if value is None:
            try:
                return self._v_nice(*self._read(_extra.X_NICE))
            except AccessDenied:
                # hidepid denies the stat line, not getpriority() (psutil answers)
                return self._proven(lambda: os.getpriority(os.PRIO_PROCESS, self._pid))
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"a nice value is an int, not {type(value).__name__}")
        if not self.still_ours():
            raise self._gone_error("the pid names another process now")
        try:
            os.setpriority(os.PRIO_PROCESS, self._pid, value)
        except OSError as e:
            raise self._os_error(e) from None
        return None

    def num_fds(self) -> int:
        """The number of open file descriptors."""
        return self._v_num_fds(*self._read(_extra.X_FDS))

    def cpu_percent(self, interval: Optional[float] = None) -> float:
        """CPU use in percent of one CPU, as psutil computes it: over ``interval``
        seconds (blocking), or since the last call (0.0 the first time)."""
        if interval is not None and interval < 0:
            raise ValueError(f"interval must be >= 0, not {interval!r}")
        if interval is not None and interval > 0.0:
            self._since(_cpu_times(self._read(0)[0]))
            time.sleep(interval)
        return self._since(_cpu_times(self._read(0)[0]))

    def _since(self, now: pcputimes) -> float:
        """psutil's cpu_percent() arithmetic: the CPU time used since the last sample,
        over the wall time since, times the CPU count (0.0 without a last sample)."""
        cpus = _online_cpus()
        st2 = time.monotonic() * cpus
        st1, pt1 = self._last_sys_cpu, self._last_proc_cpu
        self._last_sys_cpu, self._last_proc_cpu = st2, now
        if st1 is None or pt1 is None:
            return 0.0
        elapsed = st2 - st1
        if elapsed == 0:
            return 0.0
        used = (now.user - pt1.user) + (now.system - pt1.system)
        return round(used / elapsed * 100 * cpus, 1)

    # --- psutil's rule for each value, over one read (the getters and as_dict) --------

    def _v_pid(self, x: _extra.Extra, row: Proc) -> int:
        return self._pid

    def _v_ppid(self, x: _extra.Extra, row: Proc) -> int:
        return row.ppid

    def _v_name(self, x: _extra.Extra, row: Proc) -> str:
        name = row.name
        if len(name) >= COMM_TRUNCATED:
            try:
                if x.flags & (_extra.F_HAVE_CMDLINE | _extra.F_TRUNCATED) or x.err_cmdline:
                    argv = self._v_cmdline(x, row)
                elif row.state == "Z" or x.task_flags & PF_KTHREAD:
                    argv = []  # C reads no command line of these: psutil's gives none
                else:
                    argv = self.cmdline()
            except (AccessDenied, ZombieProcess):
                argv = []
            if argv:
                extended = os.path.basename(argv[0])
                if extended.startswith(name):
                    name = extended
        self._name = name
        return name

    def _v_exe(self, x: _extra.Extra, row: Proc) -> str:
        err = x.err_exe
        if err == 0 and x.exe is not None:
            try:
                return _decode.link_path(x.exe)
            except Denied:
                raise AccessDenied(self._pid, self._name) from None
        if err in (errno.ENOENT, errno.ESRCH):
            if x.flags & _extra.F_ZOMBIE:
                raise self._zombie_error(row)
            try:
                return _decode.guess_exe(self.cmdline()) or ""
            except AccessDenied:
                return ""
        if err == errno.EACCES:
            guess = _decode.guess_exe(self.cmdline())
            if guess is None:
                raise AccessDenied(self._pid, self._name)
            return guess
        raise self._file_error(err, "exe", x, row)

    def _v_cmdline(self, x: _extra.Extra, row: Proc) -> list[str]:
        if x.flags & _extra.F_TRUNCATED:
            return self._long_cmdline()
        raw = x.cmdline
        if raw is None:
            raise self._file_error(x.err_cmdline, "cmdline", x, row)
        if not raw:
            if x.flags & _extra.F_ZOMBIE:
                raise self._zombie_error(row)
            return []
        return _decode.cmdline(raw)

    def _long_cmdline(self) -> list[str]:
        def read() -> bytes:
            with open(f"/proc/{self._pid}/cmdline", "rb") as f:
                return f.read()

        raw = self._proven(read)
        if not raw:
            z = self._zombie_now()
            if z is not None:
                raise z
            return []
        return _decode.cmdline(raw)

    def _v_status(self, x: _extra.Extra, row: Proc) -> str:
        return STATUS.get(row.state, "?")

    def _v_create_time(self, x: _extra.Extra, row: Proc) -> float:
        return row.create_time

    def _v_username(self, x: _extra.Extra, row: Proc) -> str:
        return _decode.username(self._v_uids(x, row).real)

    def _v_uids(self, x: _extra.Extra, row: Proc) -> puids:
        u = x.uids
        if u is None:
            raise self._file_error(x.err_status, "status", x, row)
        return puids(*u)

    def _v_gids(self, x: _extra.Extra, row: Proc) -> pgids:
        g = x.gids
        if g is None:
            raise self._file_error(x.err_status, "status", x, row)
        return pgids(*g)

    def _v_terminal(self, x: _extra.Extra, row: Proc) -> Optional[str]:
        return _decode.terminal(row.tty_nr)[0]

    def _v_cwd(self, x: _extra.Extra, row: Proc) -> str:
        raw = x.cwd
        if raw is not None:
            try:
                return _decode.link_path(raw)
            except Denied:
                raise AccessDenied(self._pid, self._name) from None
        err = x.err_cwd
        if err in (errno.ENOENT, errno.ESRCH):
            # psutil: no cwd to show is "", or ZombieProcess for a zombie
            if x.flags & _extra.F_ZOMBIE:
                raise self._zombie_error(row)
            return ""
        raise self._file_error(err, "cwd", x, row)

    def _v_environ(self, x: _extra.Extra, row: Proc) -> dict[str, str]:
        if x.flags & _extra.F_ENV_TRUNCATED:
            def read() -> bytes:
                with open(f"/proc/{self._pid}/environ", "rb") as f:
                    return f.read()

            return _decode.environ(self._proven(read))
        raw = x.environ
        if raw is None:
            raise self._file_error(x.err_environ, "environ", x, row)
        return _decode.environ(raw)

    def _v_nice(self, x: _extra.Extra, row: Proc) -> int:
        if x.err_nice:
            if x.err_nice in (errno.EACCES, errno.EPERM):
                raise AccessDenied(self._pid, self._name)
            raise self._file_error(x.err_nice, "getpriority", x, row)
        return x.nice

    def _v_num_threads(self, x: _extra.Extra, row: Proc) -> int:
        n = row.num_threads
        return 0 if n is None else n

    def _v_num_fds(self, x: _extra.Extra, row: Proc) -> int:
        if x.err_fds:
            raise self._file_error(x.err_fds, "fd", x, row)
        return x.nfds

    def _v_memory_info(self, x: _extra.Extra, row: Proc) -> pmem:
        m = x.statm
        if m is None:
            raise self._file_error(x.err_statm, "statm", x, row)
        p = _PAGE
        return pmem(m[1] * p, m[0] * p, m[2] * p, m[3] * p, m[4] * p, m[5] * p, m[6] * p)

    def _v_memory_percent(self, x: _extra.Extra, row: Proc) -> float:
        return self._v_memory_info(x, row).rss / float(_total_phymem()) * 100

    def _v_cpu_times(self, x: _extra.Extra, row: Proc) -> pcputimes:
        return _cpu_times(x)

    def _v_cpu_percent(self, x: _extra.Extra, row: Proc) -> float:
        return self._since(_cpu_times(x))

    # --- family --------------------------------------------------------------------------

    def parent(self) -> Optional[Process]:
        """The parent as a Process (started before this one), or None."""
        if self._pid == _lowest_pid():
            return None
        row = self._row()
        if row.ppid == 0:
            return None
        try:
            parent = Process(row.ppid)
        except NoSuchProcess:
            return None
        if parent._start is None:
            parent._row()  # denied: AccessDenied, as psutil's create_time() there
        assert parent._start is not None
        return parent if parent._start <= row.start_time else None

    def parents(self) -> list[Process]:
        """The parent, its parent, ... up to the first process."""
        out = []
        p = self.parent()
        while p is not None:
            out.append(p)
            p = p.parent()
        return out

    def children(self, recursive: bool = False) -> list[Process]:
        """The children (and, recursive, every descendant), in psutil's order.

        Through the BPF reader where it runs: one read of the table. Else the
        children files of the tree's processes (``/proc/<pid>/task/<tid>/children``),
        each child checked by its stat line (its parent, and a start after it):
        a cost in proportion to the tree, not to the host. AccessDenied where
        /proc lists a process this caller may not read (hidepid=1), as psutil:
        the table is read then, to say so."""
        road = _children_road
        if road == "auto":
            road = "table" if _ll.reader()[0] == "bpf" or _lists_denied() else "walk"
        if road == "walk":
            found = self._walk(recursive)
            if found is not None:
                return found
        return self._from_table(recursive, "proc" if road == "table-proc" else "auto")

    def _from_table(self, recursive: bool, reader: str = "auto") -> list[Process]:
        table = snapshot(memory=False, reader=reader)
        if table.denied:
            raise AccessDenied(table.denied[0].pid)
        me = table.get(self._pid)
        if me is None or (self._start is not None and me.start_time != self._start):
            raise self._gone_error()
        if not recursive:
            return [Process._of_row(r) for r in table.children(self._pid)]
        out: list[Process] = []
        seen: set[int] = set()
        stack = [self._pid]
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            for r in table.children(pid):
                out.append(Process._of_row(r))
                stack.append(r.pid)
        return out

    def _walk(self, recursive: bool) -> Optional[list[Process]]:
        """children() through the children files; None where the kernel has none."""
        try:
            me = _ll.read_row(Proc, self._pid, 0)
        except _errors.AccessDenied:
            raise self._denied_error() from None
        if me is None or (self._start is not None and me.start_time != self._start):
            raise self._gone_error()
        out: list[Process] = []
        seen: set[int] = set()
        stack = [(self._pid, me.start_time)]
        while stack:
            pid, start = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            kids = _children_files(pid)
            if kids is None:
                return None
            for c in sorted(set(kids)):
                try:
                    r = _ll.read_row(Proc, c, 0)
                except _errors.AccessDenied:
                    continue  # hidden from us (hidepid=2): psutil's table has no row for it
                if r is None or r.ppid != pid or r.start_time < start:
                    continue  # gone meanwhile, or its pid is another process's now
                out.append(Process._of_row(r))
                if recursive:
                    stack.append((r.pid, r.start_time))
        return out

    # --- signals and waits ---------------------------------------------------------------

    def is_running(self) -> bool:
        """True while the pid still names this process (a zombie included, as in
        psutil); False once it is gone or another process holds the pid."""
        if self._gone:
            return False
        running = self.still_ours()
        if not running:
            self._gone = True
        return running

    def send_signal(self, sig: int) -> None:
        """Send sig to this process, through a pidfd proven to be of it: never to
        another process that took the pid. NoSuchProcess once it is gone."""
        fd = self._ours_fd()
        try:
            if fd is not None and _pidfd_signals():
                try:
                    signal.pidfd_send_signal(fd, sig)
                except ProcessLookupError:
                    self._gone = True
                    raise self._gone_error() from None
                except PermissionError:
                    raise AccessDenied(self._pid, self._name) from None
                return
            try:
                sent = _pidfd.signal_pinned(self._pid, self._start, fd, sig)
            except PermissionError:
                raise AccessDenied(self._pid, self._name) from None
            if not sent:
                self._gone = True
                raise self._gone_error()
        finally:
            if fd is not None:
                os.close(fd)

    def suspend(self) -> None:
        """SIGSTOP."""
        self.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        self.send_signal(signal.SIGCONT)

    def terminate(self) -> None:
        """SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Wait for the process to end; its exit code (a negated Negsignal for a
        signal death), reaping it where it is our child.

        A process that is not our child: its exit code too once it is a zombie
        (psutil: None, after its parent reaped it); None where the kernel hides
        the status from this caller, or once it is gone. TimeoutExpired when
        it still runs after timeout seconds (0: do not wait)."""
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(f"timeout must be an int or float, not {type(timeout)}")
            if timeout < 0:
                raise ValueError(f"timeout must be >= 0, not {timeout}")
        if self._exitcode is not _UNSET:
            return self._exitcode  # type: ignore[no-any-return]
        code = self._wait(timeout)
        self._exitcode = code
        return code

    def _wait(self, timeout: Optional[float]) -> Optional[int]:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            fd = self._ours_fd()
        except NoSuchProcess:
            return None
        if fd is None:
            return self._wait_polling(deadline, timeout)
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if readable([fd], left):
                    break
                if deadline is None or time.monotonic() >= deadline:
                    raise TimeoutExpired(timeout if timeout is not None else 0.0,
                                         self._pid, self._name)
            return self._collect(fd)
        finally:
            os.close(fd)

    def _collect(self, fd: int, here: Optional[_Here] = None) -> Optional[int]:
        """The exit code of this ended process (its pidfd is readable): our own child
        is reaped (as psutil's wait() does); another's is read, never reaped."""
        try:
            raw = self._reap(fd, here or _here())
        except ChildProcessError:
            raw = None  # not our child, or reaped by someone else meanwhile
        if raw is not None:
            return _exit_code(raw)
        try:
            probe = exit_probe(self._pid, self._start)
        except _errors.AccessDenied:
            return None  # hidepid: its status is hidden from us
        if probe.state is ProbeState.EXITED and probe.status is not None:
            return _status_code(probe.status.code, probe.status.signal)
        if probe.state in (ProbeState.GONE, ProbeState.REUSED):
            return _from_pidfd_info(fd)  # reaped already: pidfs may keep its status
        return None  # a zombie whose status the kernel hides from us (MASKED)

    def _reap(self, fd: int, here: _Here) -> Optional[int]:
        """Reap this process if it is our exited child: its wait status (None if it
        has not exited). ChildProcessError where it is not our child. Through its
        pidfd, or where a filter denies waitid(P_PIDFD), by pid once the pid is
        proven to be still this process's (an unreaped child keeps its pid)."""
        if here.waitid:
            res = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
        else:
            if not self.still_ours():
                raise ChildProcessError(errno.ECHILD, "reaped already")
            res = os.waitid(os.P_PID, self._pid, os.WEXITED | os.WNOHANG)
        return None if res is None else _pidfd._raw_from_waitid(res)

    def _wait_polling(self, deadline: Optional[float], timeout: Optional[float]) -> Optional[int]:
        """wait() without pidfds: look at the pid, with growing naps."""
        nap = 0.0001
        while True:
            probe = exit_probe(self._pid, self._start)
            if probe.state in (ProbeState.GONE, ProbeState.REUSED):
                return None
            if probe.state in (ProbeState.EXITED, ProbeState.MASKED):
                try:
                    res = os.waitid(os.P_PID, self._pid, os.WEXITED | os.WNOHANG)
                except ChildProcessError:
                    res = None
                if res is not None:
                    return _exit_code(_pidfd._raw_from_waitid(res) or 0)
                if probe.status is not None:
                    return _status_code(probe.status.code, probe.status.signal)
                return None
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutExpired(timeout if timeout is not None else 0.0,
                                     self._pid, self._name)
            left = None if deadline is None else deadline - time.monotonic()
            time.sleep(nap if left is None else max(0.0, min(nap, left)))
            nap = min(nap * 2, 0.04)

    # --- psutil's helpers ---------------------------------------------------------------

    @contextlib.contextmanager
    def oneshot(self) -> Iterator[None]:
        """Read each file once for the calls in the block."""
        with self._the_lock():
            if self._cache is not None:
                yield
                return
            self._cache = []
            try:
                yield
            finally:
                self._cache = None

    def as_dict(self, attrs: Optional[Iterable[str]] = None,
                ad_value: Any = None) -> dict[str, Any]:
        """The attributes as a dict (all of AS_DICT_ATTRS without attrs), read in one
        C call; a value psutil refuses with AccessDenied or ZombieProcess is
        ad_value. A name psutil offers and this does not raises ValueError
        (naming those offered)."""
        names: Sequence[str] = AS_DICT_ATTRS
        given = False
        if attrs is not None:
            if not isinstance(attrs, (list, tuple, set, frozenset)):
                raise TypeError(f"invalid attrs type {type(attrs)}")
            if attrs:
                names = list(dict.fromkeys(attrs))
                given = True
                bad = [a for a in names if a not in _VALUES]
                if bad:
                    raise ValueError("as_dict() does not offer " + ", ".join(map(repr, bad))
                                     + "; it offers: " + ", ".join(AS_DICT_ATTRS))
        want = _WANT_ALL
        if given:
            want = 0
            for n in names:
                want |= _X_NEEDS.get(n, 0)
        out: dict[str, Any] = {}
        with self._the_lock():  # oneshot(), without its generator's cost
            mine = self._cache is None
            if mine:
                self._cache = []
            try:
                x: Optional[_extra.Extra]
                row: Optional[Proc]
                try:
                    x, row = self._read(want)
                except AccessDenied:
                    x = row = None  # each value says what psutil says of it, one by one
                values = _VALUES
                for name in names:
                    try:
                        if x is None or row is None:
                            out[name] = self._pid if name == "pid" else getattr(self, name)()
                        else:
                            out[name] = values[name](self, x, row)
                    except (AccessDenied, ZombieProcess):
                        out[name] = ad_value
            finally:
                if mine:
                    self._cache = None
        return out

    def _the_lock(self) -> threading.RLock:
        lock: Optional[threading.RLock] = self.__dict__.get("_lock")
        if lock is None:
            lock = self.__dict__.setdefault("_lock", threading.RLock())
        return lock


AS_DICT_ATTRS: tuple[str, ...] = (
    "pid", "ppid", "name", "exe", "cmdline", "status", "create_time", "username",
    "uids", "gids", "terminal", "cwd", "environ", "nice", "num_threads", "num_fds",
    "memory_info", "memory_percent", "cpu_times", "cpu_percent",
)
"""The names ``Process.as_dict()`` (and ``process_iter(attrs)``) offer."""

_VALUES: dict[str, Callable[[Process, _extra.Extra, Proc], Any]] = {
    name: getattr(Process, "_v_" + name) for name in AS_DICT_ATTRS}
_WANT_ALL = 0
for _n in AS_DICT_ATTRS:
    _WANT_ALL |= _X_NEEDS.get(_n, 0)
_WANT_ALL &= ~_extra.X_CMDLINE_LONG  # (X_CMDLINE reads it whole)
del _n


def _status_code(code: Optional[int], sig: Optional[int]) -> Optional[int]:
    if code is not None:
        return code
    if sig is not None:
        return _negsig(-sig)
    return None


def _from_pidfd_info(fd: int) -> Optional[int]:
    try:
        raw = _pidfd.exit_info(fd)
    except OSError:
        return None
    return None if raw is None else _exit_code(raw)


# --- module level ------------------------------------------------------------------------


def pids() -> list[int]:
    """The pids /proc lists to this caller, sorted."""
    global _lowest
    out = _extra.list_pids()
    if out:
        _lowest = out[0]
    return out


def pid_exists(pid: int) -> bool:
    """Is there a process with this pid that /proc shows to this caller? (A thread
    id is no process; a pid that hidepid=2 hides reads as none, as in psutil.)"""
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise TypeError(f"a pid is an int, not {type(pid).__name__}")
    if pid < 0 or pid > _ll.PID_MAX:
        return False
    if pid == 0:
        return 0 in pids()
    if _pidfd.DISABLE_ENV not in os.environ or _pidfds():
        got = _extra.pid_exists(pid)
        if got is not None:
            return got
    # no pidfds here: kill(pid, 0), then the status file's Tgid
    return _leader_exists_slow(pid) and os.path.lexists(f"/proc/{pid}")


def _leader_exists_slow(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1]) == pid
    except (OSError, ValueError):
        pass
    return pid in pids()


def wait_procs(procs: Iterable[Any], timeout: Optional[float] = None,
               callback: Optional[Callable[[Any], object]] = None
               ) -> tuple[list[Any], list[Any]]:
    """Wait until every process ended or timeout passed: (gone, alive).

    Each gone one gets ``returncode`` (its wait() value: the exit code, also of a
    zombie that is not our child, or None). ``callback(proc)`` is called for
    each as it goes. Processes of this module are polled all at once on their
    pidfds; any other object with psutil's ``wait()`` and ``is_running()`` is
    waited for in turn, as psutil does.
    """
    if timeout is not None and not timeout >= 0:
        raise ValueError(f"timeout must be >= 0, not {timeout}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback {callback!r} is not callable")
    deadline = None if timeout is None else time.monotonic() + timeout
    alive = list(dict.fromkeys(procs))
    gone: list[Any] = []

    def went(p: Any, code: Optional[int]) -> None:
        p.returncode = code
        gone.append(p)
        if callback is not None:
            callback(p)

    fds: dict[int, Process] = {}
    others: list[Any] = []
    here = _here()
    try:
        for p in alive:
            if not isinstance(p, Process) or p._exitcode is not _UNSET:
                others.append(p)
                continue
            try:
                fd = p._ours_fd(here)
            except NoSuchProcess:
                p._exitcode = None
                went(p, None)
                continue
            if fd is None:
                others.append(p)
                continue
            fds[fd] = p
        while fds:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = readable(list(fds), left)
            if not ready:
                break
            for fd in ready:
                p = fds.pop(fd)
                try:
                    code = p._collect(fd, here)
                finally:
                    os.close(fd)
                p._exitcode = code
                went(p, code)
    finally:
        for fd in fds:
            os.close(fd)
    # The rest, psutil's way: each in turn, within what is left of the timeout.
    for p in others:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            code = p.wait(timeout=left)
        except TimeoutExpired:
            continue
        except Exception as e:
            if type(e).__name__ != "TimeoutExpired":
                raise
            continue
        if code is not None or not p.is_running():
            went(p, code)
    done = {id(p) for p in gone}
    return gone, [p for p in alive if id(p) not in done]
