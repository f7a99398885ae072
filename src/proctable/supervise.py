"""The supervisor layer: generation-safe slots, ordered events, a restart policy.

Rules this module keeps (each one a bug seen in a real supervisor):

- Every start of a key stamps a new generation (per key, only ever increasing,
  never reset, also not by ``remove``) on the slot before any callback is wired.
  An exit is acted on only through the slot object it was wired to, so a late
  exit of a superseded or removed process can never be taken for the current
  one's, even after the current one has exited and gone. Late events go to the
  ``proctable.supervise`` debug log with their generation.
- Per key, exactly one ``exited`` per process, after its ``created`` and before
  any ``deleted``; stopping a running process reports ``exited(killed)``.
- Every wait is bounded: stopping is a lineage teardown bounded by grace and
  kill timeout.

Threads: the exit watcher's thread only enqueues; one control thread acts on
exits, timeouts and restarts; one dispatch thread calls ``on_event`` for every
event, one at a time, in order. ``on_event`` may call back into the supervisor
(for example ``start`` the same key again).
"""

from __future__ import annotations

import logging
import queue
import subprocess
import threading
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ._policy import Counters, RestartPolicy, decide
from ._status import ExitStatus
from .errors import NoSuchProcess, ProctableError, TeardownError
from .exits import ExitWatcher
from .lineage import Lineage
from .table import Identity

__all__ = ["Event", "RestartPolicy", "Supervisor"]

log = logging.getLogger("proctable.supervise")

_KINDS = ("created", "exited", "restarting", "gave_up", "deleted")


@dataclass(frozen=True)
class Event:
    """One lifecycle event of a key.

    ``kind``: created, exited, restarting, gave_up or deleted. ``generation``
    is the key's start count that the event belongs to. For ``exited``:
    ``status`` is ``exited`` (it ended with a code), ``signaled`` (a signal we
    did not send), ``killed`` (we stopped it) or ``timeout`` (its ``timeout``
    ran out), and ``exit`` the ExitStatus (None where it could not be read).
    ``restarting`` and ``gave_up`` carry a ``reason``.
    """

    kind: str
    key: Hashable
    generation: int
    identity: Optional[Identity]
    status: Optional[str] = None
    exit: Optional[ExitStatus] = None
    reason: Optional[str] = None
    time: float = field(default_factory=time.time)


@dataclass
class _Slot:
    key: Hashable
    generation: int
    args: Optional[Sequence[str]]
    policy: Optional[RestartPolicy]
    popen_kwargs: dict[str, Any]
    timeout: Optional[float]
    counters: Counters
    lineage: Optional[Lineage] = None
    identity: Optional[Identity] = None
    future: Optional[Future[ExitStatus]] = None
    process: Optional[subprocess.Popen[Any]] = None  # ours to reap (None when adopted)
    started: float = 0.0
    stop_reason: Optional[str] = None   # "killed" or "timeout", set before any signal
    exited: bool = False                # the one exited event has been emitted
    timer: Optional[threading.Timer] = None


