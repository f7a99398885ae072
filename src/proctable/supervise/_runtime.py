"""The supervisor's runtime: it feeds each key's machine and carries out its actions.

The decisions are all in ``_machine.py``; this module only has threads and I/O:

- the caller's thread feeds its call and waits for the machine's answer. The
  answer goes to a future that is running from the start, so it cannot be
  cancelled: a caller that stops waiting (a timeout, a cancelled task) leaves
  the call to go on in the background, and nothing the machine does next
  depends on anyone still waiting;
- one worker thread per launch, per teardown and per call of a restart's
  ``fresh`` factory: an idle one (kept for 2 s after its last job) or a new one,
  never one that is busy. The machine has at most one launch or teardown in
  flight per key, so a slow teardown delays only its own key, and ``close()``
  tears every key down side by side; it waits for no factory, so a factory that
  blocks (or calls back into the supervisor) holds only its worker;
- one timer thread for every key's restart delays and timeouts; a timer only
  feeds an input, so timers of other keys fire on time;
- the exit watcher's thread (``ExitWatcher``), whose callbacks only feed;
- one dispatch thread (``_dispatch.Dispatch``) that calls ``on_event`` for every
  event, one at a time, in the order the machines emitted them. ``on_event`` may
  call back into the supervisor: nothing the supervisor does waits for the
  dispatch thread;
- one output reader thread (``_output.Reader``, started with the first owned
  output) that reads every key's owned fds into the generation's bounded buffer
  and puts a token for it in the event queue; the dispatch thread turns what
  waits into ``output`` events when it reaches the token.

Output ordering: a generation's output goes live when its ``created`` is queued,
so none comes before it. Its ``exited`` (and anything of the key after it) is
held back while the key's teardown runs (or the generation's output is still
open), whatever the output mode; the teardown worker, once every member is
proven gone, drains the fds without blocking, closes them, queues a last token
and then releases what was held. So every teardown comes before its ``exited``,
every byte of a generation before it too, and none after.

Every feed runs under one lock and takes microseconds; launches, teardowns and
the answers to callers are carried out after the lock is released, each on its
own: one that fails is logged and never keeps the others from being carried out.

A key that is removed leaves only its generation number behind (an int, so that
a later start of the key is a newer generation); its machine is dropped.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import logging
import os
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from typing import Any, Callable, NamedTuple, Optional, Union, overload

from .. import _ended
from .._output import Bound, KeptOutput, Output, Reader, Tail, grow_pipe, set_winsize
from .._pidfd import features, signal_pinned
from .._status import ExitStatus
from .._threads import NoThread, Workers, start_thread
from ..errors import (
    AccessDenied,
    GenerationEnded,
    InputBlocked,
    NoInput,
    NoSuchKey,
    NoSuchProcess,
    ProctableError,
    StartCancelled,
    SupervisorClosed,
    TeardownError,
    WatcherClosed,
)
from ..exits import ExitWatcher
from ..exits._target import _pin
from ..lineage import Lineage, LineageClosed
from ..table import Identity, identity
from ._checks import (
    _MAX_SECONDS,
    _check_args,
    _check_io,
    _check_key,
    _check_policy,
    _check_size,
    _check_timeout,
    _seconds,
    _size,
)
from ._dispatch import Dispatch
from ._durable import (
    Ghost,
    Session,
    Sessions,
    StateDir,
    Unanswered,
    check_key,
    check_popen,
    popen_from_record,
)
from ._event import AnyEvent, Event
from ._health import Fault, Faults
from ._machine import (
    Action,
    AskFresh,
    CancelTimer,
    Close,
    Emit,
    Exited,
    Failure,
    Fresh,
    FreshFailed,
    Input,
    Launch,
    Launched,
    LaunchFailed,
    Machine,
    MachineError,
    Remove,
    Reply,
    RootExit,
    SetTimer,
    Spec,
    Start,
    State,
    Stop,
    Teardown,
    TeardownDone,
    TeardownFailed,
    TimerFired,
    Watch,
)
from ._policy import RestartPolicy
from ._timers import _Timers

__all__ = ["Replay", "Supervisor"]

log = logging.getLogger("proctable.supervise")

_MODES = ("auto", "cgroup", "subreaper", "scan")
_SLACK = 300.0  # a call waits at most its teardown bounds plus this: a safety net for bugs


class _Record:
    """The I/O side of a key's current lineage (the machine holds none of it)."""

    __slots__ = ("ended", "future", "lineage", "output", "process", "resume_stop",
                 "resume_timeout", "resumed", "session", "target", "tearing")

    def __init__(self, lineage: Lineage, target: Any, process: Any,
                 output: Optional[Output] = None, session: Optional[Session] = None,
                 resumed: Optional[int] = None) -> None:
        self.lineage = lineage
        self.target = target      # what the exit watcher watches: the Popen, or the Identity
        self.process = process    # our own child (spawned), or None (adopted)
        self.output = output      # the generation's owned fds, or None
        self.session = session    # a durable session (its keeper's connection), or None
        self.resumed = resumed    # the generation of a session re-adopted after a restart
        self.resume_timeout: Optional[float] = None  # what is left of its timeout
        self.resume_stop: Optional[str] = None  # its stop that was under way, to finish
        self.tearing = False  # a teardown of it was handed to a worker
        self.future: Optional[Future[ExitStatus]] = None
        self.ended: Optional[int] = None  # the ticket of the last teardown that reached its end


class Replay(NamedTuple):
    """What ``tail(key, since=OFFSET)`` gives: ``data``, the bytes of ``generation``'s
    output from ``offset`` on, and ``dropped``, how many between ``since`` (what was
    asked for) and ``offset`` are no longer kept. ``end`` is where the bytes end (the
    offset of the next output event, when nothing more was written since)."""

    generation: int
    since: int
    offset: int
    data: bytes

    @property
    def dropped(self) -> int:
        return self.offset - self.since

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


class _Waiter(NamedTuple):
    future: Future[Any]
    key: Hashable
    input: Input


