"""Wait for fds to turn readable with poll(2), bounded.

select(2) cannot take an fd number of 1024 or more, which a supervisor that
holds many pidfds reaches quickly; poll has no such limit.
"""

from __future__ import annotations

import select
from collections.abc import Sequence
from typing import Optional

__all__ = ["readable"]

_READY = select.POLLIN | select.POLLHUP | select.POLLERR | select.POLLNVAL


def readable(fds: Sequence[int], timeout: Optional[float]) -> list[int]:
    """The fds of ``fds`` that are readable (or hung up) within ``timeout`` seconds.

    ``timeout`` None waits without bound: callers in this package never pass it.
    An interrupted wait (EINTR) returns no fds; the caller's loop re-checks its clock.
    """
    p = select.poll()
    for fd in fds:
        p.register(fd, select.POLLIN)
    ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    try:
        events = p.poll(ms)
    except InterruptedError:  # pragma: no cover - Python retries EINTR itself
        return []
    return [fd for fd, ev in events if ev & _READY]
