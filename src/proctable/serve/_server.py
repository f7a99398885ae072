"""The sidecar's loop: a Supervisor, its clients, and the protocol object between them.

Threads, and what each may block on:

- the main thread reads (stdin, or the listening socket and every client's socket,
  with one selector and the signal wake-up fd), feeds each peer's
  :class:`~._protocol.Protocol`, and starts each request. It blocks on nothing
  but the selector: a call that takes time runs on a future's callback
  (``start``, ``stop``, ``remove``, ``adopt``) or on a short worker thread
  (``close``, ``write``, ``ps``, ``members``);
- one writer thread per client, which writes what is queued for it. A response
  or lifecycle notification sent while nothing is queued and the writer is idle
  is written at once by the sending thread where that cannot block (a socket
  with MSG_DONTWAIT, a pipe with a free slot), saving the writer's wake-up. Its queue
  holds responses and lifecycle notifications without limit (they are never
  dropped; a client whose backlog of them passes ``BACKLOG_LIMIT`` is
  disconnected, its keys left running) and ``output`` notifications up to
  ``OUTPUT_BUDGET`` bytes; output past that is dropped for that client only, and
  counted, and a ``lost`` notification tells the count before the key's next
  notification to it. So a client that stops reading stalls nobody;
- the Supervisor's own threads. Its dispatch thread calls :meth:`Server._on_event`,
  which only queues lines (it never waits), so the wire carries each key's events
  in the order of the Python API.

A response comes after every notification its request caused: the callback that
answers hands the response to the Supervisor's dispatch thread, which queues it once
it has delivered every event emitted before it.
"""

from __future__ import annotations

import base64
import collections
import errno
import fcntl
import itertools
import logging
import os
import re
import select
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Optional, Union

from .. import __version__
from .._jsonobjects import probe_object, proc_object
from .._output import Output
from .._pidfd import features
from .._threads import NoThread, start_thread
from ..errors import (
    AccessDenied,
    InputBlocked,
    NoSuchProcess,
    ProctableError,
    StartCancelled,
    SupervisorClosed,
    TeardownError,
)
from ..exits import ExitFuture, ExitWatcher, exit_probe, terminate
from ..lineage import _hub
from ..lineage._cgroup import usable_parent
from ..lineage.subreaper import SubreaperBackend
from ..supervise import KINDS, Event, RestartPolicy, Supervisor
from ..supervise._runtime import output_events
from ..table import Identity, identity, reader, snapshot
from ._objects import (
    event_params,
    exit_params,
    identity_result,
    member_params,
    output_frame,
    output_line,
    proc_brief,
    status_fields,
)
from ._protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MAX_LINE,
    METHODS,
    VERSION,
    Answer,
    Protocol,
    Reply,
    Request,
    RpcError,
)

__all__ = ["BACKLOG_LIMIT", "FRESH_TIMEOUT", "OUTPUT_BUDGET", "TAIL_LIMIT", "WRITE_TIMEOUT",
           "Server", "serve_socket", "serve_stdio"]

log = logging.getLogger("proctable.serve")

OUTPUT_BUDGET = 8 << 20
"""Bytes of ``output`` notifications queued for one client before more are dropped
(for that client only, counted and told with ``lost``)."""
BACKLOG_LIMIT = 64 << 20
"""Bytes of responses and lifecycle notifications queued for one client that does not
read them before it is disconnected (its keys keep running)."""
TAIL_LIMIT = 256 << 10
"""Bytes of each key's output kept for ``tail`` (hello's ``tail_limit``)."""
FRESH_TIMEOUT = 5.0
"""Seconds the sidecar waits for a client's answer to ``fresh`` (``restart.fresh_timeout``)."""
WRITE_TIMEOUT = 5.0
"""Seconds a ``write`` waits for a command that does not read before it gives up."""
_HAS_OUTPUT = "output" in KINDS  # the output engine is in this build's Supervisor
_FLUSH_WAIT = 30.0


class _Workers:
    """A client's own worker threads (at most ``limit``, started as needed) for the
    calls that take time: a client that sends a flood of them waits for its own
    answers, never delays another client's."""

    def __init__(self, name: str, limit: int = 4) -> None:
        self.name = name
        self.limit = limit
        self._lock = threading.Lock()
        self._jobs: collections.deque[tuple[Callable[[], None], str]] = collections.deque()
        self._threads = 0
        self._idle = 0
        self._pending = 0       # jobs submitted and not yet ended
        self._cond = threading.Condition(self._lock)
        self._ended = threading.Condition(self._lock)

    def submit(self, job: Callable[[], None], what: str) -> None:
        with self._lock:
            self._jobs.append((job, what))
            self._pending += 1
            if self._idle:
                self._cond.notify()
                return
            if self._threads >= self.limit:
                return  # a busy worker takes it next
            self._threads += 1
        try:
            start_thread(self._run, f"proctable-serve-{self.name}")
        except NoThread:
            with self._lock:
                self._threads -= 1
                if self._threads:
                    return  # the others take it
                self._jobs.pop()
                self._pending -= 1
            raise

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._jobs:
                    self._idle += 1
                    woke = self._cond.wait(30.0)
                    self._idle -= 1
                    if not woke and not self._jobs:
                        self._threads -= 1  # idle for long: end
                        return
                job, what = self._jobs.popleft()
            try:
                job()
            except BaseException:  # the job answers its own errors; this is a bug
                log.exception("serve: %s on %s", what, self.name)
            finally:
                with self._lock:
                    self._pending -= 1
                    if not self._pending:
                        self._ended.notify_all()

    def wait(self, timeout: float) -> bool:
        """Wait, at most timeout seconds, until every job submitted has ended
        (its answer queued): True if they all did."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._ended.wait(left)
            return True


class _KeyOrder:
    """Requests about one key that are no input of the supervisor's machine (``write``,
    ``resize``, ``signal``, ``tail``, ``members``) run one at a time, in the order
    they were read, each after every ``start`` or ``adopt`` of the key read before it
    was answered (docs/serve.md, "Ordering"). So bytes written in pipelined requests
    reach the command in order, and a ``write`` pipelined after its key's ``start``
    finds the command running. A ``stop`` or ``remove`` is no gate: it is fed to the
    machine as soon as it is read (stop always wins), so a later ``write`` finds the
    key stopping, and a later ``signal`` still reaches a process that takes its grace.

    A step waiting for a start holds no thread: it resumes from that start's future."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, collections.deque[Any]] = {}
        self._busy: set[str] = set()

    def gate(self, key: str, fut: Future[Any]) -> None:
        """A start or adopt of key was fed: later steps of key wait for fut."""
        with self._lock:
            if not fut.done():
                self._queues.setdefault(key, collections.deque()).append(fut)
        fut.add_done_callback(lambda _f: self._prune(key))

    def _prune(self, key: str) -> None:
        """Forget the gates that are done with nothing behind them (a key started and
        never written to holds nothing here)."""
        with self._lock:
            q = self._queues.get(key)
            if q is None or key in self._busy:
                return  # a runner pops them in its turn
            while q and isinstance(q[0], Future) and q[0].done():
                q.popleft()
            if not q:
                del self._queues[key]

    def run(self, key: str, step: Callable[[], None],
            submit: Callable[[Callable[[], None]], None],
            refuse: Callable[[BaseException], None]) -> None:
        """Run step on a worker (submit) in its turn; refuse(error) where none can start."""
        with self._lock:
            self._queues.setdefault(key, collections.deque()).append((step, submit, refuse))
            if key in self._busy:
                return
            self._busy.add(key)
        self._advance(key)

    def _advance(self, key: str) -> None:
        while True:
            with self._lock:
                q = self._queues.get(key)
                if not q:
                    self._queues.pop(key, None)
                    self._busy.discard(key)
                    return
                head = q[0]
                if isinstance(head, Future) and not head.done():
                    wait: Optional[Future[Any]] = head
                else:
                    wait = None
                    q.popleft()
            if wait is not None:
                wait.add_done_callback(lambda _f: self._advance(key))
                return  # resumed when it is done (at once if it is by now)
            if isinstance(head, Future):
                continue
            step, submit, refuse = head

            def turn(step: Callable[[], None] = step) -> None:
                try:
                    step()
                finally:
                    self._advance(key)
            try:
                submit(turn)
            except NoThread as exc:
                refuse(exc)  # answered with the error; the next step's turn
            else:
                return


