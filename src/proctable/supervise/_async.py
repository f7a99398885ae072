"""The asyncio face of the supervisor: the same machine and runtime, awaited.

Nothing synchronous of a call runs on the event loop: each call is handed to one
feeder thread of this supervisor (so the calls reach the machines in the order
they were made on the loop), which feeds it (checking the arguments, starting
the worker threads) and returns the runtime's future, which the loop then
awaits. Teardowns run on the runtime's workers; events reach the loop through
``call_soon_threadsafe``, in order.

Cancelling an awaiting call (``asyncio.wait_for``, ``task.cancel()``) cancels
the waiting, never the call: it goes on in the background, as it does for a
thread that stops waiting (see :mod:`._runtime`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import AsyncIterator, Hashable, Sequence
from concurrent.futures import Future
from typing import Any, Callable, Optional, TypeVar

from .._status import ExitStatus
from ..lineage import Lineage
from ..table import Identity
from ._event import Event
from ._policy import RestartPolicy
from ._runtime import Supervisor

__all__ = ["AsyncSupervisor"]

_END = None
T = TypeVar("T")


class AsyncSupervisor:
    """A :class:`Supervisor` for asyncio: awaitable calls, ``async for event in sup.events()``.

    Create it in a coroutine (it binds to the running loop). ``on_event``, if
    given, is called in the loop for every event, in order, before the event is
    queued for ``events()``; it must not block (it may create tasks that call
    back into the supervisor). ``events()`` is meant for one consumer: it yields
    every event from the supervisor's creation on, and ends after a ``close()``
    that succeeded. A ``close()`` that raised :class:`TeardownError` has not
    closed the supervisor (the failed keys keep their lineages for a retry, and
    their events are still to come): ``events()`` goes on until a later
    ``close()`` succeeds.

    Cancelling an awaited call cancels only the waiting: the start, stop, remove
    or close goes on in the background (to undo a start, stop the key).
    """

    def __init__(self, on_event: Optional[Callable[[Event], object]] = None, *,
                 grace: float = 3.0, kill_timeout: float = 3.0, mode: str = "auto") -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Optional[Event]] = asyncio.Queue()
        self._user = on_event
        self._ended = False
        self._sync = Supervisor(on_event=self._from_thread, grace=grace,
                                kill_timeout=kill_timeout, mode=mode)
        # One thread, so that the calls reach the machines in the order they were made.
        self._feeder = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="proctable-async-supervisor")

    @property
    def supervisor(self) -> Supervisor:
        """The thread-based supervisor underneath (its inspection methods are safe to
        call from the loop: they take a lock for microseconds)."""
        return self._sync

    async def start(self, key: Hashable, args: Sequence[str],
                    restart: Optional[RestartPolicy] = None, timeout: Optional[float] = None,
                    *, output: str = "inherit", pty: Optional[tuple[int, int]] = None,
                    **popen_kwargs: Any) -> Identity:
        """As :meth:`Supervisor.start`, without blocking the loop."""
        return await self._call(functools.partial(
            self._sync.submit_start, key, args, restart, timeout, output=output, pty=pty,
            **popen_kwargs))

    async def write(self, key: Hashable, data: bytes) -> int:
        """As :meth:`Supervisor.write`; the bounded wait runs off the loop, on a thread of
        its own (not the feeder: a write waiting for a command that does not read must
        not hold up the other calls)."""
        return await self._off_feeder(functools.partial(self._sync.write, key, data))

    async def close_stdin(self, key: Hashable) -> None:
        await self._off_feeder(functools.partial(self._sync.close_stdin, key))

    async def resize(self, key: Hashable, rows: int, cols: int) -> None:
        await self._off_feeder(functools.partial(self._sync.resize, key, rows, cols))

    async def _off_feeder(self, fn: Callable[[], T]) -> T:
        """fn() on the loop's default executor: input and terminal calls are no input of
        the per-key machines, so they need not keep the feeder's order."""
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    def tail(self, key: Hashable, n: int = 65536) -> bytes:
        """As :meth:`Supervisor.tail` (it only copies bytes: safe on the loop)."""
        return self._sync.tail(key, n)

    async def adopt(self, key: Hashable, identity: Identity,
                    restart: Optional[RestartPolicy] = None,
                    args: Optional[Sequence[str]] = None, **popen_kwargs: Any) -> Identity:
        return await self._call(functools.partial(
            self._sync.submit_adopt, key, identity, restart, args, **popen_kwargs))

    async def stop(self, key: Hashable, grace: Optional[float] = None) -> Optional[ExitStatus]:
        return await self._call(functools.partial(self._sync.submit_stop, key, grace))

    async def remove(self, key: Hashable, grace: Optional[float] = None) -> None:
        await self._call(functools.partial(self._sync.submit_remove, key, grace))

    async def close(self, grace: Optional[float] = None) -> None:
        """As :meth:`Supervisor.close`; the teardowns and the thread joins run off the loop.

        After a close that raised :class:`TeardownError`, ``events()`` goes on (the
        supervisor is not closed yet); it ends once a close succeeds."""
        # On the feeder too: the calls made before it reach the machines first.
        await self._run(functools.partial(self._sync.close, grace))
        if not self._ended and not self._sync._dispatcher.is_alive():
            self._ended = True
            # After every event: the dispatch thread is gone, and the loop runs its
            # call_soon_threadsafe callbacks in order, so these came first.
            self._queue.put_nowait(_END)
            # Later calls are refused at once (nothing is left to start a thread for).
            self._feeder.shutdown(wait=False)

    async def _run(self, fn: Callable[[], T]) -> T:
        """fn() on the feeder thread (at once on the loop once the feeder is shut down:
        everything is refused then without blocking)."""
        try:
            fut = self._feeder.submit(fn)
        except RuntimeError:  # shut down after the supervisor closed
            return fn()
        return await asyncio.wrap_future(fut)

    async def _call(self, submit: Callable[[], Future[T]]) -> T:
        return await asyncio.wrap_future(await self._run(submit))

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
