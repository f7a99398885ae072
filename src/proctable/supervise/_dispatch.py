"""The events' thread: what a supervisor emits reaches its consumer in the order it was
emitted, one item at a time, on a thread of its own.

The queue holds lifecycle :class:`Event` s, a generation's :class:`Output` (its
buffered bytes, turned into ``output`` events when their turn comes, so that a
consumer's pace is the key's pace), and markers: a flush's ``threading.Event``, a
call to run after everything queued before it, and ``None`` to end. A consumer that
raises (even ``SystemExit``) does not end the events; a turn that fails is reported
and the next item comes.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Hashable
from typing import Callable, NamedTuple, Optional

from .._output import Output
from .._threads import start_thread
from ._event import AnyEvent, Event, typed

log = logging.getLogger("proctable.supervise")


def output_events(out: Output) -> list[Event]:
    """What waits in a generation's buffer, taken, as its ``output`` events."""
    return [Event("output", out.key, out.generation, out.identity, stream=stream, data=data,
                  dropped=dropped, offset=offset)
            for stream, data, dropped, offset in out.take()]


class _AfterEvents(NamedTuple):
    """In the queue: call fn when the thread gets here."""

    fn: Callable[[], object]


class Dispatch:
    """The queue and its thread. ``on_event`` gets each event (typed); ``output_sink``,
    where given, takes each :class:`Output` instead of it being turned into events
    here (the asyncio face takes them on its loop); ``on_exited`` sees an ``exited``
    just before the consumer does; ``fault`` hears of a turn that failed.

    :meth:`start` raises ``NoThread`` where no thread can start."""

    def __init__(self, on_event: Optional[Callable[[AnyEvent], object]],
                 output_sink: Optional[Callable[[Output], None]],
                 on_exited: Callable[[Event], None],
                 fault: Callable[[BaseException, str, Hashable], None]) -> None:
        self._on_event = on_event
        self._output_sink = output_sink
        self._on_exited = on_exited
        self._fault = fault
        self._queue: queue.Queue[object] = queue.Queue()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = start_thread(self._loop, "proctable-supervisor-events")

    def put(self, item: object) -> None:
        """Queue an event, an :class:`Output` whose bytes are ready, or a marker."""
        self._queue.put(item)

    def after(self, fn: Callable[[], object]) -> None:
        """Call fn on the thread once everything queued before it went out."""
        self._queue.put(_AfterEvents(fn))

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def flush(self, timeout: float) -> bool:
        """Wait (at most timeout) until everything queued so far went out; False on
        timeout or when called on the thread itself (it would wait for itself)."""
        if self.on_thread():
            return False
        if not self.alive():
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def end(self, wait: float = 10.0) -> None:
        """End the thread after what is queued; wait for it (bounded), unless on it."""
        self._queue.put(None)
        self.join(wait)

    def join(self, wait: float = 10.0) -> None:
        if self._thread is not None and not self.on_thread():
            self._thread.join(timeout=wait)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._turn(item)
            except Exception as exc:  # a failed turn is said, and the next item comes
                key = getattr(item, "key", None)
                self._fault(exc, f"dispatching {type(item).__name__} failed; the events "
                            "go on", key)

    def _turn(self, item: object) -> None:
        if isinstance(item, threading.Event):
            item.set()
            return
        if isinstance(item, _AfterEvents):
            item.fn()
            return
        if isinstance(item, Output):  # what a generation wrote, read so far
            if self._output_sink is not None:
                self._output_sink(item)
                return
            evs = output_events(item)
            for ev in evs:
                self._deliver(ev)
                item.consumed(len(ev.data or b""))  # the key's pace: read on
            if evs:
                last = evs[-1]
                item.delivered((last.offset or 0) + len(last.data or b""))
            return
        assert isinstance(item, Event)
        log.debug("event %s %r generation %d", item.kind, item.key, item.generation)
        if item.kind == "exited":
            self._on_exited(item)  # after its teardown, in the events' order
        self._deliver(item)

    def _deliver(self, item: Event) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(typed(item))
        except BaseException:  # even sys.exit() there must not end the events
            log.exception("on_event raised for %s of %r", item.kind, item.key)