class Supervisor:
    """Runs processes under keys; see the module docs for the guarantees.

    ``grace`` and ``kill_timeout`` bound every stop (SIGTERM, wait, SIGKILL,
    wait), ``mode`` is the lineage backend (see :class:`proctable.Lineage`).
    """

    def __init__(self, on_event: Optional[Callable[[Event], object]] = None, *,
                 grace: float = 3.0, kill_timeout: float = 3.0, mode: str = "auto") -> None:
        self._on_event = on_event
        self._grace = grace
        self._kill_timeout = kill_timeout
        self._mode = mode
        self._lock = threading.RLock()
        self._key_locks: dict[Hashable, threading.RLock] = {}
        self._slots: dict[Hashable, _Slot] = {}
        self._generations: dict[Hashable, int] = {}
        self._closed = False
        self._watcher = ExitWatcher()
        self._events: queue.Queue[Optional[Event]] = queue.Queue()
        self._work: queue.Queue[Optional[tuple[str, _Slot, Any]]] = queue.Queue()
        self._dispatcher = threading.Thread(target=self._dispatch_loop,
                                            name="proctable-supervisor-events", daemon=True)
        self._controller = threading.Thread(target=self._control_loop,
                                            name="proctable-supervisor-control", daemon=True)
        self._dispatcher.start()
        self._controller.start()

    # --- public API ---------------------------------------------------------

    def start(self, key: Hashable, args: Sequence[str], restart: Optional[RestartPolicy] = None,
              timeout: Optional[float] = None, **popen_kwargs: Any) -> Identity:
        """Start args under key. If the key runs already, its process and lineage
        are stopped first (``exited(killed)``) and this is a new generation."""
        args = _check_args(args)
        _check_policy(restart)
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
        with self._key_lock(key):
            self._check_open()
            self._stop_current(key, "killed")
            slot = self._new_slot(key, args, restart, timeout, popen_kwargs, Counters())
            self._launch(slot, None)
            assert slot.identity is not None
            return slot.identity

    def adopt(self, key: Hashable, identity: Identity, restart: Optional[RestartPolicy] = None,
              args: Optional[Sequence[str]] = None) -> Identity:
        """Take over a process started earlier (for example before this supervisor
        restarted), with its whole lineage, under key.

        The restart policy and its ``fresh`` factory apply to it as to a started
        one; ``args`` are the original args for a crash recovery (without them a
        crash ends the key with ``gave_up``). Budgets start afresh with every
        adoption: counts of earlier supervisors are not known here.
        """
        if not isinstance(identity, Identity):
            raise TypeError(f"adopt takes an Identity, not {type(identity).__name__}")
        _check_policy(restart)
        if args is not None:
            args = _check_args(args)
        with self._key_lock(key):
            self._check_open()
            self._stop_current(key, "killed")
            slot = self._new_slot(key, args, restart, None, {}, Counters())
            self._launch(slot, identity)
            assert slot.identity is not None
            return slot.identity

    def stop(self, key: Hashable, grace: Optional[float] = None) -> Optional[ExitStatus]:
        """Stop key's process and its whole lineage, keeping the key.

        Returns the exit status (None if it had exited already or is unreadable).
        Raises KeyError for an unknown key.
        """
        with self._key_lock(key):
            with self._lock:
                slot = self._slots.get(key)
                if slot is None:
                    raise KeyError(key)
            return self._stop_slot(slot, "killed", grace)

    def remove(self, key: Hashable, grace: Optional[float] = None) -> None:
        """Stop key if it runs (``exited(killed)``), then delete it (``deleted``).

        The key's generation counter is kept: a later start of the same key is a
        newer generation. Raises KeyError for an unknown key.
        """
        with self._key_lock(key):
            with self._lock:
                slot = self._slots.get(key)
                if slot is None:
                    raise KeyError(key)
            self._stop_slot(slot, "killed", grace)
            with self._lock:
                if self._slots.get(key) is slot:  # compare and delete
                    del self._slots[key]
                    self._emit(Event("deleted", key, slot.generation, slot.identity))

    def close(self, grace: Optional[float] = None) -> None:
        """Stop every key (each bounded by grace and kill timeout), then stop the
        supervisor's threads once the events so far are delivered."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            keys = list(self._slots)
        for key in keys:
            try:
                with self._key_lock(key):
                    slot = self._slots.get(key)
                    if slot is not None:
                        self._stop_slot(slot, "killed", grace)
            except ProctableError as exc:
                log.warning("stopping %r on close: %s", key, exc)
        self._work.put(None)
        if threading.current_thread() is not self._controller:
            self._controller.join(timeout=self._grace + self._kill_timeout + 5)
        self._events.put(None)
        if threading.current_thread() is not self._dispatcher:
            self._dispatcher.join(timeout=10)
        self._watcher.close()

    def generation(self, key: Hashable) -> int:
        """The key's current generation (0 if it never started)."""
        with self._lock:
            return self._generations.get(key, 0)

    def running(self, key: Hashable) -> bool:
        """True while key's current process has not exited."""
        with self._lock:
            slot = self._slots.get(key)
            return slot is not None and not slot.exited

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._slots

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._slots)

    def lineage(self, key: Hashable) -> Optional[Lineage]:
        """The lineage of key's current process, or None."""
        with self._lock:
            slot = self._slots.get(key)
            return None if slot is None else slot.lineage

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ProctableError("this Supervisor is closed")

    def _key_lock(self, key: Hashable) -> threading.RLock:
        with self._lock:
            lk = self._key_locks.get(key)
            if lk is None:
                lk = self._key_locks[key] = threading.RLock()
            return lk

    def _emit(self, event: Event) -> None:
        # Called with self._lock held, so events of one key queue in order.
        self._events.put(event)

    def _new_slot(self, key: Hashable, args: Optional[Sequence[str]],
                  policy: Optional[RestartPolicy], timeout: Optional[float],
                  popen_kwargs: dict[str, Any], counters: Counters) -> _Slot:
        with self._lock:
            gen = self._generations.get(key, 0) + 1
            self._generations[key] = gen
        return _Slot(key, gen, args, policy, dict(popen_kwargs), timeout, counters)

    def _launch(self, slot: _Slot, adopt: Optional[Identity]) -> None:
        """Start (or adopt) slot's process, then wire its exit (key lock held)."""
        if adopt is None:
            assert slot.args is not None
            lin = Lineage.spawn(list(slot.args), mode=self._mode, **slot.popen_kwargs)
            # The command's identity (lin.process may be the lineage's own reaper,
            # whose exit mirrors the command's).
            ident = lin.root
            if ident is None:  # never a made-up start time: say it is gone
                lin.terminate(grace=0.0, kill_timeout=self._kill_timeout)
                raise NoSuchProcess(lin.process.pid, "the started process is gone already")
            target: Any = lin.process
            slot.process = lin.process
        else:
            lin = Lineage(adopt)
            ident = adopt
            target = adopt
        slot.lineage = lin
        slot.identity = ident
        slot.started = time.monotonic()
        with self._lock:
            self._slots[slot.key] = slot
            self._emit(Event("created", slot.key, slot.generation, ident))
        # The generation is on the slot before the callback is wired: the callback
        # can only ever act on this slot.
        fut = self._watcher.watch(target)
        slot.future = fut

        def on_done(f: Future[ExitStatus], s: _Slot = slot) -> None:
            self._work.put(("exit", s, f))  # only enqueue: never block the watcher thread

        fut.add_done_callback(on_done)
        if slot.timeout is not None:
            t = threading.Timer(slot.timeout, lambda s=slot: self._work.put(("timeout", s, None)))
            t.daemon = True
            slot.timer = t
            t.start()

    def _stop_current(self, key: Hashable, reason: str) -> None:
        with self._lock:
            old = self._slots.get(key)
        if old is not None:
            self._stop_slot(old, reason, None)

    def _stop_slot(self, slot: _Slot, reason: str, grace: Optional[float]) -> Optional[ExitStatus]:
        """Tear down slot's lineage and emit its one exited event (key lock held)."""
        with self._lock:
            if slot.exited:
                return None
            if slot.stop_reason is None:
                slot.stop_reason = reason
            if slot.timer is not None:
                slot.timer.cancel()
        g = self._grace if grace is None else grace
        self._teardown(slot, g)
        status = self._collect(slot, self._kill_timeout + 1.0)
        with self._lock:  # re-check: the control thread may have emitted meanwhile
            if not slot.exited:
                slot.exited = True
                self._emit(Event("exited", slot.key, slot.generation, slot.identity,
                                 status=slot.stop_reason, exit=status))
        return status

    def _teardown(self, slot: _Slot, grace: float) -> None:
        lin = slot.lineage
        if lin is None:
            return
        try:
            lin.terminate(grace=grace, kill_timeout=self._kill_timeout)
        except TeardownError as exc:
            log.error(  # noqa: TRY400 - the survivors are the message, not a traceback
                "key %r generation %d: %s (survivors: %s)", slot.key, slot.generation,
                exc, exc.survivors)
        except ProctableError as exc:  # e.g. torn down already
            log.debug("key %r generation %d teardown: %s", slot.key, slot.generation, exc)
        proc = slot.process
        if proc is not None:  # our own child: reap it (bounded), the watcher never does
            try:
                proc.wait(timeout=1.0)
            except Exception as exc:
                log.debug("key %r generation %d: reaping: %r", slot.key, slot.generation, exc)

    @staticmethod
    def _collect(slot: _Slot, timeout: float) -> Optional[ExitStatus]:
        fut = slot.future
        if fut is None:
            return None
        try:
            return fut.result(timeout=timeout)
        except Exception as exc:  # the status cannot be read; say so, do not invent it
            log.debug("key %r generation %d: no exit status (%r)", slot.key, slot.generation, exc)
            return None

    def _control_loop(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            what, slot, arg = item
            try:
                if what == "exit":
                    self._on_exit(slot)
                elif what == "timeout":
                    with self._key_lock(slot.key):
                        self._stop_slot(slot, "timeout", None)
                elif what == "restart":
                    self._restart(slot, arg)
            except Exception:  # keep supervising the other keys
                log.exception("supervisor control thread: %s of %r failed", what, slot.key)

    def _on_exit(self, slot: _Slot) -> None:
        with self._key_lock(slot.key):
            with self._lock:
                if slot.exited:
                    log.debug("late exit of %r generation %d (current %d) dropped",
                              slot.key, slot.generation, self._generations.get(slot.key, 0))
                    return
                if slot.timer is not None:
                    slot.timer.cancel()
            status = self._collect(slot, 1.0)
            uptime = time.monotonic() - slot.started
            # The root ended on its own: what it left behind goes too (bounded).
            self._teardown(slot, self._grace)
            with self._lock:
                if _already_exited(slot):  # stop() may have emitted during the teardown
                    return
                slot.exited = True
                kind = slot.stop_reason or (
                    "signaled" if status is not None and status.signal is not None else "exited")
                self._emit(Event("exited", slot.key, slot.generation, slot.identity,
                                 status=kind, exit=status))
                if slot.stop_reason is not None or self._slots.get(slot.key) is not slot:
                    return
                if slot.policy is None or self._closed:
                    return
                d = decide(slot.policy, slot.counters, status, uptime)
                if d.action == "give_up":
                    self._emit(Event("gave_up", slot.key, slot.generation, slot.identity,
                                     reason=d.reason))
                    return
                args: Optional[Sequence[str]] = slot.args
                reason = d.reason
                if d.action == "fresh" and slot.policy.fresh is not None:
                    args = None  # asked of the factory below, outside the lock
                elif d.action == "recover" and args is None:
                    self._emit(Event("gave_up", slot.key, slot.generation, slot.identity,
                                     reason=f"{d.reason}, but the original args are unknown "
                                     "(adopted without args)"))
                    return
            if d.action == "fresh" and slot.policy.fresh is not None:
                fresh: Optional[list[str]] = None
                stop_reason = "the fresh factory said stop"
                try:
                    answer = slot.policy.fresh(slot.key)
                    fresh = None if answer is None else _check_args(answer)
                except Exception as exc:
                    stop_reason = f"the fresh factory failed: {exc!r}"
                with self._lock:
                    if self._slots.get(slot.key) is not slot:  # re-check after user code
                        return
                    if fresh is None:
                        self._emit(Event("gave_up", slot.key, slot.generation, slot.identity,
                                         reason=stop_reason))
                        return
                args = fresh
            with self._lock:
                self._emit(Event("restarting", slot.key, slot.generation, slot.identity,
                                 reason=reason))
            payload = (list(args) if args is not None else None, d.counters)
            delay = slot.policy.delay
        if delay > 0:
            t = threading.Timer(delay, lambda: self._work.put(("restart", slot, payload)))
            t.daemon = True
            t.start()
        else:
            self._restart(slot, payload)

    def _restart(self, slot: _Slot, payload: tuple[Optional[list[str]], Counters]) -> None:
        args, counters = payload
        with self._key_lock(slot.key):
            with self._lock:
                # Removed, superseded by a start() meanwhile, or closed: do nothing.
                if self._closed or self._slots.get(slot.key) is not slot:
                    log.debug("restart of %r generation %d dropped: no longer current",
                              slot.key, slot.generation)
                    return
            new = self._new_slot(slot.key, args, slot.policy, slot.timeout, slot.popen_kwargs,
                                 counters)
            try:
                self._launch(new, None)
            except (OSError, ProctableError) as exc:
                with self._lock:
                    self._emit(Event("gave_up", slot.key, new.generation, None,
                                     reason=f"could not start {args!r}: {exc}"))

    def _dispatch_loop(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            log.debug("event %s %r generation %d", event.kind, event.key, event.generation)
            if self._on_event is None:
                continue
            try:
                self._on_event(event)
            except Exception:  # a failing callback must not stop the next event
                log.exception("on_event raised for %s of %r", event.kind, event.key)


def _already_exited(slot: _Slot) -> bool:
    # A function, so that the re-check after a wait is not narrowed away.
    return slot.exited


def _check_args(args: object) -> list[str]:
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence) or not args:
        raise TypeError("args must be a non-empty list of strings, e.g. ['sleep', '5']")
    out = [str(a) if isinstance(a, str) else a for a in args]
    if not all(isinstance(a, (str, bytes)) for a in out):
        raise TypeError("every arg must be a str or bytes")
    return list(out)


def _check_policy(policy: object) -> None:
    if policy is not None and not isinstance(policy, RestartPolicy):
        raise TypeError(f"restart must be a RestartPolicy or None, not {type(policy).__name__}")