class _Asked:
    """A request the sidecar sent a client, waiting for its answer."""

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.done = threading.Event()
        self.reply: Optional[Reply] = None

    def wait(self, timeout: float) -> Optional[Reply]:
        """The answer, or None when none came within timeout or the client left."""
        deadline = time.monotonic() + timeout
        while not self.done.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or not self.client.reachable:
                return None
            self.done.wait(min(left, 0.25))  # and look whether the client is still there
        return self.reply


class _Client:
    """One peer: its protocol object, its outgoing queue and its writer thread."""

    def __init__(self, server: Server, rfd: int, wfd: int, sock: Optional[socket.socket],
                 name: str) -> None:
        self.server = server
        self.rfd = rfd
        self.wfd = wfd
        self.sock = sock
        self.name = name
        self.proto = Protocol(server.max_line)
        self.workers = _Workers(name)
        self._cond = threading.Condition()
        # (line, is an output line, its pace: (the generation's Output, its bytes, the
        # offset after them) where this client paces the key, else None)
        self._queue: collections.deque[tuple[bytes, bool, Optional[_Pace]]] = (
            collections.deque())
        self._output_bytes = 0   # queued output lines
        self._other_bytes = 0    # queued responses and lifecycle lines
        self._lost: dict[tuple[str, int], list[int]] = {}  # (key, gen) -> [bytes, chunks]
        self.dropped_bytes = 0
        self.closed = False      # no more writes: the peer left, or was cut off
        self._eof = False        # the reader saw the end; the writer drains, then stops
        self.binary = False      # output as binary frames (hello's output: "binary")
        self._held = 0           # hold() calls not yet released
        self._asked: dict[Union[int, str], _Asked] = {}  # our requests to it, unanswered
        self._busy = False       # the writer thread is writing (outside the lock)
        # How to write without blocking: a socket (Node's stdio is a socketpair) with
        # MSG_DONTWAIT, a pipe while it has a free slot, anything else never.
        mode = os.fstat(wfd).st_mode if wfd >= 0 else 0
        self._nb_sock: Optional[socket.socket] = sock
        if sock is None and stat.S_ISSOCK(mode):
            self._nb_sock = socket.socket(fileno=os.dup(wfd))
        self._pipe = stat.S_ISFIFO(mode)
        self._thread: Optional[threading.Thread] = None
        if wfd >= 0:
            self._thread = start_thread(self._write_loop, f"proctable-serve-writer-{name}")

    # -- requests of ours to the client (fresh) ----------------------------------------

    @property
    def reachable(self) -> bool:
        """It may still read a request of ours and answer it."""
        return not self.closed and not self._eof

    def ask(self, id_: str, line: bytes, key: str) -> _Asked:
        """Send a request of ours (in key's order); what waits for its answer."""
        asked = _Asked(self)
        with self._cond:
            self._asked[id_] = asked
        self.send(line, key)
        return asked

    def answered(self, reply: Reply) -> None:
        with self._cond:
            asked = self._asked.pop(reply.id, None)
        if asked is None:  # late (its wait ended), or never ours: a response is not answered
            log.debug("serve: client %s answered %r, which nothing waits for", self.name,
                      reply.id)
            return
        asked.reply = reply
        asked.done.set()

    def forget(self, id_: str) -> None:
        with self._cond:
            self._asked.pop(id_, None)

    # -- queueing (any thread; never blocks) -------------------------------------------

    def send(self, line: bytes, key: Optional[str] = None) -> None:
        """A response or lifecycle notification: never dropped."""
        with self._cond:
            if self.closed:
                return
            if key is not None and self._lost:
                self._tell_lost(key)
            if not self._queue and not self._busy and not self._held and self._write_now(line):
                return
            self._queue.append((line, False, None))
            self._other_bytes += len(line)
            if self._other_bytes > BACKLOG_LIMIT:
                log.warning("serve: client %s does not read; disconnecting it", self.name)
                self._cut()
            if not self._held:
                self._cond.notify()

    def _write_now(self, line: bytes) -> bool:
        """Write line at once if that cannot block (the writer is idle, nothing is
        queued): the peer gets it without a wake-up of the writer thread. False
        where it must be queued."""
        try:
            if self._nb_sock is not None:
                n = self._nb_sock.send(line, socket.MSG_DONTWAIT)
            elif not self._pipe or len(line) > select.PIPE_BUF or not _writable(self.wfd):
                return False
            else:  # a free slot in the pipe: a write of at most PIPE_BUF bytes fits whole
                n = os.write(self.wfd, line)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return False  # the writer finds out (and stops), as before
        if n < len(line):
            self._queue.append((line[n:], False, None))
            self._other_bytes += len(line) - n
            self._cond.notify()
        return True

    def hold(self) -> None:
        """Queue without waking the writer until release(): the answers of one chunk
        of pipelined requests go out in one write, not one wake-up each."""
        with self._cond:
            self._held += 1

    def release(self) -> None:
        with self._cond:
            self._held -= 1
            if not self._held and self._queue:
                self._cond.notify()

    def send_output(self, key: str, generation: int, line: Union[bytes, tuple[bytes, bytes]],
                    nbytes: int, pace: Optional[_Pace] = None) -> None:
        """An output notification: dropped (and counted) past the client's budget,
        unless this client paces the key (``pace``): then it is never dropped, and
        the key's command waits while this client is behind (the supervisor's bound).

        nbytes counts every byte the client will not see if this line is dropped: the
        chunk's own, and the supervisor's drop that the chunk was to tell. A binary
        frame is (its line, its bytes): two entries of the queue, queued together."""
        size = len(line[0]) + len(line[1]) if isinstance(line, tuple) else len(line)
        with self._cond:
            if self.closed:
                if pace is not None:
                    _consume([pace])
                return
            if pace is None and self._output_bytes + size > OUTPUT_BUDGET:
                lost = self._lost.setdefault((key, generation), [0, 0])
                lost[0] += nbytes
                lost[1] += 1
                self.dropped_bytes += nbytes
                return
            if self._lost:
                self._tell_lost(key)
            if isinstance(line, tuple):
                self._queue.append((line[0], True, None))
                self._queue.append((line[1], True, pace))
            else:
                self._queue.append((line, True, pace))
            self._output_bytes += size
            if not self._held:
                self._cond.notify()

    def _tell_lost(self, key: str) -> None:
        for (k, gen) in [kg for kg in self._lost if kg[0] == key]:
            nbytes, chunks = self._lost.pop((k, gen))
            line = Protocol.notification("lost", {"key": k, "generation": gen,
                                                  "bytes": nbytes, "chunks": chunks})
            self._queue.append((line, False, None))
            self._other_bytes += len(line)

    def _clear(self) -> None:
        """Forget what is queued (under the lock): paced output is consumed, so that its
        key is not held waiting for a client that is gone."""
        _consume([pace for _l, _o, pace in self._queue if pace is not None])
        self._queue.clear()

    def _cut(self) -> None:
        self.closed = True
        self._clear()
        self._cond.notify()
        self._shutdown_sock()

    def _shutdown_sock(self) -> None:
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def finish(self) -> None:
        """The peer's input ended: write what is queued, then stop."""
        with self._cond:
            self._eof = True
            self._cond.notify()

    def drain(self, timeout: float) -> bool:
        """Wait (bounded) until the writer wrote everything queued."""
        with self._cond:
            self._eof = True
            self._cond.notify()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the writer thread -----------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                while not self._queue and not self.closed and not self._eof:
                    self._cond.wait()
                if self.closed or (not self._queue and self._eof):
                    return
                batch: list[bytes] = []
                paces: list[_Pace] = []
                size = 0
                while self._queue and size < (1 << 20):
                    line, is_output, pace = self._queue.popleft()
                    if is_output:
                        self._output_bytes -= len(line)
                    else:
                        self._other_bytes -= len(line)
                    batch.append(line)
                    if pace is not None:
                        paces.append(pace)
                    size += len(line)
                self._busy = True
            try:
                self._write_all(batch)
            except OSError as exc:  # the peer left (EPIPE, ECONNRESET): stop writing
                log.debug("serve: client %s: %s", self.name, exc)
                _consume(paces)
                with self._cond:
                    self.closed = True
                    self._clear()
                self.server.wake()
                return
            _consume(paces)  # written: the keys this client paces read on

    def _write_all(self, batch: list[bytes]) -> None:
        """Write every buffer, in order, in as few system calls as the peer takes."""
        bufs: list[Union[bytes, memoryview]] = list(batch)
        i = 0
        while i < len(bufs):
            n = os.writev(self.wfd, bufs[i:i + 512])  # (IOV_MAX is 1024)
            while i < len(bufs) and n >= len(bufs[i]):
                n -= len(bufs[i])
                i += 1
            if n:
                bufs[i] = memoryview(bufs[i])[n:]