class Supervisor:
    r"""Runs processes under keys and reports what happens to them as events.

    ``on_event(event)`` is called for every :class:`Event`, one at a time, in
    order, on the supervisor's dispatch thread; it may call back into the
    supervisor. ``grace`` and ``kill_timeout`` bound every teardown (SIGTERM,
    wait, SIGKILL, wait); ``mode`` is the lineage backend (see
    :class:`proctable.Lineage`). ``output_buffer`` bounds, per key, the owned
    output read but not yet delivered, over all the key's generations together
    (beyond it the oldest bytes are dropped, and counted in the ``dropped`` of the
    next output event of the generation that wrote them); ``tail_size`` is how much of each
    key's output ``tail()`` keeps; ``write_timeout`` bounds every ``write()``.
    See the README for the guarantees.

    ``state_dir`` makes every key durable (docs/supervisor.md, "Durable sessions"):
    each session is kept by a native helper that outlives this supervisor (killed,
    crashed, or :meth:`detach`\ ed), and a new supervisor on the same directory
    re-adopts every surviving session before its constructor returns (an
    ``adopted`` event each, then what happened meanwhile), or with
    ``on_adopt="stop"`` tears each one down with proof. ``ring_size`` is how much
    of each session's output its helper keeps (for ``tail(since=)`` and for the
    next supervisor), ``orphan_timeout`` how long a session may go without a
    supervisor before its helper ends it (None: for ever), ``session_cgroup`` a
    cgroup v2 directory (delegated, outside a service's own) where the sessions
    live, and ``restart_for(key, recorded)`` the restart policy of a re-adopted
    key (by default the one recorded at its start, without its ``fresh``
    factory, which is code).
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
                 _output_sink: Optional[Callable[[Output], None]] = None) -> None:
        self._output_buffer = _size(output_buffer, "output_buffer")
        self._tail_size = _size(tail_size, "tail_size")
        self._write_timeout = _seconds(write_timeout, "write_timeout")
        self._grace = _seconds(grace, "grace")
        self._kill_timeout = _seconds(kill_timeout, "kill_timeout")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}, not {mode!r}")
        if on_event is not None and not callable(on_event):
            raise TypeError("on_event must be a callable taking the event, or None, "
                            f"not {type(on_event).__name__}")
        self._mode = mode
        self._lock = threading.Lock()
        self._machines: dict[Hashable, Machine] = {}
        self._retired: dict[Hashable, int] = {}  # removed keys: their last generation
        self._tickets_seq = itertools.count(1).__next__  # every machine's tickets
        self._records: dict[Hashable, _Record] = {}
        self._waiters: dict[int, _Waiter] = {}
        self._tokens = itertools.count(1)
        self._closed = False
        self._shut = False
        self._faults = Faults()
        self._workers = Workers("proctable-supervisor-idle")
        self._watcher = ExitWatcher()
        # Every event and output, in the order emitted, to on_event on its own thread.
        # An output_sink takes output tokens instead of their being taken there (the
        # asyncio face takes them on its loop, so that what its reader has not taken
        # stays bounded); given to the constructor, as a durable one's re-adoption
        # emits in it.
        self._events = Dispatch(on_event, _output_sink,
                                lambda ev: self._exited_for_wait(ev.key, ev),
                                lambda exc, what, key: self._fault("events", exc, what, key))
        self._reader = Reader("proctable-supervisor-output", self._reader_fault)
        self._tails: dict[Hashable, Tail] = {}
        self._last_input: dict[Hashable, tuple[float, bytes]] = {}  # last_input()
        self._bounds: dict[Hashable, Bound] = {}  # per key, over all its generations
        # The bounds of removed keys whose output is not all delivered yet: a start of
        # the key takes its bound back (one bound per key, across remove()); forgotten
        # with their last buffer.
        self._parked_bounds: weakref.WeakValueDictionary[Hashable, Bound] = (
            weakref.WeakValueDictionary())
        self._held: dict[Hashable, list[Event]] = {}  # events after an exited whose output is open
        self._detached = False
        self._durable: Optional[Sessions] = None
        # Durable keys whose session runs but whose keeper did not answer: never
        # forgotten; a start of them is refused, a stop, remove or close ends them.
        self._unanswered: dict[str, Any] = {}
        self._restart_for = restart_for
        self.adoption_problems: list[str] = []
        if state_dir is not None:
            self._durable = _open_durable(state_dir, mode, on_adopt, ring_size, orphan_timeout,
                                          session_cgroup, restart_for)
        elif on_adopt != "keep" or ring_size != 1 << 20 or orphan_timeout is not None \
                or session_cgroup is not None or restart_for is not None:
            raise ValueError("on_adopt, ring_size, orphan_timeout, session_cgroup and "
                             "restart_for are for a durable supervisor: pass state_dir too")
        # wait(): each key's last exited (generation, exit), and the waits for one to come.
        self._exits: dict[Hashable, tuple[int, Optional[ExitStatus]]] = {}
        self._exit_waits: dict[Hashable, list[tuple[int, Future[Optional[ExitStatus]]]]] = {}
        # NoThread where none can start (RLIMIT_NPROC, clone3 denied): a supervisor
        # without its threads cannot keep a single promise, so it says so at once.
        try:
            self._timers = _Timers(self._timer_fired, self._timer_fault)
        except BaseException:
            if self._durable is not None:
                self._durable.close()
            raise
        try:
            self._events.start()
        except NoThread:
            self._timers.close()
            if self._durable is not None:
                self._durable.close()
            raise
        if self._durable is not None:
            self._readopt(on_adopt)

    # --- the calls -----------------------------------------------------------------

    def start(self, key: Hashable, args: Sequence[str], restart: Optional[RestartPolicy] = None,
              timeout: Optional[float] = None, *, output: str = "inherit",
              pty: Optional[tuple[int, int]] = None, drop_output: bool = False,
              **popen_kwargs: Any) -> Identity:
        """Start args under key; the started command's Identity.

        If the key runs already, its process and lineage are stopped first
        (``exited(killed)``) and this is a new generation. A command that cannot
        start raises here (``FileNotFoundError``, ``PermissionError``, as
        subprocess does) and emits nothing. ``SupervisorClosed`` after (or racing)
        ``close()``; ``TeardownError`` if the key's earlier process could not be
        proven gone (the key is then ``failed``: ``stop()`` it to retry).

        ``output="events"``: the supervisor owns the command's stdout and stderr
        and delivers what it writes as ``output`` events. ``pty=(rows, cols)``: the
        command runs on a new pseudo-terminal (its stdin, stdout and stderr, its
        controlling terminal, in a session of its own); output events carry
        ``stream="pty"``, and ``write()``/``resize()`` reach it. ``stdin=subprocess.PIPE``
        gives an owned stdin pipe for ``write()``/``close_stdin()``. Every fd of a
        generation is closed when it ends; ``stdout``/``stderr=PIPE`` are refused.

        Owned output is paced as a pipe paces its writer: while ``output_buffer``
        bytes of the key wait for its consumer (``on_event``, or ``events()``), the
        supervisor stops reading the command's pipe or terminal, and the command
        waits; nothing is dropped. ``drop_output=True`` chooses dropping instead, for
        output nobody must see whole: past the bound the oldest bytes go (counted in
        ``dropped``), and the command never waits.
        """
        result: Identity = self._wait(self.submit_start(key, args, restart, timeout,
                                                        output=output, pty=pty,
                                                        drop_output=drop_output,
                                                        **popen_kwargs))
        return result

    def adopt(self, key: Hashable, identity: Identity, restart: Optional[RestartPolicy] = None,
              args: Optional[Sequence[str]] = None, **popen_kwargs: Any) -> Identity:
        """Take over a process started earlier (for example before this supervisor
        restarted), with its whole lineage, under key.

        The restart policy and its ``fresh`` factory apply to it as to a started
        one; ``args`` (and ``popen_kwargs``) are what a restart runs (without args
        a crash, or a clean exit without ``fresh``, ends the key with ``gave_up``).
        Budgets start afresh with every adoption. ``NoSuchProcess`` if identity is
        gone already.
        """
        result: Identity = self._wait(self.submit_adopt(key, identity, restart, args,
                                                        **popen_kwargs))
        return result

    def stop(self, key: Hashable, grace: Optional[float] = None) -> Optional[ExitStatus]:
        """Stop key's process and its whole lineage, keeping the key; cancels a
        pending restart or timeout, and nothing of the key starts afterwards.

        Returns the root's exit status when this stop ended it (None if nothing
        ran, or the status is unreadable). ``KeyError`` for an unknown key;
        ``TeardownError`` (with ``survivors``) when a member could not be proven
        gone: the key is kept with its lineage, and a later ``stop()`` retries.
        """
        result: Optional[ExitStatus] = self._wait(self.submit_stop(key, grace), grace)
        return result

    def remove(self, key: Hashable, grace: Optional[float] = None) -> None:
        """Stop key if it runs (``exited(killed)``), then delete it (``deleted``).

        The key's generation counter is kept: a later start of the same key is a
        newer generation. ``KeyError`` for an unknown key; ``TeardownError`` as for
        ``stop()``, and then the key is not deleted.
        """
        self._wait(self.submit_remove(key, grace), grace)

    def close(self, grace: Optional[float] = None) -> None:
        """Stop every key, all side by side (about the largest grace, not the sum).

        Every later or concurrent ``start()`` fails with ``SupervisorClosed``, and
        nothing it launched stays running. ``TeardownError`` (with every key's
        survivors) when a teardown failed: those keys keep their lineages, and
        ``close()`` (or ``stop()``) may be called again to retry. Once every key
        is closed, the supervisor's threads end after delivering the events so far.
        """
        g = None if grace is None else _seconds(grace, "grace")
        if self._detached:
            return  # its sessions were left to the next supervisor: nothing to close
        with self._lock:
            self._closed = True  # from here on no Start reaches a machine
            keys = list(self._machines)
            held = list(self._unanswered)
        waits = [(k, self._submit(k, lambda t: Close(t, g))) for k in keys]
        waits += [(k, self._end_held(k, delete=False)) for k in held]
        errors: list[TeardownError] = []
        for _k, fut in waits:
            try:
                self._wait(fut, g)
            except TeardownError as exc:
                errors.append(exc)
        if errors:
            survivors = [p for e in errors for p in e.survivors]
            raise TeardownError("; ".join(str(e) for e in errors), survivors,
                                [e.report for e in errors])
        self._shutdown_if_closed()

    def detach(self) -> None:
        """Leave every durable session running and let this supervisor go: returns at
        once. Each session goes on under its helper (output kept in its ring, its
        exit status kept), for the next supervisor on the same ``state_dir`` to
        re-adopt; the state directory is released. No event comes after this call
        (a start or stop still under way finishes on its own, and the next
        supervisor reports what it finds); every later call raises
        :class:`SupervisorClosed`. ``ProctableError`` on a supervisor without
        ``state_dir`` (its processes cannot outlive it: ``close()`` it)."""
        if self._durable is None:
            raise ProctableError("detach() needs a durable supervisor (state_dir=...): "
                                 "this one's processes cannot outlive it; close() it")
        with self._lock:
            if self._detached:
                return
            self._detached = True
            self._closed = True
            self._shut = True
            records = list(self._records.values())
            self._records.clear()
        for rec in records:
            if not rec.tearing:  # (a teardown under way goes on, on its worker, bounded)
                _let_go(rec, self._reader)
        self._timers.close()
        self._workers.close()
        self._events.end()  # what was emitted before this call is still delivered
        self._reader.close()
        self._watcher.close()
        self._durable.close()

    @property
    def state_dir(self) -> Optional[str]:
        """The state directory of a durable supervisor (None otherwise)."""
        return None if self._durable is None else self._durable.state.path

    # non-blocking forms (the asyncio face awaits these futures)

    def submit_start(self, key: Hashable, args: Sequence[str],
                     restart: Optional[RestartPolicy] = None, timeout: Optional[float] = None,
                     *, output: str = "inherit", pty: Optional[tuple[int, int]] = None,
                     drop_output: bool = False, **popen_kwargs: Any) -> Future[Identity]:
        """start() without waiting: a Future of the Identity (or of the error).

        The future is running from the start: ``cancel()`` returns False, and the
        start goes on whether or not anyone waits for it (the same holds for every
        ``submit_*``)."""
        _check_key(key)
        size = _check_io(output, pty, popen_kwargs)
        if not isinstance(drop_output, bool):
            raise TypeError(f"drop_output must be True or False, not {drop_output!r}")
        spec = Spec(tuple(_check_args(args)), _check_policy(restart), _check_timeout(timeout),
                    dict(popen_kwargs), output=output, pty=size, drop_output=drop_output)
        if self._durable is not None:
            check_key(key)
            check_popen(popen_kwargs)
            if key in self._unanswered:
                raise ProctableError(
                    f"key {key!r} has a session that runs but whose keeper did not answer "
                    "when this supervisor took over: remove() or stop() it to end it "
                    "(or a later supervisor adopts it)")
        return self._submit(key, lambda t: Start(t, spec))

    def submit_adopt(self, key: Hashable, identity: Identity,
                     restart: Optional[RestartPolicy] = None,
                     args: Optional[Sequence[str]] = None,
                     **popen_kwargs: Any) -> Future[Identity]:
        """adopt() without waiting."""
        _check_key(key)
        if not isinstance(identity, Identity):
            raise TypeError(f"adopt takes an Identity, not {type(identity).__name__}")
        if self._durable is not None:
            raise ProctableError("adopt() of a process started elsewhere cannot be durable "
                                 "(no helper keeps it): a durable supervisor re-adopts its own "
                                 "sessions by itself (state_dir)")
        _check_io("inherit", None, popen_kwargs)
        spec = Spec(None if args is None else tuple(_check_args(args)), _check_policy(restart),
                    None, dict(popen_kwargs), adopt=identity)
        return self._submit(key, lambda t: Start(t, spec))

    def submit_stop(self, key: Hashable, grace: Optional[float] = None
                    ) -> Future[Optional[ExitStatus]]:
        """stop() without waiting."""
        g = None if grace is None else _seconds(grace, "grace")
        if key in self._unanswered:
            return self._end_held(key, delete=False)
        return self._submit(key, lambda t: Stop(t, g))

    def submit_remove(self, key: Hashable, grace: Optional[float] = None) -> Future[None]:
        """remove() without waiting."""
        g = None if grace is None else _seconds(grace, "grace")
        if key in self._unanswered:
            return self._end_held(key, delete=True)
        return self._submit(key, lambda t: Remove(t, g))

    def _end_held(self, key: Any, delete: bool) -> Future[Any]:
        """Stop (or remove) a held key: its session ended as a ghost (its keeper did not
        answer at adoption), reported once (exited, deleted), its record cleared."""
        fut: Future[Any] = Future()
        fut.set_running_or_notify_cancel()
        d = self._durable
        assert d is not None

        def run() -> None:
            with self._lock:
                srec = self._unanswered.get(key)
            try:
                if srec is not None:
                    g = d.end_unanswered(srec)
                    with self._lock:
                        if self._unanswered.pop(key, None) is None:
                            srec = None  # (ended by a concurrent call)
                    if srec is not None:
                        self._report_ghost(key, g)
                        d.ended(key, srec.generation, srec.name)
            except BaseException as exc:
                fut.set_exception(exc)
            else:
                fut.set_result(None)
        try:
            start_thread(run, "proctable-supervisor-held")
        except NoThread as exc:
            fut.set_exception(exc)
        return fut

    # --- what a caller may look at -----------------------------------------------------

    def generation(self, key: Hashable) -> int:
        """The key's current generation (0 if it never started; a removed key's last)."""
        with self._lock:
            m = self._machines.get(key)
            return self._retired.get(key, 0) if m is None else m.generation

    def state(self, key: Hashable) -> str:
        """The key's state in the machine: ``running``, ``stopped`` (stopped by a call),
        ``gave_up`` (its restart policy gave up), ``failed``, ... (``gone`` for a key
        that is not here)."""
        with self._lock:
            m = self._machines.get(key)
            return State.GONE.value if m is None else m.state.value

    def running(self, key: Hashable) -> bool:
        """True while key's current process has not been seen to end."""
        with self._lock:
            m = self._machines.get(key)
            return m is not None and m.state in (State.RUNNING, State.STOPPING, State.FAILED)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            m = self._machines.get(key)
            return m is not None and m.state is not State.GONE

    def keys(self) -> list[Hashable]:
        with self._lock:
            return [k for k, m in self._machines.items() if m.state is not State.GONE]

    def lineage(self, key: Hashable) -> Optional[Lineage]:
        """The lineage of key's current process (kept after a failed teardown), or None."""
        with self._lock:
            rec = self._records.get(key)
            return None if rec is None else rec.lineage

    # --- a key's input and output ------------------------------------------------------

    def write(self, key: Hashable, data: bytes) -> int:
        """Write data to key's pty or owned stdin pipe; the number of bytes written (all).

        Bounded by the supervisor's ``write_timeout``: ``InputBlocked`` (a
        ``NoInput`` and a ``TimeoutError``, with ``written``) when the command does
        not read. ``KeyError`` for an unknown key; ``NoInput`` when it has no pty
        or stdin pipe, or is not running.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"write takes bytes, not {type(data).__name__}")
        data = bytes(data)
        try:
            n = self._input(key, "write to").write(data, self._write_timeout)
        except InputBlocked as exc:
            self._note_input(key, data[:exc.written])
            raise
        self._note_input(key, data)
        return n

    def last_input(self, key: Hashable) -> Optional[tuple[float, bytes]]:
        """(time, last bytes) of key's input: when ``write()`` last wrote to it (seconds
        since the epoch) and the last 16 bytes written, over every write and every
        generation of the key; None before any. ``NoSuchKey`` (a ``KeyError``) for an
        unknown key."""
        with self._lock:
            m = self._machines.get(key)
            if m is None or m.state is State.GONE:
                raise NoSuchKey(key)
            return self._last_input.get(key)

    def _note_input(self, key: Hashable, data: bytes) -> None:
        if data:
            with self._lock:
                old = self._last_input.get(key, (0.0, b""))[1]
                self._last_input[key] = (time.time(), (old + data)[-16:])

    def close_stdin(self, key: Hashable) -> None:
        """End key's input: close its stdin pipe (the command reads EOF); on a pty,
        write the terminal's EOF character (Ctrl-D). ``KeyError``, ``NoInput`` as write."""
        self._input(key, "close").close_input()

    def resize(self, key: Hashable, rows: int, cols: int) -> None:
        """Set the size of key's pseudo-terminal (its foreground job gets SIGWINCH).
        ``KeyError`` for an unknown key; ``NoInput`` without a pty or when not running."""
        r, c = _check_size((rows, cols))
        out = self._input(key, "resize the terminal of", pty=True)
        if not out.pty:
            raise NoInput(f"key {key!r} has no terminal to resize: start it with pty=(rows, cols)")
        out.resize(r, c)

    @overload
    def tail(self, key: Hashable, n: int = 65536) -> bytes: ...

    @overload
    def tail(self, key: Hashable, n: int = 65536, *, since: int,
             generation: Optional[int] = None) -> Replay: ...

    def tail(self, key: Hashable, n: int = 65536, *,
             since: Optional[int] = None,
             generation: Optional[int] = None) -> Union[bytes, Replay]:
        """The last n bytes key wrote to its owned output (every stream, in read order,
        across generations; at most the supervisor's ``tail_size``). ``KeyError`` for
        an unknown key; b"" for a key whose output is not owned. ``TypeError`` when n
        is not an int, ``ValueError`` when it is negative.

        With ``since`` (an ``offset`` of the key's current generation, as output
        events carry it): a :class:`Replay` of the bytes from that offset on, at most
        n, while they are kept (a durable session's helper keeps its last
        ``ring_size`` bytes, whatever supervisor read them; otherwise this
        supervisor's tail), and how many before them are no longer kept (``dropped``).
        ``generation`` names the generation ``since`` is an offset of (the events'
        ``generation``): where the key has restarted since, :class:`GenerationEnded`
        is raised instead of handing out the successor's bytes at that offset.
        """
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"tail's n must be an int (a number of bytes), not "
                            f"{type(n).__name__}")
        if n < 0:
            raise ValueError(f"tail's n must be a number of bytes >= 0, not {n}")
        if since is not None and (isinstance(since, bool) or not isinstance(since, int)):
            raise TypeError(f"tail's since must be an int (an offset), not "
                            f"{type(since).__name__}")
        if since is not None and since < 0:
            raise ValueError(f"tail's since must be an offset >= 0, not {since}")
        if generation is not None:
            if since is None:
                raise TypeError("tail's generation names the generation of since: "
                                "give since too")
            if isinstance(generation, bool) or not isinstance(generation, int):
                raise TypeError(f"tail's generation must be an int, not "
                                f"{type(generation).__name__}")
            if generation < 1:
                raise ValueError(f"tail's generation must be >= 1, not {generation}")
        with self._lock:
            m = self._machines.get(key)
            if m is None or m.state is State.GONE:
                raise NoSuchKey(key)
            t = self._tails.get(key)
            rec = self._records.get(key)
            current = m.generation
        if since is None:
            return b"" if t is None else t.get(n)
        if generation is not None and generation != current:
            raise GenerationEnded(key, generation, current)
        generation = current
        session = None if rec is None else rec.session
        if since >= 1 << 63:  # past any offset a stream can reach: nothing after it
            return Replay(generation, since, since, b"")
        if session is not None and not session.conn.ended.is_set():
            from ..lineage._session import KeeperGone  # noqa: PLC0415

            try:
                start, data = session.conn.tail(since, n)
                return Replay(generation, since, start, data)
            except (KeeperGone, concurrent.futures.TimeoutError):
                pass  # ended meanwhile: what this supervisor kept, below
        if t is None:
            return Replay(generation, since, since, b"")
        start, data = t.since(since, n)
        return Replay(generation, since, start, data)

    # --- waiting for and signalling a key's process -------------------------------------

    def wait(self, key: Hashable, timeout: Optional[float] = None) -> Optional[ExitStatus]:
        """The exit status of key's current generation, once it has ended (its
        ``exited`` is dispatched, after its teardown): the root's ExitStatus, None
        where it could not be read. At once for a generation that has ended
        already (and None for a key that never ran a process). ``NoSuchKey`` (a
        ``KeyError``) for an unknown key; ``TimeoutError``
        when it still runs after timeout seconds. A start still launching is not
        waited for: the current generation is the one ``start()`` returned."""
        t = self._check_wait_timeout(timeout)
        fut = self.submit_wait(key)
        try:
            return fut.result(timeout=t)
        except concurrent.futures.TimeoutError:
            self._forget_wait(key, fut)
            raise TimeoutError(f"key {key!r}: generation still running after "
                               f"{timeout} s") from None

    @staticmethod
    def _check_wait_timeout(timeout: object) -> Optional[float]:
        return None if timeout is None else _seconds(timeout, "timeout")

    def submit_wait(self, key: Hashable) -> Future[Optional[ExitStatus]]:
        """wait() without waiting: a Future of the status (running from the start)."""
        fut: Future[Optional[ExitStatus]] = Future()
        fut.set_running_or_notify_cancel()
        with self._lock:
            m = self._machines.get(key)
            if m is None or m.state is State.GONE:
                raise NoSuchKey(key)
            gen = m.generation
            seen = self._exits.get(key)
            if gen == 0 or (seen is not None and seen[0] >= gen):
                fut.set_result(seen[1] if seen is not None and seen[0] == gen else None)
            else:
                self._exit_waits.setdefault(key, []).append((gen, fut))
        return fut

    def _exited_for_wait(self, key: Hashable, ev: Event) -> None:
        """A generation's exited, as it is dispatched: remember it, answer its waits."""
        with self._lock:
            self._exits[key] = (ev.generation, ev.exit)
            waits = self._exit_waits.pop(key, None)
            if not waits:
                return
            later = [(g, f) for g, f in waits if g > ev.generation]
            if later:
                self._exit_waits[key] = later
        for g, f in waits:
            if g <= ev.generation:
                f.set_result(ev.exit if g == ev.generation else None)

    def _forget_wait(self, key: Hashable, fut: Future[Any]) -> None:
        with self._lock:
            waits = self._exit_waits.get(key)
            if waits is not None:
                waits[:] = [(g, f) for g, f in waits if f is not fut]
                if not waits:
                    del self._exit_waits[key]

    def signal(self, key: Hashable, sig: int) -> bool:
        """Send sig to key's current process (its lineage's root; not the rest of
        the lineage), through a pidfd proven to be of that process (its pidfs
        handle, else its start time): never to another process that took its pid.

        True when sent; False when the key runs no process, or its process has
        ended already. ``NoSuchKey`` for an unknown key; ``AccessDenied`` when the
        kernel refuses; ``ValueError`` for a number that is no signal."""
        if isinstance(sig, bool) or not isinstance(sig, int):
            raise TypeError(f"a signal is an int (signal.SIGTERM, ...), not {type(sig).__name__}")
        if not 0 <= sig < signal.NSIG:
            raise ValueError(f"no signal {sig}")
        with self._lock:
            m = self._machines.get(key)
            if m is None or m.state is State.GONE:
                raise NoSuchKey(key)
            rec = self._records.get(key)
            lin = None if rec is None else rec.lineage
        root = None if lin is None else lin.root
        if root is None:
            return False
        try:
            pinned = _pin(root.pid, root.start_time, root.handle, features().pidfd)
        except NoSuchProcess:
            return False  # reaped already: its pid may name another process now
        try:
            if pinned.fd is not None and _ended.pidfd_ended(pinned.fd):
                return False  # it has ended (a zombie takes signals and ignores them)
            try:
                return signal_pinned(root.pid, pinned.start_time, pinned.fd, sig)
            except PermissionError:
                raise AccessDenied(root.pid, f"not allowed to signal pid {root.pid}") from None
        finally:
            if pinned.fd is not None:
                os.close(pinned.fd)

    def _input(self, key: Hashable, what: str, pty: bool = False) -> Output:
        with self._lock:
            m = self._machines.get(key)
            if m is None or m.state is State.GONE:
                raise NoSuchKey(key)
            rec = self._records.get(key)
            out = None if rec is None else rec.output
            running = m.state is State.RUNNING
        # One reason each, most fundamental first.
        if not running or (out is not None and out.finished):
            raise NoInput(f"cannot {what} key {key!r}: it is not running")
        if out is None or (pty and not out.pty):
            raise NoInput(f"cannot {what} key {key!r}: it has no terminal (start it with "
                          "pty=(rows, cols))" if pty else
                          f"cannot {what} key {key!r}: it has no pty or stdin pipe")
        if out.input is None:
            raise NoInput(f"cannot {what} key {key!r}: its input is closed" if out.had_input
                          else f"cannot {what} key {key!r}: it has no pty or stdin pipe")
        return out

    def flush_events(self, timeout: float = 10.0) -> bool:
        """Wait (at most timeout) until every event emitted so far went to ``on_event``.

        False on timeout, or when called from ``on_event`` itself (which would wait
        for its own return).
        """
        return self._events.flush(_seconds(timeout, "timeout"))

    def _after_events(self, fn: Callable[[], object]) -> None:
        """Call fn on the dispatch thread once every event emitted so far went to
        ``on_event`` (as ``flush_events`` and then fn, without a thread waiting for
        the flush). Once the supervisor is shutting down, fn runs here, after the
        dispatch thread has ended (bounded). fn must not block: the events wait for it."""
        with self._lock:
            if not self._shut:
                self._events.after(fn)
                return
        self._events.join()
        fn()

    @property
    def health(self) -> tuple[Fault, ...]:
        """What failed inside the supervisor itself, oldest first (the last 64); ``()``
        while all is well.

        Each of its threads (the timers, the dispatch of events, the output reader)
        survives a failure of one of its turns: it records a :class:`Fault` here,
        logs it (``proctable.supervise``, level ERROR) and goes on, so a failure
        never leaves the supervisor half alive. A thread found not running where it
        should is listed too. Exceptions of ``on_event`` are not faults of the
        supervisor: they are logged, and the next event comes.
        """
        faults = list(self._faults.snapshot())
        if not self._shut:
            dead = [name for name, gone in (
                ("timers", not self._timers.running),
                ("events", not self._events.alive()),
                ("output", self._reader.failed),
                ("watcher", self._watcher_failed())) if gone]
            faults += [Fault(name, RuntimeError(f"the {name} thread is not running"),
                             "found not running") for name in dead]
        return tuple(faults)

    def _watcher_failed(self) -> bool:
        t = self._watcher._thread
        return t is not None and not t.is_alive()

    def _fault(self, thread: str, exc: BaseException, what: str,
               key: Hashable = None) -> None:
        self._faults.add(Fault(thread, exc, what, key))

    def _timer_fault(self, exc: BaseException, key: Hashable) -> None:
        self._fault("timers", exc, "a timer turn failed; the timers go on" if key is None
                    else "firing a timer failed (that timer is lost); the timers go on", key)

    def _reader_fault(self, exc: BaseException, what: str, out: Optional[Output]) -> None:
        self._fault("output", exc, what, None if out is None else out.key)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        with self._lock:
            states = ", ".join(f"{k!r}: {m.state}" for k, m in self._machines.items())
        return f"<Supervisor {'closed ' if self._closed else ''}{{{states}}}>"

    # --- feeding -----------------------------------------------------------------------

    def _submit(self, key: Hashable, make: Callable[[int], Input]) -> Future[Any]:
        if self._durable is not None:
            check_key(key)
        if self._detached:
            raise SupervisorClosed("this Supervisor was detached from its sessions")
        fut: Future[Any] = Future()
        # Running from the start: cancel() says False, and the call goes on whether
        # or not anyone still waits for its answer.
        fut.set_running_or_notify_cancel()
        token = next(self._tokens)
        inp = make(token)
        with self._lock:
            self._waiters[token] = _Waiter(fut, key, inp)
        self._feed(key, inp)
        return fut

    def _feed(self, key: Hashable, inp: Input, record: Optional[_Record] = None,
              drop: Optional[_Record] = None) -> None:
        """Feed one input to key's machine under the lock; carry out its actions after.

        ``record`` becomes the key's record (a launch's lineage) and ``drop`` is
        forgotten (a finished teardown's), in the same step as the input.
        """
        later: list[tuple[Action, Optional[Future[ExitStatus]]]] = []
        tearing: Optional[int] = None  # the key's teardown in flight after this input
        with self._lock:
            if self._detached:
                return  # the sessions go on without this supervisor; it decides nothing
            if isinstance(inp, Start) and self._closed:
                actions: list[Action] = [Reply(inp.token, failure=Failure(
                    "closed", "this Supervisor is closed"))]
            else:
                m = self._machines.get(key)
                if m is None:
                    m = Machine(key, self._retired.get(key, 0), self._tickets_seq)
                if record is not None:
                    self._records[key] = record
                if drop is not None and self._records.get(key) is drop:
                    del self._records[key]
                try:
                    actions = m.feed(inp)
                except MachineError:
                    log.exception("supervisor: dropped %r", inp)
                    actions = []
                if m.state is State.GONE and not m.outstanding:
                    # Not here (a refused or failed first start, or removed): only the
                    # generation stays, so that the key's next start is a newer one.
                    self._machines.pop(key, None)
                    self._tails.pop(key, None)
                    self._last_input.pop(key, None)
                    b = self._bounds.pop(key, None)
                    if b is not None and len(b):
                        self._parked_bounds[key] = b
                    if m.generation:
                        self._retired[key] = m.generation
                else:
                    self._machines[key] = m
                    self._retired.pop(key, None)
                tearing = m.ticket("teardown")
            for a in actions:
                if isinstance(a, Emit):
                    self._queue_event(key, Event(a.kind, key, a.generation, a.identity,
                                                 a.status, a.exit, a.reason, a.survivors),
                                      tearing)
                elif isinstance(a, SetTimer):
                    self._timers.set(key, a.ticket, a.delay)
                elif isinstance(a, CancelTimer):
                    self._timers.cancel(key, a.ticket)
                elif isinstance(a, Watch):
                    later.append((a, self._start_watch(key)))
                else:
                    if isinstance(a, Teardown) and key in self._records:
                        self._records[key].tearing = True  # (detach() leaves it to its worker)
                    later.append((a, None))
        for a, fut in later:
            try:
                self._carry_out(key, a, fut)
            except Exception:  # never keep the other actions from being carried out
                log.exception("supervisor: carrying out %r for %r", a, key)

    def _queue_event(self, key: Hashable, ev: Event, tearing: Optional[int] = None) -> None:
        """Queue a lifecycle event (under the lock), in its place with the key's output
        and after the teardown in flight (``tearing``, its ticket).

        An ``exited`` that comes while the key's lineage is being torn down (the
        root ended on its own, and its jobs are still to end; or the root ended
        while a stop tears it down) is held back, with everything of the key after
        it, until that teardown reached its end (``_end_output``): whatever the
        output mode, every teardown comes before its ``exited``, and every byte of
        an owned output before it too."""
        held = self._held.get(key)
        if held is not None:
            held.append(ev)
            return
        rec = self._records.get(key)
        out = None if rec is None else rec.output
        if (out is not None and not out.finished and ev.kind in ("created", "adopted")
                and out.generation == 0):
            self._events.put(ev)
            out.go_live(ev.generation, ev.identity)  # after created: nothing before it
            return
        if ev.kind == "exited" and rec is not None and (
                (tearing is not None and rec.ended != tearing)
                or (out is not None and not out.finished and out.generation == ev.generation)):
            self._held[key] = [ev]  # after the teardown and every byte: _end_output
            return
        self._events.put(ev)

    def _end_output(self, key: Hashable, rec: _Record, ticket: int) -> None:
        """Teardown ``ticket`` of rec reached its end (proven or not): drain and close
        the generation's fds, then deliver what was held back behind it (its exited,
        first)."""
        out = rec.output
        if out is not None and out.finished:
            out = None  # closed by an earlier teardown of this record (one that failed)
        try:
            if out is not None:
                out.finish(self._reader)
        except Exception:  # never keep the teardown from being answered
            log.exception("key %r: closing the output of teardown %d", key, ticket)
        finally:
            with self._lock:
                rec.ended = ticket
                if out is not None:
                    self._events.put(out)  # the last of the generation's output
                for ev in self._held.pop(key, ()):
                    self._events.put(ev)

    def _carry_out(self, key: Hashable, a: Action, fut: Optional[Future[ExitStatus]]) -> None:
        if isinstance(a, Reply):
            self._answer(a)
        elif isinstance(a, AskFresh):
            self._spawn_worker("fresh", self._ask_fresh, key, a,
                               FreshFailed(a.ticket, "could not start a worker thread"))
        elif isinstance(a, Watch):
            if fut is not None:
                fut.add_done_callback(functools.partial(self._exited, key, a.ticket))
            else:  # no lineage to watch (cannot happen): say it ended, status unknown
                self._feed(key, Exited(a.ticket, None, time.monotonic()))
        elif isinstance(a, Launch):
            self._spawn_worker("launch", self._launch, key, a,
                               LaunchFailed(a.ticket, "could not start a worker thread"))
        elif isinstance(a, Teardown):
            rec = self._records.get(key)
            self._spawn_worker("teardown", self._teardown, key, (a, rec),
                               TeardownFailed(a.ticket, (), "could not start a worker thread"),
                               None if rec is None else functools.partial(
                                   self._end_output, key, rec, a.ticket))

    def _spawn_worker(self, what: str, target: Callable[[Hashable, Any], None],
                      key: Hashable, arg: Any, on_error: Input,
                      release: Optional[Callable[[], None]] = None) -> None:
        try:
            self._workers.run(target, f"proctable-supervisor-{what}", key, arg)
        except NoThread as exc:  # no more threads: the machine hears it failed
            log.error("supervisor: %s of %r: %s", what, key, exc)  # noqa: TRY400
            if release is not None:  # what waits for the worker's end (a held exited)
                release()
            self._feed(key, on_error)

    def _answer(self, reply: Reply) -> None:
        if reply.retry:
            with self._lock:
                w = self._waiters.get(reply.token)
            if w is not None:
                self._feed(w.key, w.input)
            return
        with self._lock:
            w = self._waiters.pop(reply.token, None)
        if w is None:
            return
        try:
            if reply.failure is None:
                w.future.set_result(reply.value)
            else:
                w.future.set_exception(_exception(w.key, reply.failure))
        except concurrent.futures.InvalidStateError:  # (cannot happen: it is running)
            log.debug("supervisor: %r was answered already", w.input)

    def _wait(self, fut: Future[Any], grace: Optional[float] = None) -> Any:
        bound = max(self._grace, grace or 0.0) + self._kill_timeout + _SLACK
        try:
            exc = fut.exception(timeout=bound)
        except concurrent.futures.TimeoutError:
            raise ProctableError(f"the supervisor did not answer within {bound:g}s "
                                 "(the call goes on in the background)") from None
        if exc is not None:
            # Raised here, by the call, rather than by fut.result(): the traceback
            # ends in the caller's call, not in concurrent.futures.
            raise exc
        return fut.result()

    # --- a durable supervisor's start: the sessions that outlived the last one ------------

    def _readopt(self, on_adopt: str) -> None:
        """Re-adopt every session the state directory records (each on a worker of its
        key, side by side), report the ones whose helpers are gone, then (on_adopt
        "stop") tear every adopted one down. Bounded; problems go to
        ``adoption_problems`` and the log, never stop the others."""
        d = self._durable
        assert d is not None
        records, bad = d.state.load()
        self.adoption_problems.extend(bad)
        d.state.sweep({r.session.name for r in records if r.session is not None})
        waits: list[tuple[str, Any, Future[Any]]] = []
        for rec in records:
            with self._lock:
                self._retired[rec.key] = max(self._retired.get(rec.key, 0), rec.generation)
            srec = rec.session
            if srec is None:
                continue
            recorded = srec.restart_policy()
            try:
                policy = (recorded if self._restart_for is None
                          else _check_policy(self._restart_for(rec.key, recorded)))
            except Exception as exc:
                log.exception("restart_for(%r) failed: the recorded policy stays", rec.key)
                self.adoption_problems.append(f"{rec.key!r}: restart_for raised {exc!r}")
                policy = recorded
            if on_adopt == "stop" or srec.stopping is not None:
                policy = None  # ended now: nothing of it may start again
            spec = Spec(srec.args, policy, srec.timeout, popen_from_record(srec.popen),
                        output=srec.output, pty=srec.pty, resume=srec,
                        drop_output=srec.drop_output)
            waits.append((rec.key, srec, self._submit(rec.key, functools.partial(Start,
                                                                                 spec=spec))))
        adopted: list[str] = []
        for key, srec, fut in waits:
            try:
                fut.result(timeout=60.0)
            except Ghost as g:
                self._report_ghost(key, g)
                d.ended(key, srec.generation, srec.name)
                continue
            except Unanswered as u:
                log.warning("state_dir: key %r held: %s", key, u)
                self.adoption_problems.append(f"{key!r}: held, not adopted: {u}")
                with self._lock:
                    self._unanswered[key] = u.record
                continue
            except Exception as exc:
                log.warning("state_dir: key %r (session %s) not adopted: %s", key, srec.name,
                            exc)
                self.adoption_problems.append(f"{key!r}: not adopted: {exc}")
                continue
            adopted.append(key)
        if on_adopt == "stop":
            stops = [(k, self.submit_remove(k)) for k in adopted]
            for k, fut in stops:
                try:
                    self._wait(fut)
                except Exception as exc:  # surfaced as teardown_failed; the key stays
                    log.warning("state_dir: key %r could not be torn down: %s", k, exc)
                    self.adoption_problems.append(f"{k!r}: teardown failed: {exc}")
        self.flush_events()

    def _report_ghost(self, key: str, g: Ghost) -> None:
        """A recorded session whose helpers are gone: its exited (what is known) and
        deleted, once; its record keeps only the generation."""
        srec = g.record
        ident = srec.command
        with self._lock:
            self._retired[key] = max(self._retired.get(key, 0), srec.generation)
            self._events.put(Event("exited", key, srec.generation, ident, status=g.status,
                                   exit=g.exit, reason=g.reason))
            self._events.put(Event("deleted", key, srec.generation, ident))

    # --- the actions that take time -----------------------------------------------------

    def _start_watch(self, key: Hashable) -> Optional[Future[ExitStatus]]:
        """Watch key's root (under the lock: the record holds the future before any
        teardown can look for it); the callback is added after the lock is released."""
        rec = self._records.get(key)
        if rec is None:
            return None
        if rec.session is not None:  # the keeper reaps the command and tells its status
            rec.future = rec.session.conn.exit
            return rec.future
        try:
            fut: Future[ExitStatus] = self._watch(rec.target)
        except (ProctableError, OSError) as exc:
            fut = Future()
            fut.set_exception(exc)
        rec.future = fut
        return fut

    def _watch(self, target: Any) -> Future[ExitStatus]:
        """A watch of target (under the lock); where the exit watcher ended under us
        (its thread failed: never a close of ours), a fault, and a new watcher."""
        try:
            return self._watcher.watch(target)
        except WatcherClosed as exc:
            if self._shut:
                raise
            self._fault("watcher", exc, "the exit watcher had ended; a new one watches on")
            self._watcher = ExitWatcher()
            return self._watcher.watch(target)

    def _exited(self, key: Hashable, ticket: int, fut: Future[ExitStatus]) -> None:
        if fut.cancelled():
            if not self._shut:  # the watcher ended under a running key: watch it again
                self._rewatch(key, ticket, fut)
            return  # (else the watcher closed: the supervisor is shutting down)
        try:
            status: Optional[ExitStatus] = fut.result()
        except Exception as exc:  # ended, but the status cannot be read: say so, never 0
            log.debug("key %r: no exit status (%r)", key, exc)
            status = None
        self._feed(key, Exited(ticket, status, time.monotonic()))

    def _rewatch(self, key: Hashable, ticket: int, fut: Future[ExitStatus]) -> None:
        """A watch cancelled while the supervisor runs: its watcher's thread failed.
        The key's exit must still be seen: a new watcher watches its root (a root
        that ended meanwhile resolves at once)."""
        with self._lock:
            m = self._machines.get(key)
            rec = self._records.get(key)
            if m is None or m.ticket("watch") != ticket or rec is None or rec.future is not fut:
                return  # stale: that generation's exit is known or no longer wanted
            log.warning("key %r: its exit watch was cancelled under it; watching again", key)
            new = self._start_watch(key)
        if new is not None:
            new.add_done_callback(functools.partial(self._exited, key, ticket))

    def _ask_fresh(self, key: Hashable, a: AskFresh) -> None:
        """Call a restart's fresh factory. It may block or call back in: the machine
        does not wait for it (a stop makes this answer stale, and it is dropped)."""
        try:
            answer = a.factory(key)
            args = None if answer is None else tuple(_check_args(answer))
        except Exception as exc:
            self._feed(key, FreshFailed(a.ticket, f"the fresh factory failed: {exc!r}", exc))
            return
        if args is None:
            self._feed(key, FreshFailed(a.ticket, "the fresh factory said stop"))
        else:
            self._feed(key, Fresh(a.ticket, args))

    def _launch(self, key: Hashable, a: Launch) -> None:
        spec = a.spec
        args = spec.args
        try:
            ident, rec = self._open(key, spec, args)
        except Exception as exc:
            what = (f"could not adopt {spec.adopt}" if spec.adopt is not None
                    else "could not resume its session" if spec.resume is not None
                    else f"could not start {list(args or ())!r}")
            self._feed(key, LaunchFailed(a.ticket, f"{what}: {exc}", exc))
            return
        if self._detached:  # detach() came meanwhile: the session goes on without us
            _let_go(rec, self._reader)
            return
        self._feed(key, Launched(a.ticket, ident, time.monotonic(), args, rec.resumed,
                                 rec.resume_timeout, rec.resume_stop), record=rec)

    def _open(self, key: Hashable, spec: Spec, args: Optional[tuple[Any, ...]]
              ) -> tuple[Identity, _Record]:
        """Spawn args as a lineage (or attach to spec.adopt): the root and its record."""
        if self._durable is not None:
            return self._open_session(key, spec, args)
        if spec.adopt is not None:
            lin = Lineage(spec.adopt)
            ident = _with_handle(lin.root or spec.adopt)
            return ident, _Record(lin, ident, None)
        assert args is not None
        kwargs = dict(spec.popen_kwargs)
        owned, theirs, out = self._open_io(key, spec, kwargs)
        try:
            try:
                lin = Lineage.spawn(list(args), mode=self._mode, **kwargs)
            finally:
                for fd in theirs:  # the child has its copies now (or never will)
                    os.close(fd)
        except BaseException:
            for fd in owned:
                os.close(fd)
            if out is not None:
                out.discard()
            raise
        root = lin.root
        if root is None:  # never a made-up start time: say it is gone
            lin.terminate(grace=0.0, kill_timeout=self._kill_timeout)
            if out is not None:
                out.finish(None)
            raise NoSuchProcess(lin.process.pid, "the started process is gone already")
        if out is not None:
            try:
                self._reader.add(out)
            except BaseException:
                lin.terminate(grace=0.0, kill_timeout=self._kill_timeout)
                out.finish(None)
                raise
        return _with_handle(root), _Record(lin, lin.process, lin.process, out)

    def _open_io(self, key: Hashable, spec: Spec, kwargs: dict[str, Any]
                 ) -> tuple[list[int], list[int], Optional[Output]]:
        """The fds a generation gets: ours (kept), the child's ends (closed right after
        the spawn), and the Output that owns ours. kwargs get the child's ends."""
        want_stdin = kwargs.get("stdin") is subprocess.PIPE
        if spec.output == "inherit" and spec.pty is None and not want_stdin:
            return [], [], None
        owned: list[int] = []
        theirs: list[int] = []
        try:
            streams: dict[int, str] = {}
            input_fd: Optional[int] = None
            if spec.pty is not None:
                master, slave = os.openpty()
                owned.append(master)
                theirs.append(slave)
                os.set_inheritable(master, False)
                set_winsize(master, *spec.pty)
                streams[master] = "pty"
                input_fd = master
                kwargs["terminal"] = slave
            else:
                if spec.output == "events":
                    for name in ("stdout", "stderr"):
                        r, w = os.pipe2(os.O_CLOEXEC)
                        owned.append(r)
                        theirs.append(w)
                        streams[r] = name
                        grow_pipe(r)
                        kwargs[name] = w
                if want_stdin:
                    r, w = os.pipe2(os.O_CLOEXEC)
                    owned.append(w)
                    theirs.append(r)
                    input_fd = w
                    kwargs["stdin"] = r
            tail, bound = self._per_key(key)
            bound.drop = spec.drop_output
            out = Output(streams, input_fd, spec.pty is not None, bound, tail)
        except BaseException:
            for fd in owned + theirs:
                os.close(fd)
            raise
        out.key = key
        out.notify = self._events.put
        return owned, theirs, out

    def _open_session(self, key: Hashable, spec: Spec, args: Optional[tuple[Any, ...]]
                      ) -> tuple[Identity, _Record]:
        """A durable session: started under a keeper, or (spec.resume) re-adopted."""
        d = self._durable
        assert d is not None and isinstance(key, str)
        if spec.resume is not None:
            session, lin = d.resume(key, spec.resume)
            resumed: Optional[int] = spec.resume.generation
        else:
            assert args is not None
            with self._lock:
                m = self._machines.get(key)
                gen = (m.generation if m is not None else self._retired.get(key, 0)) + 1
            session, lin = d.start(key, gen, args, dict(spec.popen_kwargs), spec.output,
                                   spec.pty, spec.timeout, spec.policy, spec.drop_output)
            resumed = None
        tail, bound = self._per_key(key)
        bound.drop = spec.drop_output
        out = KeptOutput(session.conn, session.record.pty is not None, bound, tail)
        if spec.drop_output:
            session.conn.drop_mode(True)  # the keeper drops too, never pauses the command
        out.key = key
        out.notify = self._events.put
        try:
            self._reader.add(out)
        except BaseException:
            lin._engine.backend_release_disarm()
            lin.close()
            session.conn.detach()
            session.conn.close()
            raise
        root = lin.root
        assert root is not None
        rec = _Record(lin, root, None, out, session, resumed)
        if spec.resume is not None:
            rec.resume_stop, rec.resume_timeout = _what_was_under_way(spec.resume)
        return root, rec

    def _per_key(self, key: Hashable) -> tuple[Tail, Bound]:
        """The key's tail and its bound on undelivered output (both across generations)."""
        with self._lock:
            t = self._tails.get(key)
            if t is None:
                t = self._tails[key] = Tail(self._tail_size)
            b = self._bounds.get(key)
            if b is None:
                b = self._parked_bounds.pop(key, None)
                if b is None:
                    b = Bound(self._output_buffer)
                self._bounds[key] = b
            return t, b

    def _teardown(self, key: Hashable, arg: tuple[Teardown, Optional[_Record]]) -> None:
        a, rec = arg
        if rec is None:
            self._feed(key, TeardownDone(a.ticket, None))
            return
        grace = self._grace if a.grace is None else a.grace
        session = rec.session
        if session is not None and self._durable is not None and isinstance(key, str) \
                and a.purpose in ("stop", "remove", "close", "timeout") and not self._detached:
            # Recorded before it begins: a supervisor killed during this teardown leaves
            # the next one to finish the stop, not to take the command's end for a crash.
            session.record = self._durable.stopping(key, session.record, a.purpose)
        try:
            rec.lineage.terminate(grace=grace, kill_timeout=self._kill_timeout)
        except LineageClosed:
            pass  # proven gone by an earlier teardown
        except TeardownError as exc:
            log.warning("key %r: %s", key, exc)
            # The generation's output ends with its teardown, proven or not: a
            # survivor may not hold it open (it gets EPIPE, or EIO on a pty).
            self._end_output(key, rec, a.ticket)
            self._feed(key, TeardownFailed(a.ticket, tuple(exc.survivors), str(exc), exc,
                                           _root_exit(rec, 0.2)))
            return
        except Exception as exc:  # not proven gone: the lineage is kept for a retry
            log.warning("key %r: teardown failed: %r", key, exc)
            self._end_output(key, rec, a.ticket)
            self._feed(key, TeardownFailed(a.ticket, (), f"teardown failed: {exc!r}", exc,
                                           _root_exit(rec, 0.2)))
            return
        self._end_output(key, rec, a.ticket)  # every member is gone: what the fds hold is all
        # After detach() the keeper may not have been released (nothing is sent to it
        # any more): its record stays for the next supervisor, which adopts what is
        # left of the session (or finds it gone) and ends it. (detach() sets this flag
        # before it detaches a connection: unset here, the release went out.)
        if rec.session is not None and self._durable is not None and isinstance(key, str) \
                and (not self._detached or rec.session.conn.release_sent):
            self._durable.ended(key, rec.session.record.generation, rec.session.record.name)
        root = _root_exit(rec, 1.0)
        proc = rec.process
        if proc is not None and proc.returncode is None:  # our child: reap it (bounded)
            try:
                proc.wait(timeout=1.0)
            except Exception as exc:
                log.debug("key %r: reaping: %r", key, exc)
        self._feed(key, TeardownDone(a.ticket, root), drop=rec)

    def _timer_fired(self, key: Hashable, ticket: int) -> None:
        self._feed(key, TimerFired(ticket, time.monotonic()))

    # --- events and shutdown -------------------------------------------------------------

    def _shutdown_if_closed(self) -> None:
        with self._lock:
            if self._shut or any(m.state not in (State.CLOSED, State.GONE)
                                 for m in self._machines.values()):
                return
            self._shut = True
        self._timers.close()
        self._workers.close()
        self._reader.close()
        self._events.end()
        self._watcher.close()
        if self._durable is not None:
            self._durable.close()


