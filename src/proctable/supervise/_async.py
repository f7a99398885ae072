"""The asyncio face of the supervisor: the same machine and runtime, awaited.

Every call hands its work to the runtime's threads and awaits the runtime's
future, so a teardown never runs on the event loop; events reach the loop
through ``call_soon_threadsafe``, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any, Callable, Optional

from .._status import ExitStatus
from ..lineage import Lineage
from ..table import Identity
from ._event import Event
from ._policy import RestartPolicy
from ._runtime import Supervisor

__all__ = ["AsyncSupervisor"]

_END = None


class AsyncSupervisor:
    """A :class:`Supervisor` for asyncio: awaitable calls, ``async for event in sup.events()``.

    Create it in a coroutine (it binds to the running loop). ``on_event``, if
    given, is called in the loop for every event, in order, before the event is
    queued for ``events()``; it must not block (it may create tasks that call
    back into the supervisor). ``events()`` is meant for one consumer: it yields
    every event from the supervisor's creation on, and ends after ``close()``.
    """

    def __init__(self, on_event: Optional[Callable[[Event], object]] = None, *,
                 grace: float = 3.0, kill_timeout: float = 3.0, mode: str = "auto") -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Optional[Event]] = asyncio.Queue()
        self._user = on_event
        self._ended = False
        self._sync = Supervisor(on_event=self._from_thread, grace=grace,
                                kill_timeout=kill_timeout, mode=mode)

    @property
    def supervisor(self) -> Supervisor:
        """The thread-based supervisor underneath (its inspection methods are safe to
        call from the loop: they take a lock for microseconds)."""
        return self._sync

    async def start(self, key: Hashable, args: Sequence[str],
                    restart: Optional[RestartPolicy] = None, timeout: Optional[float] = None,
                    **popen_kwargs: Any) -> Identity:
        """As :meth:`Supervisor.start`, without blocking the loop."""
        return await asyncio.wrap_future(
            self._sync.submit_start(key, args, restart, timeout, **popen_kwargs))

    async def adopt(self, key: Hashable, identity: Identity,
                    restart: Optional[RestartPolicy] = None,
                    args: Optional[Sequence[str]] = None, **popen_kwargs: Any) -> Identity:
        return await asyncio.wrap_future(
            self._sync.submit_adopt(key, identity, restart, args, **popen_kwargs))

    async def stop(self, key: Hashable, grace: Optional[float] = None) -> Optional[ExitStatus]:
        return await asyncio.wrap_future(self._sync.submit_stop(key, grace))

    async def remove(self, key: Hashable, grace: Optional[float] = None) -> None:
        await asyncio.wrap_future(self._sync.submit_remove(key, grace))

    async def close(self, grace: Optional[float] = None) -> None:
        """As :meth:`Supervisor.close`; the teardowns and the thread joins run off the loop."""
        await asyncio.to_thread(self._sync.close, grace)
        if not self._ended and not self._sync._dispatcher.is_alive():
            self._ended = True
            # After every event: the dispatch thread is gone, and the loop runs its
            # call_soon_threadsafe callbacks in order, so these came first.
            self._queue.put_nowait(_END)

    async def events(self) -> AsyncIterator[Event]:
        """Every event in order; ends once the supervisor is closed and drained."""
        while True:
            ev = await self._queue.get()
            if ev is None:
                self._queue.put_nowait(_END)  # a second iterator ends too
                return
            yield ev

    def generation(self, key: Hashable) -> int:
        return self._sync.generation(key)

    def state(self, key: Hashable) -> str:
        return self._sync.state(key)

    def running(self, key: Hashable) -> bool:
        return self._sync.running(key)

    def keys(self) -> list[Hashable]:
        return self._sync.keys()

    def lineage(self, key: Hashable) -> Optional[Lineage]:
        return self._sync.lineage(key)

    def __contains__(self, key: object) -> bool:
        return key in self._sync

    async def __aenter__(self) -> AsyncSupervisor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- from the dispatch thread -------------------------------------------------------

    def _from_thread(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._deliver, event)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            pass

    def _deliver(self, event: Event) -> None:
        if self._user is not None:
            try:
                self._user(event)
            except Exception:
                asyncio.get_running_loop().call_exception_handler(
                    {"message": f"on_event raised for {event.kind} of {event.key!r}"})
        self._queue.put_nowait(event)
