"""The lineage's native helper: ``proctable-lineage``, an executable in this package.

Built from csrc/pt_lineage.c with the package (see that file for what it does). It
is an executable, not code of the extension run after ``fork()``: a fork of this
interpreter would carry (and show, in every ``ps`` RSS column) the whole
interpreter beside each command, and only async-signal-safe code may run in the
fork of a threaded process. A small static executable costs one exec (about half a
millisecond) and a few hundred KiB per process; ``ps`` shows ``pt-mirror`` and
``pt-reaper`` (their comm) running ``proctable-lineage``.

This module builds its argument lists and reads its status line; the backends
(:mod:`.subreaper`, :mod:`.cgroup`, :mod:`.scan`) decide when to run it.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import time
from collections.abc import Iterable
from typing import Any, Optional

from .._fdwait import readable
from ..errors import OutOfFds, ProctableError

__all__ = ["HELPER", "command_of", "exec_outcome", "helper_path", "prepare", "raise_error",
           "read_status", "read_status_passing", "signal_numbers"]

HELPER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "proctable-lineage")
"""Where the helper lives: beside the package's compiled modules."""


def _keep_open() -> Optional[int]:
    try:
        return os.open(HELPER, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


# Opened at import: a supervisor that later drops privileges (a forked child that
# becomes uid 65534) may no longer reach the package's directory (a venv in a 0700
# directory), but may still run the helper through this fd (/proc/self/fd/N).
_HELPER_FD = _keep_open()


def helper_path() -> str:
    """The helper's path; ProctableError (with what to do) where it cannot run."""
    if not os.access(HELPER, os.X_OK):
        why = "missing" if not os.path.exists(HELPER) else "not executable here"
        raise ProctableError(
            f"proctable's lineage helper {HELPER} is {why}: reinstall proctable "
            "(pip install --force-reinstall proctable), or on a noexec mount install it "
            "elsewhere")
    return HELPER


def _helper_argv0(kw: dict[str, Any]) -> list[str]:
    """How to run the helper: by path, or through the fd kept since import (passed to
    the child, which closes it first thing: never the command's)."""
    fd = _HELPER_FD
    if os.access(HELPER, os.X_OK) or fd is None:
        return [helper_path()]
    try:
        os.fstat(fd)
    except OSError:  # closed since (a daemon closing every fd): by path, or the error
        return [helper_path()]
    kw["pass_fds"] = (*tuple(kw.get("pass_fds", ())), fd)
    return [f"/proc/self/fd/{fd}"]


def signal_numbers(signals: Iterable[Any], name: str = "ignore_signals") -> list[int]:
    """Signal numbers from ints or ``signal.Signals``; TypeError/ValueError otherwise."""
    if isinstance(signals, (str, bytes)) or not isinstance(signals, Iterable):
        raise TypeError(f"{name} must be a sequence of signals, not {type(signals).__name__}")
    out = []
    for s in signals:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"{name}: {s!r} is not a signal number")
        if s in (signal.SIGKILL, signal.SIGSTOP) or not 0 < s < signal.NSIG:
            raise ValueError(f"{name}: {s!r} cannot be ignored")
        out.append(int(s))
    return out


def _uid(user: Any) -> int:
    if isinstance(user, int) and not isinstance(user, bool):
        return user
    if isinstance(user, str):
        import pwd  # noqa: PLC0415 - only for user=

        return pwd.getpwnam(user).pw_uid
    raise TypeError(f"user must be an int or a str, not {type(user).__name__}")


def _gid(group: Any) -> int:
    if isinstance(group, int) and not isinstance(group, bool):
        return group
    if isinstance(group, str):
        import grp  # noqa: PLC0415 - only for group= and extra_groups=

        return grp.getgrnam(group).gr_gid
    raise TypeError(f"a group must be an int or a str, not {type(group).__name__}")


