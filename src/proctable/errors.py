"""The exception tree of proctable."""

from __future__ import annotations

from typing import Optional

__all__ = [
    "AccessDenied",
    "ExitUnknown",
    "GenerationEnded",
    "InputBlocked",
    "NoInput",
    "NoSuchKey",
    "NoSuchProcess",
    "NoThread",
    "OutOfFds",
    "ProctableError",
    "StartCancelled",
    "StateDirError",
    "SupervisorClosed",
    "TeardownError",
    "WatcherClosed",
]


class ProctableError(Exception):
    """Base class of every error proctable raises on purpose."""


class NoSuchProcess(ProctableError, ProcessLookupError):
    """The process does not exist (any more), or its pid names another process now."""

    def __init__(self, pid: int, msg: Optional[str] = None) -> None:
        self.pid = pid
        super().__init__(msg or f"no such process: pid {pid}")


class AccessDenied(ProctableError, PermissionError):
    """The kernel does not let this process read or signal that one."""

    def __init__(self, pid: int, msg: Optional[str] = None) -> None:
        self.pid = pid
        super().__init__(msg or f"access denied: pid {pid}")


class TeardownError(ProctableError):
    """Teardown could not prove that every member of a lineage is gone in time."""

    def __init__(self, msg: str, survivors: list[object], report: object = None) -> None:
        self.survivors = survivors
        self.report = report
        super().__init__(msg)


class ExitUnknown(ProctableError):
    """The process exited, but no source can ever tell its status.

    For example it was reaped by its parent before the status was read, on a
    kernel without pidfd exit info; or its zombie's status is hidden from this user.
    """

    def __init__(self, pid: int, msg: Optional[str] = None) -> None:
        self.pid = pid
        super().__init__(msg or f"pid {pid} exited, but its status cannot be known")


class WatcherClosed(ProctableError, RuntimeError):
    """The ExitWatcher was closed: it takes no new watches."""


class StartCancelled(ProctableError):
    """A supervisor's start() did not happen: a stop(), remove() or close() of the key
    came while it waited its turn (stop always wins). Nothing of it runs."""


class SupervisorClosed(StartCancelled, RuntimeError):
    """The Supervisor was closed: a start() after close(), or racing it, fails with this
    (and nothing it launched is left running)."""


def _nofile() -> str:
    try:
        import resource  # noqa: PLC0415 - only to word the error

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return "RLIMIT_NOFILE"
    return f"RLIMIT_NOFILE {soft}" if soft != resource.RLIM_INFINITY else "RLIMIT_NOFILE"


class OutOfFds(ProctableError, OSError):
    """The process has no file descriptor left (EMFILE: its RLIMIT_NOFILE; ENFILE:
    the system's). ``errno`` is EMFILE or ENFILE, as the OSError it also is."""

    def __init__(self, err: int, what: str) -> None:
        import errno as _errno  # noqa: PLC0415

        scope = ("the whole system's file table (ENFILE)" if err == _errno.ENFILE
                 else f"this process's {_nofile()}")
        super().__init__(err, f"{what}: out of file descriptors: {scope} is used up")


class NoSuchKey(ProctableError, KeyError):
    """A supervisor has no such key (``stop``, ``remove``, ``write``, ... of a key
    never started, or removed). A ``KeyError`` whose argument is the key, as a
    dict's is; its message says which key."""

    def __init__(self, key: object) -> None:
        super().__init__(key)
        self.key = key

    def __str__(self) -> str:
        return f"no key {self.key!r} in this supervisor"


class GenerationEnded(ProctableError, LookupError):
    """``tail(key, since=OFFSET, generation=G)`` of a generation that is no longer the
    key's current one: its output from that offset on is not kept any more (the key
    restarted), and the current generation's bytes at that offset are another
    stream's. ``key``, ``generation`` (the one asked for) and ``current``."""

    def __init__(self, key: object, generation: int, current: int) -> None:
        super().__init__(key, generation, current)
        self.key = key
        self.generation = generation
        self.current = current

    def __str__(self) -> str:
        return (f"key {self.key!r}: generation {self.generation} ended (the current one is "
                f"{self.current}); its output from that offset on is no longer kept")


class NoThread(ProctableError, RuntimeError):
    """A thread proctable needs could not be started (RLIMIT_NPROC, or clone3 denied).

    Raised when a watcher, a lineage or a supervisor starts, before it runs
    anything, so that nothing is left running; the table, the probes and
    ``terminate()`` need no thread of their own.
    """


class NoInput(ProctableError):
    """A key's input cannot be used: it has no pty or stdin pipe (start it with
    ``pty=`` or ``stdin=subprocess.PIPE``), no pty to resize, its input was closed,
    or it is not running (a generation's input is closed when it ends)."""


class InputBlocked(NoInput, TimeoutError):
    """A write could not be completed within its bound (the command does not read
    its input); ``written`` bytes of it went in."""

    def __init__(self, message: str, written: int) -> None:
        super().__init__(message)
        self.written = written


class StateDirError(ProctableError):
    """A durable supervisor's state directory cannot be used: not this user's alone
    (another owner, group or other permissions, a symbolic link), not a directory, on
    a read-only mount, held by another supervisor, or full."""