def _what_was_under_way(srec: Any) -> tuple[Optional[str], Optional[float]]:
    """A resumed session's stop to finish (its recorded stop, or a timeout that ran
    out while no supervisor was there) and what is left of its timeout."""
    if srec.stopping is not None:
        return ("stop" if srec.stopping == "close" else srec.stopping), None
    if srec.deadline is not None:
        left = srec.deadline - time.time()
        if left <= 0:
            return "timeout", None
        return None, left
    return None, None


def _let_go(rec: _Record, reader: Reader) -> None:
    """Leave a durable session running: stop reading its keeper, release nothing."""
    out = rec.output
    if isinstance(out, KeptOutput):
        out.let_go(reader)
    elif rec.session is not None:
        rec.session.conn.detach()
        rec.session.conn.close()
    lin = rec.lineage
    lin._engine.backend_release_disarm()
    lin.close()


def _open_durable(state_dir: Any, mode: str, on_adopt: str, ring_size: object,
                  orphan_timeout: object, session_cgroup: Optional[str],
                  restart_for: object) -> Sessions:
    if mode == "scan":
        raise ValueError("durable sessions need a reaper that outlives the supervisor: "
                         "mode 'auto', 'cgroup' or 'subreaper', not 'scan'")
    if on_adopt not in ("keep", "stop"):
        raise ValueError(f"on_adopt must be 'keep' or 'stop', not {on_adopt!r}")
    if isinstance(ring_size, bool) or not isinstance(ring_size, int):
        raise TypeError(f"ring_size must be an int (bytes), not {type(ring_size).__name__}")
    if not 1 << 16 <= ring_size <= 1 << 30:
        raise ValueError(f"ring_size must be 64 KiB to 1 GiB, not {ring_size}")
    timeout = None if orphan_timeout is None else _seconds(orphan_timeout, "orphan_timeout")
    if timeout is not None and timeout > _MAX_SECONDS:
        raise ValueError(f"orphan_timeout must be at most {_MAX_SECONDS:g} seconds")
    if restart_for is not None and not callable(restart_for):
        raise TypeError("restart_for must be a callable (key, recorded policy) -> policy")
    if session_cgroup is not None:
        from ..lineage._cgroup import usable_parent  # noqa: PLC0415

        path = os.path.abspath(os.fsdecode(session_cgroup))
        if usable_parent(path) is None:
            raise ProctableError(f"session_cgroup {path} is no cgroup v2 directory this "
                                 "user may make children in and move processes to")
        session_cgroup = path
    return Sessions(StateDir(state_dir), ring=ring_size, orphan_timeout=timeout,
                    session_cgroup=session_cgroup, mode=mode)


