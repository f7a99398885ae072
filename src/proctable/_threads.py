"""Starting the package's own threads, with a clear error where none can start.

A thread can fail to start where the process reached RLIMIT_NPROC (threads count
toward it) or where a sandbox answers clone3 with EPERM (glibc falls back to
clone only on ENOSYS): Python then raises a bare RuntimeError. Every thread of
proctable starts here, so the caller gets a ProctableError that says why.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from .errors import NoThread

__all__ = ["NoThread", "start_thread"]


def start_thread(target: Callable[..., Any], name: str, *args: Any) -> threading.Thread:
    """Start a daemon thread running target(*args); NoThread if the host refuses."""
    t = threading.Thread(target=target, args=args, name=name, daemon=True)
    try:
        t.start()
    except RuntimeError as exc:
        raise NoThread(f"cannot start the thread {name!r}: {exc} (the process reached "
                       "RLIMIT_NPROC, or a sandbox denies clone3)") from None
    return t