_Pace = tuple[Output, int, int]  # (a generation's Output, bytes of data, the offset after)


def _consume(paces: list[_Pace]) -> None:
    """These output lines reached their pacing client (or never will): their bytes no
    longer hold the key's command, and a durable session's keeper is told."""
    for out, n, end in paces:
        out.consumed(n)
        out.delivered(end)


class _Backlog(_Client):
    """What is sent while no client is connected (a re-adopting sidecar's start, a
    client between two connections): kept for the next client that connects, which
    gets it first, in order. Output is kept up to the output budget, then dropped and
    told (``lost``); lifecycle lines are never dropped (beyond BACKLOG_LIMIT the
    oldest go, and the log says so)."""

    def __init__(self, server: Server) -> None:
        super().__init__(server, -1, -1, None, "backlog")

    @property
    def reachable(self) -> bool:
        return False

    def send(self, line: bytes, key: Optional[str] = None) -> None:
        with self._cond:
            if key is not None and self._lost:
                self._tell_lost(key)
            self._queue.append((line, False, None))
            self._other_bytes += len(line)
            while self._other_bytes > BACKLOG_LIMIT and self._queue:
                old, is_output, _pace = self._queue.popleft()
                if is_output:
                    self._output_bytes -= len(old)
                else:
                    self._other_bytes -= len(old)
                log.warning("serve: no client for long: an old notification was dropped")

    def move_into(self, c: _Client) -> None:
        """Hand everything kept to c (a new client: it gets it before anything else)."""
        with self._cond, c._cond:
            c._queue.extendleft(reversed(self._queue))
            c._output_bytes += self._output_bytes
            c._other_bytes += self._other_bytes
            for kg, (nbytes, chunks) in self._lost.items():
                lost = c._lost.setdefault(kg, [0, 0])
                lost[0] += nbytes
                lost[1] += chunks
            self._queue.clear()
            self._lost.clear()
            self._output_bytes = self._other_bytes = 0
            c._cond.notify()


