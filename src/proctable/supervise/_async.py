"""The asyncio face of the supervisor: the same machine and runtime, awaited.

Nothing synchronous of a call runs on the event loop: each call is handed to one
feeder thread of this supervisor (so the calls reach the machines in the order
they were made on the loop), which feeds it (checking the arguments, starting
the worker threads) and returns the runtime's future, which the loop then
awaits. Teardowns run on the runtime's workers; events reach the loop through
``call_soon_threadsafe``, in order.

Output stays bounded up to the reader of ``events()``: the dispatch thread hands
the loop only a token of a generation's buffer (its bytes stay in the key's
bounded buffer until the loop takes them), and the output events the loop took
and ``events()`` has not yielded yet are bounded per key as well (``output_buffer``):
beyond it the oldest are dropped and counted in the ``dropped`` of the next output
event of the same generation (or of an event without data in their place, still
before the generation's ``exited``). Lifecycle events are never dropped.

Cancelling an awaiting call (``asyncio.wait_for``, ``task.cancel()``) cancels
the waiting, never the call: it goes on in the background, as it does for a
thread that stops waiting (see :mod:`._runtime`).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import weakref
from collections.abc import AsyncIterator, Hashable, Sequence
from concurrent.futures import Future
from typing import Any, Callable, Optional, TypeVar, Union, overload

from .._output import Output
from .._status import ExitStatus
from .._threads import start_thread
from ..lineage import Lineage
from ..table import Identity
from ._dispatch import output_events
from ._event import AnyEvent, Event, typed
from ._policy import RestartPolicy
from ._runtime import Replay, Supervisor

__all__ = ["AsyncSupervisor"]

_END = None
T = TypeVar("T")


class AsyncSupervisor:
    """A :class:`Supervisor` for asyncio: awaitable calls, ``async for event in sup.events()``.

    Create it in a coroutine (it binds to the running loop). ``grace``,
    ``kill_timeout``, ``mode``, ``output_buffer``, ``tail_size`` and
    ``write_timeout`` are :class:`Supervisor`'s, with the same checks; output not
    yet yielded by ``events()`` counts against ``output_buffer``. ``on_event``, if
    given, is called in the loop for every event, in order, before the event is
    queued for ``events()``; it must not block (it may create tasks that call
    back into the supervisor). ``events()`` is meant for one consumer: it yields
    every event from the supervisor's creation on (with ``on_event`` given, from
    the call of ``events()`` until that iterator is closed: nothing is kept for an
    iterator that may never come), and ends after a ``close()`` that succeeded. A ``close()``
    that raised :class:`TeardownError` has not closed the supervisor (the failed
    keys keep their lineages for a retry, and their events are still to come):
    ``events()`` goes on until a later ``close()`` succeeds.

    Cancelling an awaited call cancels only the waiting: the start, stop, remove
    or close goes on in the background (to undo a start, stop the key).
    """

    def __init__(self, on_event: Optional[Callable[[AnyEvent], object]] = None, *,
                 grace: float = 3.0, kill_timeout: float = 3.0, mode: str = "auto",
                 output_buffer: int = 4 << 20, tail_size: int = 256 << 10,
                 write_timeout: float = 5.0, state_dir: Optional[str] = None,
                 on_adopt: str = "keep", ring_size: int = 1 << 20,
                 orphan_timeout: Optional[float] = None,
                 session_cgroup: Optional[str] = None,
                 restart_for: Optional[Callable[[str, Optional[RestartPolicy]],
                                                Optional[RestartPolicy]]] = None,
                 loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        if on_event is not None and not callable(on_event):
            raise TypeError("on_event must be a callable taking the event, or None, "
                            f"not {type(on_event).__name__}")
        self._loop = asyncio.get_running_loop() if loop is None else loop
        self._queue: asyncio.Queue[Optional[_Slot]] = asyncio.Queue()
        self._user = on_event
        # Events are kept for events() from the start only where it is the one
        # consumer; beside on_event, from its first iteration.
        self._queueing = on_event is None
        self._readers = 0  # events() iterators not yet closed
        self._ended = False
        self._sync = Supervisor(on_event=self._from_thread, grace=grace,
                                kill_timeout=kill_timeout, mode=mode,
                                output_buffer=output_buffer, tail_size=tail_size,
                                write_timeout=write_timeout, state_dir=state_dir,
                                on_adopt=on_adopt, ring_size=ring_size,
                                orphan_timeout=orphan_timeout, session_cgroup=session_cgroup,
                                restart_for=restart_for, _output_sink=self._output_from_thread)
        self._limit = self._sync._output_buffer
        # Output events queued and not yet yielded by events(), per key (oldest first),
        # and their bytes: the loop's side of the per-key bound.
        self._unread: dict[Hashable, collections.deque[_Slot]] = {}
        self._unread_size: dict[Hashable, int] = {}
        # One thread, so that the calls reach the machines in the order they were made.
        self._feeder = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="proctable-async-supervisor")

    @classmethod
    async def open(cls, on_event: Optional[Callable[[Event], object]] = None,
                   **options: Any) -> AsyncSupervisor:
        """An AsyncSupervisor made off the loop: a durable one (``state_dir``)
        re-adopts its sessions in its constructor, which waits for each one's
        helper; this keeps the loop free meanwhile. The same options as the
        constructor."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None, functools.partial(cls, on_event, loop=loop, **options))

    def detach(self) -> None:
        """As :meth:`Supervisor.detach` (returns at once): every durable session goes
        on under its helper; ``events()`` ends after the events emitted before it."""
        self._sync.detach()
        if not self._ended:
            self._ended = True

            def end() -> None:  # after the events the dispatch thread handed over
                self._queue.put_nowait(_END)
            self._loop.call_soon(end)
            self._feeder.shutdown(wait=False)

    @property
    def state_dir(self) -> Optional[str]:
        return self._sync.state_dir

    @property
    def adoption_problems(self) -> list[str]:
        return self._sync.adoption_problems

    @property
    def supervisor(self) -> Supervisor:
        """The thread-based supervisor underneath (its inspection methods are safe to
        call from the loop: they take a lock for microseconds)."""
        return self._sync

    async def start(self, key: Hashable, args: Sequence[str],
                    restart: Optional[RestartPolicy] = None, timeout: Optional[float] = None,
                    *, output: str = "inherit", pty: Optional[tuple[int, int]] = None,
                    drop_output: bool = False, **popen_kwargs: Any) -> Identity:
        """As :meth:`Supervisor.start`, without blocking the loop. The key's output is
        paced by ``events()``'s reader (or by ``on_event`` alone): what it has not
        yet yielded counts against ``output_buffer``."""
        return await self._call(functools.partial(
            self._sync.submit_start, key, args, restart, timeout, output=output, pty=pty,
            drop_output=drop_output, **popen_kwargs))

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
        """fn() on a thread of its own: input and terminal calls are no input of the
        per-key machines, so they need not keep the feeder's order; and not on a
        pool (the loop's default executor was one): writes that wait up to
        ``write_timeout`` on keys that do not read must not hold up a write to a key
        that does."""
        fut: Future[T] = Future()
        fut.set_running_or_notify_cancel()  # cancelling the await never cancels the call

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

        start_thread(run, "proctable-async-input")
        return await asyncio.wrap_future(fut)

    @overload
    def tail(self, key: Hashable, n: int = 65536) -> bytes: ...

    @overload
    def tail(self, key: Hashable, n: int = 65536, *, since: int,
             generation: Optional[int] = None) -> Replay: ...

    def tail(self, key: Hashable, n: int = 65536, *,
             since: Optional[int] = None,
             generation: Optional[int] = None) -> Union[bytes, Replay]:
        """As :meth:`Supervisor.tail` (it copies bytes; with ``since`` on a durable key
        it asks the session's helper: a round trip on a local socket, bounded)."""
        if since is None:
            if generation is not None:
                raise TypeError("tail's generation names the generation of since: "
                                "give since too")
            return self._sync.tail(key, n)
        return self._sync.tail(key, n, since=since, generation=generation)

    def last_input(self, key: Hashable) -> Optional[tuple[float, bytes]]:
        """As :meth:`Supervisor.last_input` (a look under a lock: safe on the loop)."""
        return self._sync.last_input(key)

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
        if not self._ended and not self._sync._events.alive():
            self._ended = True
            # After every event: the dispatch thread is gone, and the loop runs its
            # call_soon_threadsafe callbacks in order, so these came first.
            self._queue.put_nowait(_END)
            # Later calls are refused at once (nothing is left to start a thread for).
            self._feeder.shutdown(wait=False)

    async def wait(self, key: Hashable, timeout: Optional[float] = None) -> Optional[ExitStatus]:
        """As :meth:`Supervisor.wait`, awaited: the exit status of key's current
        generation once it has ended. ``TimeoutError`` after timeout seconds;
        cancelling the await only stops the waiting."""
        if timeout is not None:
            Supervisor._check_wait_timeout(timeout)
        fut = await self._run(functools.partial(self._sync.submit_wait, key))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout)
        except asyncio.TimeoutError:
            self._sync._forget_wait(key, fut)
            raise TimeoutError(f"key {key!r}: generation still running after "
                               f"{timeout} s") from None

    async def signal(self, key: Hashable, sig: int) -> bool:
        """As :meth:`Supervisor.signal` (in order with the calls made before it)."""
        return await self._run(functools.partial(self._sync.signal, key, sig))

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

    def events(self) -> AsyncIterator[AnyEvent]:
        """Every event in order; ends once the supervisor is closed and drained.

        Beside ``on_event``, from this call on (not from the first iteration: a
        stream taken before a start has that start's events), until the iterator is
        closed (``break`` out of ``async for``, ``aclose()``): what it left unread is
        dropped then, and nothing is kept until the next call.

        Output not yet yielded is bounded per key (``output_buffer``): beyond it the
        oldest is dropped, and counted in ``dropped`` (see :class:`Event`)."""
        self._queueing = True
        self._readers += 1
        ended = False

        def gone() -> None:  # closed, or dropped without a first step (no finally then)
            nonlocal ended
            if not ended:
                ended = True
                self._readers -= 1
                if self._user is not None and self._readers == 0:
                    self._forget_unread()

        stream = self._events(gone)
        weakref.finalize(stream, gone).atexit = False
        return stream

    async def _events(self, gone: Callable[[], None]) -> AsyncIterator[AnyEvent]:
        try:
            while True:
                slot = await self._queue.get()
                if slot is None:
                    self._queue.put_nowait(_END)  # a second iterator ends too
                    return
                ev = slot.event
                if ev is None:  # dropped, and counted in a later event of its generation
                    continue
                if slot.held:
                    self._yielded(slot, ev)
                slot.consume()
                yield typed(ev)
        finally:
            gone()

    def _forget_unread(self) -> None:
        """Beside on_event, with no events() left: keep nothing for nobody."""
        self._queueing = False
        ended = False
        while not self._queue.empty():
            slot = self._queue.get_nowait()
            ended |= slot is None
            if slot is not None:
                slot.consume()
        if ended:
            self._queue.put_nowait(_END)
        self._unread.clear()
        self._unread_size.clear()

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

    def _output_from_thread(self, out: Output) -> None:
        """A generation's output waits (a token: its bytes stay in the key's bounded
        buffer until the loop takes them, so a busy loop holds no more than that)."""
        try:
            self._loop.call_soon_threadsafe(self._take_output, out)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            pass

    def _take_output(self, out: Output) -> None:
        evs = output_events(out)
        for ev in evs:
            self._deliver(ev, out)
        if evs:
            last = evs[-1]
            out.delivered((last.offset or 0) + len(last.data or b""))

    def _deliver(self, event: Event, out: Optional[Output] = None) -> None:
        if self._user is not None:
            try:
                self._user(typed(event))
            except Exception:
                asyncio.get_running_loop().call_exception_handler(
                    {"message": f"on_event raised for {event.kind} of {event.key!r}"})
        if not self._queueing:
            if out is not None:
                out.consumed(len(event.data or b""))  # delivered: the key reads on
            return
        slot = _Slot(event, out)
        self._queue.put_nowait(slot)
        if event.kind == "output" and event.data and out is not None and out.bound.drop:
            self._hold(slot, event)

    def _hold(self, slot: _Slot, event: Event) -> None:
        """Count an output event against its key's bound; past it, drop the key's
        oldest unread bytes (each drop counted to its own generation)."""
        key = event.key
        unread = self._unread.setdefault(key, collections.deque())
        unread.append(slot)
        slot.held = True
        size = self._unread_size.get(key, 0) + len(event.data or b"")
        while size > self._limit:
            first = unread[0]
            old = first.event
            assert old is not None and old.data is not None
            cut = min(len(old.data), size - self._limit)
            size -= cut
            if first.out is not None:
                first.out.consumed(cut)  # gone for good: no longer in the key's pace
            if cut < len(old.data):
                first.event = dataclasses.replace(old, data=old.data[cut:],
                                                  dropped=old.dropped + cut,
                                                  offset=(old.offset or 0) + cut)
                break
            # All of it: what it counted goes to the next unread output of the same
            # generation, or stays in its place as an event without data (before the
            # generation's exited, which comes after it in the queue).
            unread.popleft()
            first.held = False
            nxt = unread[0].event if unread else None
            if nxt is not None and nxt.generation == old.generation:
                unread[0].event = dataclasses.replace(nxt, dropped=nxt.dropped + old.dropped
                                                      + cut)
                first.event = None
            else:
                first.event = dataclasses.replace(old, data=b"", dropped=old.dropped + cut,
                                                  offset=(old.offset or 0) + cut)
        self._unread_size[key] = size

    def _yielded(self, slot: _Slot, event: Event) -> None:
        key = event.key
        unread = self._unread[key]
        assert unread[0] is slot
        unread.popleft()
        slot.held = False
        if unread:
            self._unread_size[key] -= len(event.data or b"")
        else:
            del self._unread[key]
            del self._unread_size[key]


class _Slot:
    """An event's place in the queue for events(); the loop may still cut its data
    (``held``: counted against its key's bound) or empty it (event None)."""

    __slots__ = ("event", "held", "out")

    def __init__(self, event: Event, out: Optional[Output] = None) -> None:
        self.event: Optional[Event] = event
        self.held = False
        self.out = out  # an output event's generation: told when it is consumed

    def consume(self) -> None:
        """The event is yielded (or dropped for good): its bytes leave the key's pace."""
        out, self.out = self.out, None
        ev = self.event
        if out is not None and ev is not None:
            out.consumed(len(ev.data or b""))
