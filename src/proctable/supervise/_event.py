"""The event a supervisor reports: one lifecycle step of one key (plain data)."""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Optional

from .._status import ExitStatus
from ..table import Identity, Proc

__all__ = ["KINDS", "Event"]

KINDS = ("created", "exited", "restarting", "gave_up", "teardown_failed", "deleted", "output",
         "adopted")


@dataclass(frozen=True)
class Event:
    """One lifecycle event of a key.

    ``kind`` is one of ``KINDS``; ``generation`` is the key's start count the event
    belongs to (``gave_up``, ``teardown_failed`` and ``deleted`` carry the last
    one). For ``exited``: ``status`` is ``exited`` (it ended with a code),
    ``signaled`` (a signal we did not send), ``killed`` (we stopped it) or
    ``timeout`` (its ``timeout`` ran out), and ``exit`` the root's ExitStatus (None
    where it could not be read). ``restarting``, ``gave_up`` and
    ``teardown_failed`` carry a ``reason``; ``teardown_failed`` also the
    ``survivors`` (rows of the members whose end could not be proven).

    ``output`` (only for a key started with ``output="events"`` or ``pty=``): ``data``
    is bytes as read from ``stream`` (``stdout``, ``stderr``, or ``pty``), written by
    that ``generation``, delivered after its ``created`` and before its ``exited``;
    ``offset`` is the position of its first byte in that generation's output (every
    stream together, in read order, counting dropped bytes too); ``dropped`` is
    the number of bytes of this generation dropped just before this chunk because
    they were not delivered within the supervisor's per-key ``output_buffer`` bound,
    or never read at its teardown (0 normally), so ``offset - dropped`` is where
    the previous output event ended; an output event whose ``data`` is empty
    carries only such a count (its ``offset`` is where the next byte goes).

    ``adopted`` (a durable supervisor, see ``state_dir``): a session that outlived
    the supervisor that started it was taken over, with its ``generation`` and
    ``identity``; what happened while no supervisor was there follows.
    """

    kind: str
    key: Hashable
    generation: int
    identity: Optional[Identity]
    status: Optional[str] = None
    exit: Optional[ExitStatus] = None
    reason: Optional[str] = None
    survivors: Optional[tuple[Proc, ...]] = None
    time: float = field(default_factory=time.time)
    stream: Optional[str] = None
    data: Optional[bytes] = None
    dropped: int = 0
    offset: Optional[int] = None
