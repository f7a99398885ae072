"""One predicate for "this process has ended", used everywhere that decides it.

A process has ended when its whole thread group has exited. The kernel says so
in two ways, and this module is the only place that reads either:

- a pidfd polls readable once the whole thread group exited (Linux 5.3+);
- without a pidfd, the row of the pid: it names another process now (its start
  time differs), or no process holds the pid, or it is a zombie (``Z``) or dead
  (``X``) with at most one thread left.

A zombie main thread with live threads (the process's ``main`` called
``pthread_exit``) shows state ``Z`` with ``num_threads > 1`` and still runs: it
has *not* ended, for the table, the exit watcher, the lineage and teardown alike.

This sits below table.py: it looks at values and fds, never at Proc itself.
"""

from __future__ import annotations

from typing import Optional, Protocol, Union

from ._fdwait import readable

__all__ = ["ENDED_STATES", "ended", "pidfd_ended", "row_ended"]

ENDED_STATES = frozenset({"Z", "X", "x"})
"""The one-letter states of a process whose threads may all have exited
(``x`` is how Linux 2.6.33 to 3.13 wrote ``X``)."""
_ENDED_BYTES = frozenset(s.encode() for s in ENDED_STATES)


class RowLike(Protocol):
    """What the predicate reads of a row (a :class:`proctable.Proc` has it)."""

    @property
    def start_time(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def num_threads(self) -> Optional[int]: ...


def row_ended(state: Union[str, bytes], num_threads: Optional[int]) -> bool:
    """The pure part: a row has ended iff its state is Z or X and at most one
    thread is left (a zombie leader with live threads has not ended). An unknown
    thread count (None: only a macOS zombie, which has one thread) counts as one."""
    if num_threads is not None and num_threads > 1:
        return False
    if isinstance(state, bytes):
        return state in _ENDED_BYTES
    return state in ENDED_STATES


def pidfd_ended(fd: int) -> bool:
    """A pidfd polls readable: the kernel says its whole thread group exited."""
    return bool(readable([fd], 0))


def ended(fd: Optional[int], row: Optional[RowLike], start_time: Optional[int] = None) -> bool:
    """Has the process ended? With a pidfd, the pidfd alone decides (``row`` is
    not looked at). Without one, ``row`` is the pid's row read now: None (no
    process holds the pid), another start time than ``start_time`` (when given),
    or a row that has ended (:func:`row_ended`) all mean ended.

    A row that could not be read is for the caller to treat as unknown: unknown
    is not ended.
    """
    if fd is not None:
        return pidfd_ended(fd)
    if row is None:
        return True
    if start_time is not None and row.start_time != start_time:
        return True
    return row_ended(row.state, row.num_threads)
