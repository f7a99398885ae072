"""psutil's exception classes, as proctable's own.

Code written against psutil catches ``psutil.NoSuchProcess``,
``psutil.AccessDenied``, ``psutil.ZombieProcess``, ``psutil.TimeoutExpired``
or ``psutil.Error``; after ``import proctable.compat as psutil`` those names
are these classes, with psutil's constructor arguments and attributes
(``pid``, ``name``, ``msg``; ``ppid`` for ZombieProcess; ``seconds`` for
TimeoutExpired). They are not psutil's classes (proctable does not depend on
psutil), and they fit proctable's own tree: ``Error`` is a
:class:`~proctable.ProctableError`, ``NoSuchProcess`` also a
:class:`proctable.NoSuchProcess` (so a ``ProcessLookupError``), ``AccessDenied``
also a :class:`proctable.AccessDenied` (a ``PermissionError``) and
``TimeoutExpired`` a ``TimeoutError``. So ``except proctable.NoSuchProcess``
catches what ``proctable.compat`` raises, and ``except OSError`` does too:
the one thing a switched program may notice.
"""

from __future__ import annotations

from typing import Any, Optional

from .. import errors

__all__ = ["AccessDenied", "Error", "NoSuchProcess", "TimeoutExpired", "ZombieProcess"]


class Error(errors.ProctableError):
    """The base of proctable.compat's exceptions, as ``psutil.Error`` is of psutil's."""

    # Any: NoSuchProcess and AccessDenied also get proctable's pid (an int).
    pid: Any = None
    name: Any = None
    msg: str = ""

    def _details(self, keys: tuple[str, ...]) -> str:
        parts = []
        for k in keys:
            v = getattr(self, k, None)
            if v or (k == "pid" and v == 0):
                parts.append(f"{k}={v!r}")
        return ", ".join(parts)

    def __str__(self) -> str:
        details = self._details(("pid", "ppid", "name"))
        return " ".join(x for x in (self.msg, f"({details})" if details else "") if x)

    def __repr__(self) -> str:
        details = self._details(("pid", "ppid", "name", "seconds", "msg"))
        return f"proctable.compat.{type(self).__name__}({details})"


class NoSuchProcess(Error, errors.NoSuchProcess):
    """No process holds the pid any more, or it names another process now
    (``psutil.NoSuchProcess(pid, name=None, msg=None)``)."""

    def __init__(self, pid: int, name: Optional[str] = None, msg: Optional[str] = None) -> None:
        errors.NoSuchProcess.__init__(self, pid, msg or "the process is gone")
        self.pid = pid
        self.name = name
        self.msg = msg or "the process is gone"

    def __reduce__(self) -> Any:
        return (type(self), (self.pid, self.name, self.msg))


class ZombieProcess(NoSuchProcess):
    """The process has exited and its parent has not reaped it yet: the kernel
    no longer has what was asked (``psutil.ZombieProcess(pid, name=None,
    ppid=None, msg=None)``). ``ppid`` is the zombie's parent where it was read."""

    def __init__(self, pid: int, name: Optional[str] = None, ppid: Optional[int] = None,
                 msg: Optional[str] = None) -> None:
        NoSuchProcess.__init__(self, pid, name, msg or "the process is a zombie")
        self.ppid = ppid

    def __reduce__(self) -> Any:
        return (type(self), (self.pid, self.name, self.ppid, self.msg))


class AccessDenied(Error, errors.AccessDenied):
    """The kernel does not let this caller read or signal the process
    (``psutil.AccessDenied(pid=None, name=None, msg=None)``)."""

    def __init__(self, pid: Optional[int] = None, name: Optional[str] = None,
                 msg: Optional[str] = None) -> None:
        # errors.AccessDenied wants a pid; psutil's may be None: set the OSError up here.
        PermissionError.__init__(self, msg or "access denied")
        self.pid = pid
        self.name = name
        self.msg = msg or ""

    def __reduce__(self) -> Any:
        return (type(self), (self.pid, self.name, self.msg))


class TimeoutExpired(Error, TimeoutError):
    """A wait's timeout ran out while the process still runs
    (``psutil.TimeoutExpired(seconds, pid=None, name=None)``)."""

    def __init__(self, seconds: float, pid: Optional[int] = None,
                 name: Optional[str] = None) -> None:
        TimeoutError.__init__(self, f"still running after {seconds} seconds")
        self.seconds = seconds
        self.pid = pid
        self.name = name
        self.msg = f"still running after {seconds} seconds"

    def __reduce__(self) -> Any:
        return (type(self), (self.seconds, self.pid, self.name))