class Server:
    """The sidecar: one Supervisor shared by every client, the methods, the events."""

    def __init__(self, *, grace: float = 3.0, kill_timeout: float = 3.0, mode: str = "auto",
                 max_line: int = MAX_LINE, state_dir: Optional[str] = None,
                 on_adopt: str = "keep", ring_size: int = 1 << 20,
                 orphan_timeout: Optional[float] = None,
                 session_cgroup: Optional[str] = None) -> None:
        self.max_line = max_line
        self.grace = grace
        self.kill_timeout = kill_timeout
        self._clients_lock = threading.Lock()
        self.clients: list[_Client] = []
        self._generations: dict[str, dict[tuple[int, int], int]] = {}
        self._gen_lock = threading.Lock()
        self._watcher: Optional[ExitWatcher] = None
        self._watcher_lock = threading.Lock()
        self._closed = False
        self._caps: Optional[dict[str, Any]] = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._order = _KeyOrder()
        self._asks = itertools.count(1)  # the ids of our requests to clients
        # Which client paces each key's output (the one that started it; see _pacer).
        self._pacers: dict[str, _Client] = {}
        self.ending = False  # the loop ends (a detach was asked for)
        self.closed_keys = False  # close was called: the shutdown closes, never detaches
        self._backlog = _Backlog(self)
        durable = state_dir is not None
        self.sup = Supervisor(on_event=self._on_event, grace=grace, kill_timeout=kill_timeout,
                              mode=mode, tail_size=TAIL_LIMIT, write_timeout=WRITE_TIMEOUT,
                              _output_sink=self._on_output, state_dir=state_dir,
                              on_adopt=on_adopt if durable else "keep",
                              ring_size=ring_size if durable else 1 << 20,
                              orphan_timeout=orphan_timeout if durable else None,
                              session_cgroup=session_cgroup if durable else None)
        self.durable = durable
        self._methods: dict[str, Callable[[_Client, Request], Any]] = {
            "hello": self._hello, "version": self._hello, "start": self._start,
            "stop": self._stop, "remove": self._remove, "adopt": self._adopt,
            "list": self._list, "write": self._write, "resize": self._resize,
            "signal": self._signal, "tail": self._tail, "members": self._members,
            "ps": self._ps, "probe": self._probe, "watch": self._watch, "close": self._close,
            "terminate": self._terminate, "detach": self._detach,
        }
        assert set(self._methods) == set(METHODS)

    def wake(self) -> None:
        """Make the main loop look again (a writer saw its peer leave)."""
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    # -- clients ------------------------------------------------------------------------

    def add_client(self, rfd: int, wfd: int, sock: Optional[socket.socket],
                   name: str) -> _Client:
        c = _Client(self, rfd, wfd, sock, name)
        with self._clients_lock:
            self._backlog.move_into(c)  # what came while no client was there, first
            self.clients = [*self.clients, c]
        return c

    def drop_client(self, c: _Client) -> None:
        with self._clients_lock:
            self.clients = [x for x in self.clients if x is not c]
        c.finish()

    def feed(self, c: _Client, data: bytes) -> None:
        """Bytes from a client: answer what is no request, start every request."""
        items = c.proto.receive(data) if data else c.proto.end()
        c.hold()
        try:
            for item in items:
                if isinstance(item, Answer):
                    c.send(item.line)
                elif isinstance(item, Reply):
                    c.answered(item)
                else:
                    self.dispatch(c, item)
        finally:
            c.release()

    def dispatch(self, c: _Client, req: Request) -> None:
        try:
            result = self._methods[req.method](c, req)
        except RpcError as err:
            self._error(c, req, err)
            return
        except Exception as exc:  # a bug of ours: said, never a dead sidecar
            log.exception("serve: %s failed", req.method)
            self._error(c, req, RpcError(INTERNAL_ERROR, f"internal error: {exc!r}"))
            return
        if isinstance(result, _Later):
            return  # answered by a callback
        self._reply(c, req, result)

    def _reply(self, c: _Client, req: Request, result: Any) -> None:
        if req.id is not None:
            c.send(Protocol.response(req.id, result))

    def _error(self, c: _Client, req: Request, err: RpcError) -> None:
        if req.id is not None:
            c.send(Protocol.error(req.id, err))

    # -- events ---------------------------------------------------------------------------

    def _targets(self) -> list[_Client]:
        """Whom a notification goes to: every client, or the backlog while there is none
        (under the clients lock, so that a client being added gets it either way)."""
        return self.clients or [self._backlog]

    def _pacer(self, key: str) -> Optional[_Client]:
        """The client whose reading paces key's output: the one that started it while it
        is connected, else the client connected longest; None without a client."""
        c = self._pacers.get(key)
        if c is not None and c.reachable:
            return c
        for c in self.clients:
            if c.reachable:
                return c
        return None

    def _on_output(self, out: Output) -> None:
        """On the supervisor's dispatch thread, in its place among the events: what a
        generation wrote, as output lines, one per client (never waits). The key's
        pacing client gets every line, and only once it has written one is it
        consumed (the supervisor then reads on for the key); the others get what fits
        their budget."""
        evs = output_events(out)
        if not evs:
            return
        key = str(out.key)
        with self._clients_lock:
            targets = self._targets()
            pacer = None if out.bound.drop else self._pacer(key)
            for ev in evs:
                data = ev.data or b""
                text = b""
                frame: Union[bytes, tuple[bytes, bytes]] = b""
                n = len(data) + ev.dropped
                end = (ev.offset or 0) + len(data)
                for c in targets:
                    if c.binary:
                        line = frame = frame or output_frame(ev)
                    else:
                        line = text = text or output_line(ev)
                    if c is pacer:
                        c.send_output(key, ev.generation, line, n, (out, len(data), end))
                    else:
                        c.send_output(key, ev.generation, line, n)
                if pacer is None:
                    _consume([(out, len(data), end)])

    def _on_event(self, ev: Event) -> None:
        """On the supervisor's dispatch thread: queue one line per client; never waits."""
        key = str(ev.key)
        if ev.kind == "output":  # (only where no output sink takes them: never here)
            return
        if ev.kind == "created" and ev.identity is not None:
            with self._gen_lock:
                gens = self._generations.setdefault(key, {})
                gens[(ev.identity.pid, ev.identity.start_time)] = ev.generation
                while len(gens) > 8:
                    del gens[next(iter(gens))]
        elif ev.kind == "deleted":
            with self._gen_lock:
                self._generations.pop(key, None)
        line = Protocol.notification("event", event_params(ev))
        with self._clients_lock:
            for c in self._targets():
                c.send(line, key)

    def _generation_of(self, key: str, ident: Identity) -> int:
        with self._gen_lock:
            gen = self._generations.get(key, {}).get((ident.pid, ident.start_time))
        return self.sup.generation(key) if gen is None else gen

    def _answer_after_events(self, c: _Client, req: Request, fut: Future[Any],
                             result: Callable[[Any], Any]) -> _Later:
        """Answer req when fut is done, after every event emitted so far is queued:
        the answer is queued by the supervisor's dispatch thread once it has queued
        those events (no thread waits for it)."""
        def answer(f: Future[Any]) -> None:
            try:
                value = f.result()
            except BaseException as exc:
                self._error(c, req, _rpc_error(exc, req))
                return
            try:
                self._reply(c, req, result(value))
            except Exception as exc:
                log.exception("serve: answering %s", req.method)
                self._error(c, req, RpcError(INTERNAL_ERROR, f"internal error: {exc!r}"))

        def done(f: Future[Any]) -> None:
            self.sup._after_events(lambda: answer(f))
        fut.add_done_callback(done)
        return _LATER

    def _in_thread(self, c: _Client, req: Request, work: Callable[[], Any]) -> _Later:
        """Run work on a worker thread; answer with its result or its error."""
        def run() -> None:
            try:
                value = work()
            except RpcError as err:
                self._error(c, req, err)
                return
            except BaseException as exc:
                self._error(c, req, _rpc_error(exc, req))
                return
            self._reply(c, req, value)
        c.workers.submit(run, req.method)
        return _LATER

    def _in_order(self, c: _Client, req: Request, work: Callable[[], Any]) -> _Later:
        """Run work on a worker in its key's turn (see _KeyOrder); answer with its result
        or its error."""
        def run() -> None:
            try:
                value = work()
            except BaseException as exc:
                self._error(c, req, _rpc_error(exc, req))
                return
            self._reply(c, req, value)

        def refuse(exc: BaseException) -> None:
            self._error(c, req, RpcError("failed", str(exc), {"key": req.params["key"]}))
        self._order.run(req.params["key"], run, lambda job: c.workers.submit(job, req.method),
                        refuse)
        return _LATER

    def _gate(self, key: str, fut: Future[Any]) -> Future[Any]:
        self._order.gate(key, fut)
        return fut

    # -- methods ------------------------------------------------------------------------

    def capabilities(self) -> dict[str, Any]:
        if self._caps is None:
            self._caps = _capabilities()
        return self._caps

    def _hello(self, c: _Client, req: Request) -> Any:
        binary = req.params.get("output") == "binary"

        def answer() -> None:
            try:
                result = self._hello_result(binary)
            except BaseException as exc:
                self._error(c, req, _rpc_error(exc, req))
                return
            # The answer and the switch to frames under the lock output is sent under:
            # every output line after the answer is a frame, none before it.
            with self._clients_lock:
                self._reply(c, req, result)
                c.binary = binary
        if self._caps is not None:
            answer()
        else:  # the first call looks at the host (BPF, the connector): a worker's job
            c.workers.submit(answer, req.method)
        return _LATER

    def _hello_result(self, binary: bool = False) -> Any:
        return {"protocol": VERSION, "output": "binary" if binary else "base64",
                "version": __version__, "pid": os.getpid(), "uid": os.geteuid(),
                "methods": sorted(METHODS), "notifications": ["event", "output", "exit", "lost"],
                "requests": ["fresh"],
                "max_line": self.max_line, "output_budget": OUTPUT_BUDGET,
                "tail_limit": TAIL_LIMIT, "write_timeout": WRITE_TIMEOUT,
                "state_dir": self.sup.state_dir,
                "adoption_problems": list(self.sup.adoption_problems),
                "capabilities": {**self.capabilities(), "durable": self.durable}}

    def _start(self, c: _Client, req: Request) -> Any:
        p = req.params
        key = p["key"]
        kw = _popen_kwargs(p)
        output = p.get("output", "events")
        pty = p.get("pty")
        if not _HAS_OUTPUT:
            asked = pty is not None or p.get("stdin") == "pipe"
            if asked or (output == "events" and "output" in p):
                raise RpcError("not_supported", "this proctable has no output engine "
                               "(output events, pty, stdin pipe)")
            if output == "events":
                output = "discard"  # never the sidecar's stdout: that is the protocol
        if _HAS_OUTPUT:
            if pty is not None:
                kw["pty"] = (pty["rows"], pty["cols"])
            elif output == "events":
                kw["output"] = "events"
        if "pty" not in kw:
            if output == "discard":
                kw["stdout"] = kw["stderr"] = subprocess.DEVNULL
            elif output == "stderr":
                kw["stdout"] = sys.stderr.fileno()
            kw["stdin"] = subprocess.PIPE if p.get("stdin") == "pipe" else subprocess.DEVNULL
        if p.get("drop_output"):
            kw["drop_output"] = True
        try:
            policy = self._policy(c, key, p.get("restart"), p["args"])
            fut = self._gate(key, self.sup.submit_start(key, p["args"], policy,
                                                        p.get("timeout"), **kw))
        except (TypeError, ValueError) as exc:
            raise RpcError(-32602, str(exc)) from None
        except ProctableError as exc:  # (a durable key held: its session did not answer)
            raise RpcError("failed", str(exc), {"key": key}) from None
        self._pacers[key] = c  # its output is paced by this client's reading
        return self._answer_after_events(
            c, req, fut, lambda ident: identity_result(ident, self._generation_of(key, ident)))

    def _policy(self, c: _Client, key: str, r: Optional[dict[str, Any]],
                args: Optional[list[str]]) -> Optional[RestartPolicy]:
        if r is not None and r.get("fresh") == "ask":
            return _policy(r, self._fresh_from(c, key, r, args))
        return _policy(r)

    def _fresh_from(self, c: _Client, key: str, r: dict[str, Any],
                    args: Optional[list[str]]) -> Callable[[Any], Optional[list[str]]]:
        """restart.fresh "ask": a fresh factory that asks client c (docs/serve.md, "The
        fresh request"). It runs on a supervisor worker of its own and may block."""
        timeout = r.get("fresh_timeout", FRESH_TIMEOUT)
        fixed = r.get("fresh_args")
        ran = [args]  # what the run that exited ran: the args asked with, and the fallback

        def fresh(_key: Any) -> Optional[list[str]]:
            # The client that started the key, else (it left: a reconnect) the one
            # that paces it now; with none, the fallback at once.
            asked = c if c.reachable else self._pacer(key)
            reply = None if asked is None else self._ask(
                asked, "fresh", {"key": key, "generation": self.sup.generation(key),
                                 "args": ran[0]}, key, timeout)
            if reply is not None and reply.error is not None \
                    and reply.error.get("code") == -32601:
                reply = None  # a client that answers no fresh: as if it had not answered
            if reply is None:  # no answer in time, or no client to ask: the fallback
                ran[0] = fixed or ran[0]
                log.warning("key %r: no answer to fresh within %gs; rerunning %s", key,
                            timeout, "fresh_args" if fixed else "the same args")
                return ran[0]
            if reply.error is not None:
                raise ProctableError("the client answered fresh with an error: "
                                     f"{reply.error.get('message')}")
            if reply.result is None:
                return None  # the client said stop: gave_up
            answer = reply.result
            if not isinstance(answer, list) or not answer or not all(
                    isinstance(a, str) and "\x00" not in a for a in answer):
                raise ProctableError("the client's fresh answer is not null or a non-empty "
                                     f"list of strings: {str(answer)[:200]}")
            ran[0] = list(answer)
            return ran[0]
        return fresh

    def _ask(self, c: _Client, method: str, params: dict[str, Any], key: str,
             timeout: float) -> Optional[Reply]:
        """Send client c a request of ours, after every event emitted so far (so a
        fresh comes after its exited and restarting); its answer, or None."""
        self.sup.flush_events(_FLUSH_WAIT)
        id_ = f"{method}-{next(self._asks)}"
        asked = c.ask(id_, Protocol.request(id_, method, params), key)
        reply = asked.wait(timeout)
        if reply is None:
            c.forget(id_)  # a late answer is ignored
        return reply

    def _adopt(self, c: _Client, req: Request) -> Any:
        p = req.params
        key = p["key"]
        ident = _pinned(p["pid"], p["start_time"])
        kw = _popen_kwargs(p)
        if "args" in p:
            kw["stdin"] = subprocess.DEVNULL
            kw["stdout"] = kw["stderr"] = subprocess.DEVNULL
        policy = self._policy(c, key, p.get("restart"), p.get("args"))
        fut = self._gate(key, self.sup.submit_adopt(key, ident, policy, p.get("args"), **kw))
        return self._answer_after_events(
            c, req, fut, lambda i: identity_result(i, self._generation_of(key, i)))

    def _stop(self, c: _Client, req: Request) -> Any:
        try:  # a grace past what the supervisor waits on (MAX_SECONDS) is a bad param
            fut = self.sup.submit_stop(req.params["key"], req.params.get("grace"))
        except (TypeError, ValueError) as exc:
            raise RpcError(-32602, str(exc), {"param": "grace"}) from None
        return self._answer_after_events(c, req, fut, status_fields)

    def _remove(self, c: _Client, req: Request) -> Any:
        try:
            fut = self.sup.submit_remove(req.params["key"], req.params.get("grace"))
        except (TypeError, ValueError) as exc:
            raise RpcError(-32602, str(exc), {"param": "grace"}) from None
        return self._answer_after_events(c, req, fut, lambda _v: {})

    def _close(self, c: _Client, req: Request) -> Any:
        self.closed_keys = True  # (a durable sidecar closes, then, rather than detaches)

        def work() -> Any:
            self.sup.close(req.params.get("grace"))
            self.sup.flush_events(_FLUSH_WAIT)
            return {}
        return self._in_thread(c, req, work)

    def _detach(self, c: _Client, req: Request) -> Any:
        """A durable sidecar leaves every session running and ends (after this answer):
        the next ``proctable serve --state`` on the same directory takes them back."""
        if not self.durable:
            raise RpcError("not_supported", "detach needs a durable sidecar "
                           "(proctable serve --state PATH)")
        self.ending = True
        self.wake()
        return {}

    def _list(self, c: _Client, req: Request) -> Any:
        out = []
        for key in sorted(str(k) for k in self.sup.keys()):  # noqa: SIM118 - a method
            lin = self.sup.lineage(key)
            root = None if lin is None else lin.root
            out.append({"key": key, "state": self.sup.state(key),
                        "generation": self.sup.generation(key),
                        "running": self.sup.running(key),
                        "pid": None if root is None else root.pid,
                        "start_time": None if root is None else root.start_time,
                        "mode": None if lin is None else lin.mode,
                        "last_input": self._last_input(key)})
        return {"keys": out}

    def _last_input(self, key: str) -> Optional[dict[str, Any]]:
        last = getattr(self.sup, "last_input", None)
        try:
            seen = None if last is None else last(key)
        except KeyError:  # removed since keys() was read
            return None
        if seen is None:
            return None
        t, data = seen
        return {"time": round(t, 6), "data_b64": base64.b64encode(data).decode("ascii")}

    def _known(self, key: str) -> None:
        if key not in self.sup:
            raise RpcError("no_such_key", f"no key {key!r}", {"key": key})

    def _members(self, c: _Client, req: Request) -> Any:
        key = req.params["key"]

        def work() -> Any:
            self._known(key)
            lin = self.sup.lineage(key)
            if lin is None or lin.closed:
                return member_params([], [])
            try:
                return member_params(lin.members(), lin.suspects())
            except ProctableError:  # closed under us: it has no members now
                return member_params([], [])
        return self._in_order(c, req, work)

    def _signal(self, c: _Client, req: Request) -> Any:
        key = req.params["key"]
        sig = _signum(req.params["signal"])

        def work() -> Any:
            self._known(key)
            lin = self.sup.lineage(key)
            root = None if lin is None else lin.root
            if root is None or not self.sup.running(key):
                raise RpcError("no_such_process", f"key {key!r} runs no process", {"key": key})
            try:
                # Through a pidfd proven to be of the root (Supervisor.signal): a pidfd
                # opened by pid alone could be of a process that took the root's pid.
                sent = self.sup.signal(key, sig)
            except (AccessDenied, PermissionError) as exc:
                raise RpcError("failed", f"signal refused: {exc}") from None
            return {"sent": sent, "pid": root.pid, "start_time": root.start_time}
        return self._in_order(c, req, work)

    def _io(self, name: str) -> Callable[..., Any]:
        fn = getattr(self.sup, name, None)
        if fn is None:
            raise RpcError("not_supported", f"this proctable's Supervisor has no {name}()")
        return fn  # type: ignore[no-any-return]

    def _write(self, c: _Client, req: Request) -> Any:
        p = req.params
        write = self._io("write")
        close_stdin = self._io("close_stdin") if p.get("eof") else None

        def work() -> Any:
            n = write(p["key"], p["data_b64"])
            if close_stdin is not None:
                close_stdin(p["key"])
            return {"written": n}
        return self._in_order(c, req, work)

    def _resize(self, c: _Client, req: Request) -> Any:
        p = req.params
        resize = self._io("resize")
        return self._in_order(c, req, lambda: resize(p["key"], p["rows"], p["cols"]) or {})

    def _tail(self, c: _Client, req: Request) -> Any:
        p = req.params
        tail = self._io("tail")
        asked = p.get("bytes", 65536)
        since = p.get("since")

        def work() -> Any:
            if since is not None:
                r = tail(p["key"], asked, since=since)
                return {"data_b64": base64.b64encode(r.data).decode("ascii"), "asked": asked,
                        "given": len(r.data), "generation": r.generation, "since": r.since,
                        "offset": r.offset, "dropped": r.dropped, "end": r.end,
                        "limit": None if self.durable else TAIL_LIMIT}
            data: bytes = tail(p["key"], asked)
            return {"data_b64": base64.b64encode(data).decode("ascii"), "asked": asked,
                    "given": len(data), "limit": TAIL_LIMIT}
        return self._in_order(c, req, work)

    def _ps(self, c: _Client, req: Request) -> Any:
        p = req.params
        try:
            pattern = re.compile(p["name"]) if "name" in p else None
        except re.error as exc:
            raise RpcError(-32602, f"name is not a regular expression: {exc}",
                           {"param": "name"}) from None
        pids = set(p.get("pids", ())) or None
        uids = set(p.get("uids", ())) or None
        kthreads = p.get("kernel_threads", False)

        def work() -> Any:
            table = snapshot()
            rows = [proc_object(r) for r in table
                    if (kthreads or not r.kernel_thread)
                    and (pids is None or r.pid in pids)
                    and (uids is None or r.uid in uids)
                    and (pattern is None or pattern.search(r.name))]
            denied = [{"pid": d.pid, "uid": d.uid} for d in table.denied
                      if pids is None or d.pid in pids]
            return {"procs": rows, "denied": denied}
        return self._in_thread(c, req, work)

    def _probe(self, c: _Client, req: Request) -> Any:
        pid = req.params["pid"]
        return probe_object(pid, exit_probe(pid, req.params.get("start_time")))

    def _watch(self, c: _Client, req: Request) -> Any:
        if req.id is None:
            return None  # a notification is never answered: no response, and no exit
        pid = req.params["pid"]
        st = req.params.get("start_time")
        with self._watcher_lock:
            if self._watcher is None:
                self._watcher = ExitWatcher()
            watcher = self._watcher
        target: Any = pid if st is None else Identity(pid, st)
        try:
            fut = watcher.watch(target)
        except ProctableError as exc:
            raise _rpc_error(exc, req) from None
        pinned = fut.identity
        start_time = pinned.start_time if pinned is not None else st

        def done(f: Future[Any]) -> None:
            assert isinstance(f, ExitFuture)
            exc = f.exception() if not f.cancelled() else ProctableError("the watch was closed")
            status = None if exc is not None else f.result()
            c.send(Protocol.notification("exit", {"watch": req.id, **exit_params(
                pid, start_time, status, exc, f.source)}))
        self._reply(c, req, {"pid": pid, "start_time": start_time})
        fut.add_done_callback(done)  # after the response: `exit` never comes before it
        return _LATER

    def _terminate(self, c: _Client, req: Request) -> Any:
        p = req.params
        pid, start_time = p["pid"], p["start_time"]
        if pid == os.getpid():
            raise RpcError(INVALID_PARAMS, "pid is the sidecar itself: end its input, or "
                           "send it SIGTERM", {"param": "pid"})
        grace = p.get("grace", self.grace)
        kill_timeout = p.get("kill_timeout", self.kill_timeout)

        def work() -> Any:
            ident = _pinned(pid, start_time)  # no_such_process: gone, or another process
            try:
                status = terminate(ident, grace, kill_timeout)  # signals that identity only
            except PermissionError as exc:
                raise RpcError("failed", f"terminate refused: {exc}",
                               {"pid": pid, "errno": "EPERM"}) from None
            if status is not None:
                return {**status_fields(status), "outcome": "exited"}
            if ident.alive():  # SIGKILL and its kill_timeout went by: it runs on
                row = ident.current(memory=False)
                raise RpcError("teardown_failed", f"pid {pid} still runs after SIGKILL and "
                               f"{kill_timeout:g}s", {"pid": pid, "survivors": [
                                   {"pid": pid, "start_time": start_time,
                                    "name": None if row is None else proc_brief(row)["name"]}]})
            return {**status_fields(None), "outcome": "unknown"}  # ended; status unreadable
        return self._in_thread(c, req, work)

    # -- the end ------------------------------------------------------------------------

    def shutdown(self) -> int:
        """Close every key side by side, deliver what is left, stop. The exit code:
        0, or 1 when a teardown could not prove every member gone. A durable sidecar
        detaches instead (every session goes on for the next sidecar), unless a
        client called ``close``."""
        code = 0
        if self.durable and not self.closed_keys:
            self.sup.detach()
        else:
            try:
                self.sup.close()
            except TeardownError as exc:
                log.error("%s", exc)  # noqa: TRY400 - names the survivors; no traceback
                code = 1
            self.sup.flush_events(_FLUSH_WAIT)
        with self._watcher_lock:
            if self._watcher is not None:
                self._watcher.close()
        # A call on a worker when the input ended (hello, ps...) is still answered.
        for c in self.clients:
            c.workers.wait(5.0)
        for c in self.clients:
            c.drain(5.0)
        return code


