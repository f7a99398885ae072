"""The Linux pidfd calls the exit watcher and terminate() rest on, in plain Python.

Each function is one kernel call, turned into a Python value: open a pidfd,
signal through it, peek at a child's exit status without reaping it
(``waitid(WNOWAIT)``), read a reaped process's exit status
(``ioctl(PIDFD_GET_INFO)`` with ``PIDFD_INFO_EXIT``, Linux 6.15+).

What the kernel offers is detected at run time. ``PROCTABLE_DISABLE`` (a comma
separated list of ``pidfd``, ``pidfd_info``, ``waitid``, ``zombie``) turns sources
off, so that tests and users can force the fallbacks on a kernel that has them all;
``proc_connector`` and ``cgroup`` turn off those lineage backends the same way,
``proc_children`` makes a lineage act as on a kernel without ``CONFIG_PROC_CHILDREN``,
and ``bpf`` turns off the table's BPF reader (read by the C core once per process).
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import struct
from typing import NamedTuple, Optional

from . import _ended, _rows
from . import _lowlevel as _ll
from .errors import OutOfFds

__all__ = [
    "BACKENDS",
    "DISABLE_ENV",
    "SOURCES",
    "Features",
    "exit_info",
    "features",
    "open_pidfd",
    "peek_child",
    "reap_child",
    "send_signal",
    "signal_pinned",
    "still_there",
]

DISABLE_ENV = "PROCTABLE_DISABLE"
SOURCES = frozenset({"pidfd", "pidfd_info", "waitid", "zombie"})
# Lineage backends the same switch turns off (read by proctable.lineage); proc_children
# pretends the kernel has no /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN off).
BACKENDS = frozenset({"proc_connector", "cgroup", "proc_children"})
# The table's BPF reader: read by the C core itself, once per process.
READERS = frozenset({"bpf"})

# struct pidfd_info (include/uapi/linux/pidfs.h), first published size 64:
# u64 mask, u64 cgroupid, u32 pid, tgid, ppid, ruid, rgid, euid, egid, suid,
# sgid, fsuid, fsgid, s32 exit_code (a wait status), u32 coredump_mask, u32 spare.
_INFO_SIZE = 64
_INFO_MASK = struct.Struct("=Q")
_INFO_EXIT_CODE = struct.Struct("=i")
_INFO_EXIT_CODE_OFFSET = 60
PIDFD_INFO_EXIT = 1 << 3
# _IOWR(PIDFS_IOCTL_MAGIC 0xFF, 11, struct pidfd_info): dir 3 (read|write), size, type, nr.
PIDFD_GET_INFO = (3 << 30) | (_INFO_SIZE << 16) | (0xFF << 8) | 11

# waitid si_code values for an exit (from <signal.h>); os has them on Linux.
_CLD_EXITED = getattr(os, "CLD_EXITED", 1)
_CLD_KILLED = getattr(os, "CLD_KILLED", 2)
_CLD_DUMPED = getattr(os, "CLD_DUMPED", 3)

_P_PIDFD: Optional[int] = getattr(os, "P_PIDFD", None)


class Features(NamedTuple):
    """Which exit sources this process may use (kernel support minus PROCTABLE_DISABLE).

    Each is checked on this process's own pid, once: a sandbox or a container
    runtime's seccomp profile may deny one call of a family and allow the rest
    (EPERM or ENOSYS), and each missing call has its own fallback.
    """

    pidfd: bool
    """pidfd_open works: a pidfd pins a process and polls readable at its exit."""
    pidfd_info: bool
    """ioctl(PIDFD_GET_INFO); whether it carries PIDFD_INFO_EXIT shows once a process is reaped."""
    waitid: bool
    """waitid(WEXITED | WNOWAIT) on the caller's own children."""
    zombie: bool
    """The zombie's status in field 52 of /proc/<pid>/stat."""
    pidfd_signal: bool = False
    """pidfd_send_signal works (else: kill() by pid, right after an identity check)."""
    waitid_pidfd: bool = False
    """waitid(P_PIDFD) works (else: waitid(P_PID), safe for an unreaped child of ours)."""


