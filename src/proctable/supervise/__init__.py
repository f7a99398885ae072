"""The supervisor: keys, generations, ordered events, a restart policy; stop always wins.

The layout keeps the decisions apart from the I/O:

- ``_machine``: the per-key state machine, pure (states, inputs, actions as plain
  data, one transition table and the few rules beside it; no I/O, no threads,
  no clock). The restart decision it calls is ``_policy.decide``, pure as well.
- ``_runtime``: :class:`Supervisor`, which feeds the machines and carries out
  their actions with threads (a worker per launch and teardown, one timer
  thread, the exit watcher, one dispatch thread for the events); ``_health``:
  the faults those threads survive, which ``Supervisor.health`` lists.
- ``_async``: :class:`AsyncSupervisor`, the same runtime awaited from asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import StartCancelled, SupervisorClosed
from ._event import (
    KINDS,
    AdoptedEvent,
    AnyEvent,
    CreatedEvent,
    DeletedEvent,
    Event,
    ExitedEvent,
    GaveUpEvent,
    OutputEvent,
    RestartingEvent,
    TeardownFailedEvent,
)
from ._health import Fault
from ._policy import MAX_SECONDS, RestartPolicy
from ._runtime import Replay, Supervisor

if TYPE_CHECKING:
    from ._async import AsyncSupervisor


def __getattr__(name: str) -> Any:
    # AsyncSupervisor loads asyncio: only for those who ask for it.
    if name == "AsyncSupervisor":
        from ._async import AsyncSupervisor  # noqa: PLC0415

        return AsyncSupervisor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "KINDS",
    "MAX_SECONDS",
    "AdoptedEvent",
    "AnyEvent",
    "AsyncSupervisor",
    "CreatedEvent",
    "DeletedEvent",
    "Event",
    "ExitedEvent",
    "Fault",
    "GaveUpEvent",
    "OutputEvent",
    "Replay",
    "RestartPolicy",
    "RestartingEvent",
    "StartCancelled",
    "Supervisor",
    "SupervisorClosed",
    "TeardownFailedEvent",
]