def prepare(job: str, args: list[Any], kw: dict[str, Any], status_w: int, *,
            terminal: Optional[int], ignore: list[int],
            extra: tuple[str, ...] = ()) -> list[str]:
    """The helper's argv for ``job`` (``reap`` or ``exec``) and args; moves what the
    helper does for the command itself out of the Popen keywords ``kw``: the
    executable, a new session, the terminal, and the credentials and umask (which
    the helper must not take on: as the caller it makes the lineage's cgroup and
    may signal every member)."""
    first = _helper_argv0(kw)
    argv = [*first, job, "--caller", str(os.getpid()), "--status-fd", str(status_w), *extra]
    if first[0].startswith("/proc/self/fd/"):
        argv += ["--close-fd", first[0].rsplit("/", 1)[1]]
    exe = kw.pop("executable", None)
    if exe is not None:
        argv += ["--exe", os.fsdecode(exe)]
    if kw.pop("start_new_session", False):
        argv.append("--setsid")  # the command leads it, as with subprocess
    user, group = kw.pop("user", None), kw.pop("group", None)
    groups, mask = kw.pop("extra_groups", None), kw.pop("umask", -1)
    if user is not None:
        argv += ["--uid", str(_uid(user))]
    if group is not None:
        argv += ["--gid", str(_gid(group))]
    if groups is not None:
        argv += ["--groups", ",".join(str(_gid(g)) for g in groups)]
    if not isinstance(mask, int) or isinstance(mask, bool):
        raise TypeError(f"umask must be an int, not {type(mask).__name__}")
    if mask >= 0:
        argv += ["--umask", str(mask)]
    if terminal is not None:
        for name in ("stdin", "stdout", "stderr"):
            if kw.get(name) is not None:
                raise ValueError(f"terminal= gives the command its {name}: do not pass {name}=")
            kw[name] = terminal
        argv.append("--terminal")
    if ignore:
        argv += ["--ignore", ",".join(str(s) for s in ignore)]
    kw["pass_fds"] = (*tuple(kw.get("pass_fds", ())), status_w)
    argv.append("--")
    argv += [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else a for a in args]
    return argv


def command_of(argv: list[Any]) -> str:
    """The command a helper argv made by :func:`prepare` runs: its ``--exe``, else the
    first word after ``--`` (what subprocess names in an exec error)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    head = argv[:cut]
    if "--exe" in head:
        return str(head[head.index("--exe") + 1])
    return os.fsdecode(argv[cut + 1]) if cut + 1 < len(argv) else str(argv[0])


def read_status(fd: int, timeout: float, until_eof: bool = False) -> list[bytes]:
    """The helper's status line, split in words ([] when it closed the fd with no
    word: an exec that succeeded). Bounded: TimeoutError past ``timeout``."""
    deadline = time.monotonic() + timeout
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the lineage's helper did not answer in time")
        if not readable([fd], left):
            continue
        data = os.read(fd, 4096)
        if not data:
            break
        buf += data
    return buf.split(b"\n", 1)[0].split()


def read_status_passing(sock: socket.socket, timeout: float) -> tuple[list[bytes], Optional[int]]:
    """The helper's status line from a Unix socket, split in words, and the fd it
    passed along with it (``reap``'s pipe on which the command tells its exec), or
    None. Bounded: TimeoutError past ``timeout``; OutOfFds where the fd could not be
    taken in (no fd left here: the exec's outcome cannot be learnt)."""
    passed: list[int] = []
    try:
        buf, truncated = _recv_line(sock, time.monotonic() + timeout, passed)
    except BaseException:
        for fd in passed:
            os.close(fd)
        raise
    for fd in passed[1:]:  # (the helper passes one)
        os.close(fd)
    words = buf.split(b"\n", 1)[0].split()
    if truncated and not passed and words[:1] == [b"ok"]:
        raise OutOfFds(errno.EMFILE, "taking in the pipe the command tells its exec on")
    return words, passed[0] if passed else None


def _recv_line(sock: socket.socket, deadline: float, passed: list[int]) -> tuple[bytes, bool]:
    """Bytes up to a newline (or EOF) and whether a passed fd was lost (MSG_CTRUNC);
    the fds that came go to ``passed``."""
    buf = b""
    truncated = False
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the lineage's helper did not answer in time")
        if not readable([sock.fileno()], left):
            continue
        data, fds, flags, _ = socket.recv_fds(sock, 4096, 1)
        passed += fds
        truncated = truncated or bool(flags & getattr(socket, "MSG_CTRUNC", 0))
        if not data:
            break
        buf += data
    return buf, truncated


def exec_outcome(fd: int, timeout: float) -> Optional[int]:
    """What the command said on its exec pipe: None once its exec worked (EOF), or the
    exec's errno. Closes fd. Bounded: TimeoutError past ``timeout``."""
    deadline = time.monotonic() + timeout
    data = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the command did not exec in time")
            if not readable([fd], left):
                continue
            chunk = os.read(fd, 64)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) >= 4:
        return int.from_bytes(data[:4], sys.byteorder, signed=True) or None
    return None


def raise_error(words: list[bytes], filename: Any) -> None:
    """Raise what an ``error <errno> <message>`` line says (as subprocess would),
    naming ``filename`` (the executable, or args[0]) where the exec failed."""
    try:
        err = int(words[1])
    except (IndexError, ValueError):
        raise ProctableError("the lineage's helper failed to start "
                             f"({b' '.join(words).decode(errors='replace') or 'no word'})"
                             ) from None
    msg = b" ".join(words[2:]).decode(errors="replace")
    if err in (2, 13, 8, 20, 21, 36, 40):  # ENOENT EACCES ENOEXEC ENOTDIR EISDIR ENAMETOOLONG ELOOP
        raise OSError(err, os.strerror(err), os.fsdecode(filename))
    raise OSError(err, msg or os.strerror(err))