class _Later:
    """A method's answer comes later, from a callback."""


_LATER = _Later()


def _pinned(pid: int, start_time: int) -> Identity:
    now = identity(pid)
    if now is None:
        raise RpcError("no_such_process", f"no process {pid}", {"pid": pid})
    if now.start_time != start_time:
        raise RpcError("no_such_process", f"pid {pid} names another process now",
                       {"pid": pid, "start_time": now.start_time})
    return now


def _popen_kwargs(p: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if "cwd" in p:
        kw["cwd"] = p["cwd"]
    if "env" in p:
        kw["env"] = p["env"]
    return kw


def _policy(r: Optional[dict[str, Any]],
            fresh: Optional[Callable[[Any], Optional[list[str]]]] = None
            ) -> Optional[RestartPolicy]:
    if r is None:
        return None
    fresh_args = r.get("fresh_args")
    kw = {k: v for k, v in r.items() if k not in ("fresh_args", "fresh", "fresh_timeout")}
    if fresh is None and fresh_args is not None:
        fresh = lambda _key: fresh_args  # noqa: E731 - one fixed list
    try:
        return RestartPolicy(fresh=fresh, **kw)
    except (TypeError, ValueError) as exc:
        raise RpcError(-32602, f"restart: {exc}", {"param": "restart"}) from None


def _signum(v: Any) -> int:
    if isinstance(v, int):
        return v
    try:
        return int(signal.Signals[v])
    except KeyError:
        raise RpcError(-32602, f"no signal {v}", {"param": "signal"}) from None


def _rpc_error(exc: BaseException, req: Request) -> RpcError:
    """A failure of the package as the wire's error."""
    key = req.params.get("key")
    k = {} if key is None else {"key": key}
    if isinstance(exc, RpcError):
        return exc
    if isinstance(exc, KeyError):
        return RpcError("no_such_key", f"no key {key!r}", k)
    if isinstance(exc, SupervisorClosed):
        return RpcError("closed", "the supervisor is closed", k)
    if isinstance(exc, StartCancelled):
        return RpcError("cancelled", str(exc), k)
    if isinstance(exc, TeardownError):
        return RpcError("teardown_failed", str(exc), {**k, "survivors": [
            proc_brief(p) for p in exc.survivors]})
    missing_cwd = (req.method == "start" and isinstance(exc, FileNotFoundError)
                   and exc.filename is not None and exc.filename == req.params.get("cwd"))
    if isinstance(exc, FileNotFoundError) and not missing_cwd:
        return RpcError("command_not_found", str(exc), {**k, "errno": "ENOENT"})
    if isinstance(exc, NoSuchProcess):
        return RpcError("no_such_process", str(exc), k)
    if isinstance(exc, OSError) and exc.errno is not None and req.method == "start":
        return RpcError("spawn_failed", str(exc), {**k, "errno": errno.errorcode.get(
            exc.errno, str(exc.errno))})
    if isinstance(exc, InputBlocked):  # the command did not read within the timeout
        return RpcError("no_input", str(exc), {**k, "written": exc.written,
                                               "timeout": WRITE_TIMEOUT})
    if type(exc).__name__ in ("NoInput", "NotATerminal") or (
            isinstance(exc, ProctableError) and req.method in ("write", "resize")):
        return RpcError("no_input", str(exc), k)
    if isinstance(exc, (TypeError, ValueError)):
        return RpcError(-32602, str(exc))
    return RpcError("failed", str(exc) or type(exc).__name__, k)


def _capabilities() -> dict[str, Any]:
    f = features()
    sub = _hub.subscribe(lambda: None, False)
    if sub is not None:
        sub.close()
    rd = reader()
    return {"pidfds": f.pidfd, "pidfd_exit_info": f.pidfd_info,
            "bpf": rd.name == "bpf", "bpf_why_not": rd.why_not,
            "cgroup": SubreaperBackend.usable(None) is not None and usable_parent(None) is not None,
            "subreaper": SubreaperBackend.usable(None) is not None,
            "connector": sub is not None,
            "output": _HAS_OUTPUT, "pty": _HAS_OUTPUT}


# --- the loops ---------------------------------------------------------------------------


class _Signals:
    """SIGTERM and SIGINT end the loop: the handler only records and wakes it.

    The kernel may deliver the signal to any thread; Python's C-level handler then
    writes to the wake-up fd (``set_wakeup_fd``), so the selector wakes at once
    whichever thread took it (the Python handler runs later, on the main thread).
    """

    def __init__(self, server: Server) -> None:
        self.server = server
        self.received: Optional[int] = None
        self._old: dict[int, Any] = {}
        self._old_fd = -1

    def _handler(self, signum: int, frame: Any) -> None:
        self.received = signum
        self.server.wake()

    def __enter__(self) -> _Signals:
        for s in (signal.SIGTERM, signal.SIGINT):
            self._old[s] = signal.signal(s, self._handler)
        # A client that left mid-write must not kill the sidecar.
        self._old[signal.SIGPIPE] = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self._old_fd = signal.set_wakeup_fd(self.server._wake_w, warn_on_full_buffer=False)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.set_wakeup_fd(self._old_fd)
        for s, old in self._old.items():
            signal.signal(s, old)


def _drain_wake(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def serve_stdio(server: Server, rfd: int = 0, wfd: int = 1) -> int:
    """Serve one client on rfd/wfd until its input ends or SIGTERM/SIGINT; the exit code."""
    _widen_pipe(wfd)
    client = server.add_client(rfd, wfd, None, "stdio")
    sel = selectors.DefaultSelector()
    sel.register(server._wake_r, selectors.EVENT_READ)
    sel.register(rfd, selectors.EVENT_READ)
    with _Signals(server) as sigs:
        while sigs.received is None:
            for skey, _ in sel.select():
                if skey.fd == server._wake_r:
                    _drain_wake(server._wake_r)
                    continue
                try:
                    data = os.read(rfd, 1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                server.feed(client, data)
                if not data:
                    sigs.received = 0  # stdin ended
                    break
            if client.closed or server.ending:
                break
        code = server.shutdown()
    sel.close()
    return code


_F_SETPIPE_SZ = 1031  # Linux's fcntl; not in Python's fcntl module before 3.10 everywhere
_WIDE = 1 << 20


def _writable(fd: int) -> bool:
    """The pipe fd has a free buffer slot now (POLLOUT): a write of up to PIPE_BUF
    bytes does not block (its free bytes are no promise: the slots are whole pages)."""
    p = select.poll()
    p.register(fd, select.POLLOUT)
    return any(ev & select.POLLOUT for _, ev in p.poll(0))


def _widen_pipe(fd: int) -> None:
    """Give a pipe toward the client 1 MiB of room (64 KiB by default): one output
    line is up to about that, and a write that fits does not wait for the reader."""
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, _WIDE)
    except OSError:  # over /proc/sys/fs/pipe-max-size, or not Linux: the default stays
        pass


def _peer_uid(sock: socket.socket) -> Optional[int]:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def bind_socket(path: str) -> socket.socket:
    """A listening Unix socket at path that only this user can reach: made with mode
    0600 (umask 0177 around bind); a stale socket there is replaced, a live one refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)
        else:
            raise OSError(errno.EADDRINUSE, f"a server listens on {path} already")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock


def serve_socket(server: Server, path: str) -> int:
    """Serve every client that connects to path until SIGTERM/SIGINT; the exit code."""
    lsock = bind_socket(path)
    lsock.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(server._wake_r, selectors.EVENT_READ)
    sel.register(lsock, selectors.EVENT_READ)
    socks: dict[int, tuple[socket.socket, _Client]] = {}
    me = os.geteuid()
    n = 0
    with _Signals(server) as sigs:
        while sigs.received is None:
            for skey, _ in sel.select():
                if skey.fd == server._wake_r:
                    _drain_wake(server._wake_r)
                elif skey.fd == lsock.fileno():
                    try:
                        conn, _ = lsock.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    conn.setblocking(True)
                    try:
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * _WIDE)
                    except OSError:
                        pass
                    uid = _peer_uid(conn)
                    if uid != me:
                        _refuse(conn, uid)
                        continue
                    n += 1
                    c = server.add_client(conn.fileno(), conn.fileno(), conn, f"socket-{n}")
                    socks[conn.fileno()] = (conn, c)
                    sel.register(conn, selectors.EVENT_READ)
                else:
                    conn, c = socks[skey.fd]
                    try:
                        data = conn.recv(1 << 16)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    server.feed(c, data)
                    if not data:
                        _forget(sel, socks, server, conn, c)
            for conn, c in list(socks.values()):
                if c.closed:
                    _forget(sel, socks, server, conn, c)
            if server.ending:
                break
        sel.unregister(lsock)
        lsock.close()
        try:
            os.unlink(path)
        except OSError:
            pass
        code = server.shutdown()
    for conn, _c in socks.values():
        conn.close()
    sel.close()
    return code


def _forget(sel: selectors.BaseSelector, socks: dict[int, tuple[socket.socket, _Client]],
            server: Server, conn: socket.socket, c: _Client) -> None:
    fd = conn.fileno()
    sel.unregister(conn)
    socks.pop(fd, None)

    def close_later() -> None:
        # A peer that half-closed after its requests still reads their answers.
        c.workers.wait(10.0)
        server.drop_client(c)
        c.drain(10.0)
        conn.close()
    start_thread(close_later, "proctable-serve-close")


_REFUSALS = threading.BoundedSemaphore(16)  # refused peers read from at once, at most
_REFUSAL_LINGER = 2.0


def _refuse(conn: socket.socket, uid: Optional[int]) -> None:
    """Tell a peer of another uid it is forbidden, then close. A peer that wrote a
    request before reading must read that line, not EPIPE: so after the line and our
    end of the stream, what it sends is read and dropped for a moment (on a thread,
    at most 16 at once; past that it is closed at once)."""
    line = Protocol.error(None, RpcError("forbidden", "this sidecar serves its own user only",
                                         {"uid": uid}))
    try:
        conn.settimeout(1.0)
        conn.sendall(line)
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        conn.close()
        return
    if not _REFUSALS.acquire(blocking=False):
        conn.close()
        return
    try:
        start_thread(_linger, "proctable-serve-refused", conn)
    except NoThread:
        _REFUSALS.release()
        conn.close()


def _linger(conn: socket.socket) -> None:
    try:
        deadline = time.monotonic() + _REFUSAL_LINGER
        got = 0
        while got < (1 << 20):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            conn.settimeout(left)
            data = conn.recv(1 << 16)
            if not data:
                break
            got += len(data)
    except OSError:
        pass
    finally:
        conn.close()
        _REFUSALS.release()