class _Kernel(NamedTuple):
    pidfd: bool
    signal: bool
    waitid_pidfd: bool
    info: bool


_kernel: Optional[_Kernel] = None


def _works(call: object, *expected: int) -> bool:
    """Run call(); True if it succeeds or fails only with an expected errno."""
    try:
        call()  # type: ignore[operator]
    except OSError as e:
        return e.errno in expected
    return True


def _probe_kernel() -> _Kernel:
    """What the kernel (and whatever filters it) lets this process do, checked once on
    its own pid: every call of the pidfd family on its own. A denial is any error
    but the answer the call gives when it works (EPERM and ENOSYS from a seccomp
    profile, EINVAL or ENOTTY from an older kernel)."""
    global _kernel
    if _kernel is None:
        pidfd = sig = wpidfd = info = False
        if hasattr(os, "pidfd_open"):
            try:
                fd = os.pidfd_open(os.getpid())
            except OSError:
                fd = -1
            if fd >= 0:
                pidfd = True
                try:
                    sig = hasattr(signal, "pidfd_send_signal") and _works(
                        lambda: signal.pidfd_send_signal(fd, 0))
                    # We are not our own child: a working call says ECHILD.
                    wpidfd = _P_PIDFD is not None and _works(
                        lambda: os.waitid(_P_PIDFD, fd, os.WEXITED | os.WNOHANG),
                        errno.ECHILD)
                    try:
                        info = _get_info(fd) is not None
                    except OSError:
                        info = False
                finally:
                    os.close(fd)
        _kernel = _Kernel(pidfd, sig, wpidfd, info)
    return _kernel


def disabled() -> frozenset[str]:
    """The sources and backends PROCTABLE_DISABLE turns off (any case; unknown words
    are ignored)."""
    words = os.environ.get(DISABLE_ENV, "")
    return (frozenset(w.strip().lower() for w in words.split(",") if w.strip())
            & (SOURCES | BACKENDS | READERS))


def features() -> Features:
    """The sources in use now: what the kernel has, minus what PROCTABLE_DISABLE says."""
    off = disabled()
    k = _probe_kernel()
    pidfd = k.pidfd and "pidfd" not in off
    return Features(
        pidfd=pidfd,
        pidfd_info=pidfd and k.info and "pidfd_info" not in off,
        waitid=hasattr(os, "waitid") and "waitid" not in off,
        zombie="zombie" not in off,
        pidfd_signal=pidfd and k.signal,
        waitid_pidfd=pidfd and k.waitid_pidfd,
    )


def open_pidfd(pid: int) -> int:
    """A new pidfd for pid (close-on-exec). ProcessLookupError when no process holds pid.

    A thread id that is not a thread-group leader names no process: the kernel
    says ENOENT (EINVAL before Linux 6.9), and that is ProcessLookupError too.
    """
    try:
        return os.pidfd_open(pid)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.EINVAL):
            raise ProcessLookupError(errno.ESRCH, f"pid {pid} is not a process "
                                     "(a thread id, or gone)") from None
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise OutOfFds(e.errno, f"opening a pidfd for pid {pid}") from None
        raise


def send_signal(fd: int, sig: int) -> bool:
    """Send sig through the pidfd: True if sent, False once the process is reaped.

    A zombie accepts (and ignores) signals, so True does not mean it runs.
    PermissionError propagates. Only where ``features().pidfd_signal``.
    """
    try:
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        return False
    return True


def _row_start(pid: int) -> Optional[int]:
    """The start time of the process that holds pid now, or None."""
    row = _ll.read_row(_rows.Row, pid, 0)
    return None if row is None else row.start_time


