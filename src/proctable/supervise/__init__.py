"""The supervisor: keys, generations, ordered events, a restart policy; stop always wins.

The layout keeps the decisions apart from the I/O:

- ``_machine``: the per-key state machine, pure (states, inputs, actions as plain
  data, one transition table and the few rules beside it; no I/O, no threads,
  no clock). The restart decision it calls is ``_policy.decide``, pure as well.
- ``_runtime``: :class:`Supervisor`, which feeds the machines and carries out
  their actions with threads (a worker per launch and teardown, one timer
  thread, the exit watcher, one dispatch thread for the events).
- ``_async``: :class:`AsyncSupervisor`, the same runtime awaited from asyncio.
"""

from __future__ import annotations

from ..errors import StartCancelled, SupervisorClosed
from ._async import AsyncSupervisor
from ._event import KINDS, Event
from ._policy import RestartPolicy
from ._runtime import Supervisor

__all__ = [
    "KINDS",
    "AsyncSupervisor",
    "Event",
    "RestartPolicy",
    "StartCancelled",
    "Supervisor",
    "SupervisorClosed",
]