def _root_exit(rec: _Record, wait: float) -> Optional[RootExit]:
    """The root's end if it is known (waiting at most ``wait`` for the watcher)."""
    fut = rec.future
    if fut is not None:
        try:
            return RootExit(fut.result(timeout=wait))
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            pass
        except Exception:  # it ended; its status cannot be read
            return RootExit(None)
    proc = rec.process
    if proc is not None and proc.returncode is not None:
        return RootExit(ExitStatus.from_returncode(proc.returncode))
    return None


def _with_handle(ident: Identity) -> Identity:
    """ident with its pidfs handle filled in where the kernel has one, checked
    against the start time (so it names the same process)."""
    if ident.handle is not None:
        return ident
    for _ in range(2):  # None once may be an exit between identity()'s two looks
        try:
            fresh = identity(ident.pid)
        except ProctableError:
            return ident
        if fresh is not None:
            if fresh.start_time == ident.start_time and fresh.handle is not None:
                return fresh
            return ident
    return ident  # gone already (reaped): its handle cannot be known any more


def _exception(key: Hashable, failure: Failure) -> BaseException:
    if failure.kind == "unknown_key":
        return NoSuchKey(key)
    if failure.kind == "closed":
        return SupervisorClosed(failure.message)
    if failure.kind == "cancelled":
        return StartCancelled(failure.message)
    if failure.kind == "launch_failed":
        if isinstance(failure.error, Exception):
            return failure.error  # FileNotFoundError, PermissionError, NoSuchProcess, ...
        return ProctableError(failure.message)
    if failure.kind == "teardown_failed":
        report = getattr(failure.error, "report", None)
        return TeardownError(f"key {key!r}: {failure.message}", list(failure.survivors), report)
    return ProctableError(failure.message)  # pragma: no cover - the kinds above are all