def signal_pinned(pid: int, start_time: Optional[int], fd: Optional[int], sig: int) -> bool:
    """Send sig to the process pinned as (pid, start_time) and, where there is one, fd.

    Through the pidfd where pidfd_send_signal works (a reused pid cannot be hit).
    Else by pid, right after checking that the pid still names that process: its
    start time, and (with a pidfd) that the pidfd's process has not exited, so a
    live process still holds the pid. True if sent; False when the process is
    gone or reaped (a zombie takes, and ignores, signals). PermissionError when
    the kernel refuses to let this process signal it.
    """
    if fd is not None and features().pidfd_signal:
        return send_signal(fd, sig)
    now = _row_start(pid)
    if now is None or (start_time is not None and now != start_time):
        return False
    if fd is not None and _ended.pidfd_ended(fd):
        # Ended: a zombie of ours ignores signals anyway, and once reaped its pid
        # may already name another process. Never signal by pid then.
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def still_there(fd: int, pid: Optional[int] = None, start_time: Optional[int] = None) -> bool:
    """The pidfd's process has not been reaped (it may be a zombie).

    Without pidfd_send_signal: its pid still shows its start time (pid and
    start_time are needed then; a reaped process's pid reused within the same
    clock tick is the case that cannot be told apart, as without pidfds)."""
    if features().pidfd_signal:
        try:
            return send_signal(fd, 0)
        except PermissionError:
            return True  # the kernel found it, it only refuses to let us signal it
    if pid is None:
        return True  # cannot tell: unknown is not gone
    now = _row_start(pid)
    return now is not None and (start_time is None or now == start_time)


def _raw_from_waitid(res: os.waitid_result) -> Optional[int]:
    # Rebuild the waitpid status word from the siginfo parts.
    if res.si_code == _CLD_EXITED:
        return (res.si_status & 0xFF) << 8
    if res.si_code == _CLD_KILLED:
        return res.si_status & 0x7F
    if res.si_code == _CLD_DUMPED:
        return (res.si_status & 0x7F) | 0x80
    return None


def _waitid(pid: int, fd: Optional[int], options: int) -> Optional[os.waitid_result]:
    # P_PID is safe for our own unreaped child: its pid cannot be reused before we
    # reap it. Where a sandbox denies P_PIDFD, that is the whole difference.
    if fd is not None and _P_PIDFD is not None and features().waitid_pidfd:
        return os.waitid(_P_PIDFD, fd, options)
    return os.waitid(os.P_PID, pid, options)


def peek_child(pid: int, fd: Optional[int]) -> Optional[int]:
    """The wait status of our own exited child, read without reaping it; None if it runs.

    Uses the pidfd where there is one (so a reused pid cannot answer), else the pid.
    ChildProcessError when it is not our child, or was reaped already.
    """
    res = _waitid(pid, fd, os.WEXITED | os.WNOWAIT | os.WNOHANG)
    if res is None:
        return None
    return _raw_from_waitid(res)


def reap_child(pid: int, fd: Optional[int]) -> None:
    """Reap our own exited child (only where the caller asked for it). Never blocks."""
    try:
        _waitid(pid, fd, os.WEXITED | os.WNOHANG)
    except ChildProcessError:
        pass


def _get_info(fd: int) -> Optional[bytearray]:
    buf = bytearray(_INFO_SIZE)
    _INFO_MASK.pack_into(buf, 0, PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(fd, PIDFD_GET_INFO, buf, True)
    except OSError as e:
        if e.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM,
                       errno.ENOSYS, errno.EACCES):
            return None  # no PIDFD_GET_INFO on this kernel, or a filter denies it
        raise
    return buf


def exit_info(fd: int) -> Optional[int]:
    """The wait status pidfs kept for a reaped process (PIDFD_INFO_EXIT); None if none.

    None while the process runs or is an unreaped zombie (the kernel records the
    status when it is reaped), and on kernels without the ioctl or the flag.
    """
    try:
        buf = _get_info(fd)
    except ProcessLookupError:
        return None  # reaped, and this kernel keeps no exit info
    if buf is None:
        return None
    (mask,) = _INFO_MASK.unpack_from(buf, 0)
    if not mask & PIDFD_INFO_EXIT:
        return None
    (code,) = _INFO_EXIT_CODE.unpack_from(buf, _INFO_EXIT_CODE_OFFSET)
    return int(code) & 0xFFFF
