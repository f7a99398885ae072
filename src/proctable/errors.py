"""The exception tree of proctable."""

from __future__ import annotations

from typing import Optional

__all__ = ["AccessDenied", "NoSuchProcess", "ProctableError", "TeardownError"]


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
