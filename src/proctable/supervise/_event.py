"""The event a supervisor reports: one lifecycle step of one key (plain data).

``Event`` is one frozen dataclass with every field; constructing it gives an
instance of the subclass of its kind (``Event("output", ...)`` is an
:class:`OutputEvent`), whose annotations say what that kind always carries
(``OutputEvent.data`` is bytes, ``ExitedEvent.status`` a str). ``AnyEvent``
is their union, tagged by ``kind``: annotate a callback's argument with it and
a type checker narrows ``if ev.kind == "output": ev.data`` to bytes. Every
attribute stays readable on every event (None where the kind has none), so
code written against the one ``Event`` works as it did.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union, cast

from .._status import ExitStatus
from ..table import Identity, Proc

__all__ = [
    "KINDS",
    "AdoptedEvent",
    "AnyEvent",
    "CreatedEvent",
    "DeletedEvent",
    "Event",
    "ExitedEvent",
    "GaveUpEvent",
    "OutputEvent",
    "RestartingEvent",
    "TeardownFailedEvent",
    "typed",
]

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

    def __new__(cls, *args: Any, **kwargs: Any) -> Event:
        # Event(kind, ...) makes the subclass of its kind (a kind without one: Event).
        made = cls
        if cls is Event:
            kind = args[0] if args else kwargs.get("kind")
            made = _BY_KIND.get(kind, Event) if isinstance(kind, str) else Event
        return object.__new__(made)


# One class per kind: the same fields, with the types that kind always has.


class CreatedEvent(Event):
    """A generation started: ``identity`` is its command's."""

    kind: Literal["created"]
    identity: Identity


class ExitedEvent(Event):
    """A generation ended: ``status`` (exited, signaled, killed, timeout) and
    ``exit`` (its root's ExitStatus, None where it could not be read)."""

    kind: Literal["exited"]
    status: str


class RestartingEvent(Event):
    """The restart policy starts the key again: ``reason``."""

    kind: Literal["restarting"]
    reason: str


class GaveUpEvent(Event):
    """The restart policy gave up on the key: ``reason``."""

    kind: Literal["gave_up"]
    reason: str


class TeardownFailedEvent(Event):
    """A teardown could not prove every member gone: ``reason`` and ``survivors``."""

    kind: Literal["teardown_failed"]
    reason: str
    survivors: tuple[Proc, ...]


class DeletedEvent(Event):
    """The key was removed."""

    kind: Literal["deleted"]


class AdoptedEvent(Event):
    """A durable session was taken over (its ``generation`` and ``identity``)."""

    kind: Literal["adopted"]
    identity: Identity


class OutputEvent(Event):
    """Bytes a generation wrote: ``stream`` (stdout, stderr, pty), ``data`` and
    ``offset``."""

    kind: Literal["output"]
    stream: str
    data: bytes
    offset: int


_BY_KIND: dict[str, type[Event]] = {
    "created": CreatedEvent, "exited": ExitedEvent, "restarting": RestartingEvent,
    "gave_up": GaveUpEvent, "teardown_failed": TeardownFailedEvent, "deleted": DeletedEvent,
    "output": OutputEvent, "adopted": AdoptedEvent,
}

AnyEvent = Union[CreatedEvent, ExitedEvent, RestartingEvent, GaveUpEvent,
                 TeardownFailedEvent, DeletedEvent, OutputEvent, AdoptedEvent]
"""Every event a supervisor delivers, as a union tagged by ``kind``: what
``on_event`` gets and ``AsyncSupervisor.events()`` yields."""


def typed(ev: Event) -> AnyEvent:
    """ev as the union it belongs to: every Event is made as the class of its kind."""
    return cast(AnyEvent, ev)
