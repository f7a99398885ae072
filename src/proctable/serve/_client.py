"""One client of the sidecar: its writer thread and queue, the budget of ``output``
notifications it may hold, the pacing of the keys it reads for, the requests the
sidecar asks of it (``fresh``), and the backlog kept for a client yet to come."""

from __future__ import annotations

import collections
import logging
import os
import select
import socket
import stat
import threading
import time
from typing import Optional, Union
from typing import Protocol as Protocol_

from .._output import Output
from .._threads import start_thread
from ._order import _Workers
from ._protocol import (
    Protocol,
    Reply,
)

log = logging.getLogger("proctable.serve")

OUTPUT_BUDGET = 8 << 20
"""Bytes of ``output`` notifications queued for one client before more are dropped
(for that client only, counted and told with ``lost``)."""
BACKLOG_LIMIT = 64 << 20
"""Bytes of responses and lifecycle notifications queued for one client that does not
read them before it is disconnected (its keys keep running)."""
WRITE_TIMEOUT = 5.0
"""Seconds a ``write`` waits for a command that does not read before it gives up, by
default (``proctable serve --write-timeout``)."""


class Host(Protocol_):
    """What a client needs of the server it belongs to (the Server, or a test's stand-in)."""

    max_line: int

    def wake(self) -> None:
        """Wake the server's loop (a paced key may be read again)."""


def _writable(fd: int) -> bool:
    """The pipe fd has a free buffer slot now (POLLOUT): a write of up to PIPE_BUF
    bytes does not block (its free bytes are no promise: the slots are whole pages)."""
    p = select.poll()
    p.register(fd, select.POLLOUT)
    return any(ev & select.POLLOUT for _, ev in p.poll(0))


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

    def __init__(self, server: Host, rfd: int, wfd: int, sock: Optional[socket.socket],
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
        self._inflight: list[_Pace] = []  # the paces of the lines being written
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
        """The peer's input ended: write what is queued, then stop. Its queued output
        holds its keys no more (pacing passes on: a peer that left is no reader a key
        waits for), though it is still written while the peer reads."""
        with self._cond:
            self._eof = True
            paces = [pace for _l, _o, pace in self._queue if pace is not None]
            paces += self._inflight  # in a write that may not end soon
            self._inflight = []
            self._queue = collections.deque(
                (line, is_output, None) for line, is_output, _pace in self._queue)
            self._cond.notify()
        _consume(paces)

    def cut(self, timeout: float) -> None:
        """Stop writing to the peer now: what is queued is forgotten, and a write
        blocked on a peer that does not read fails (its socket shut down); wait
        (bounded) until the writer thread ended, so that its fd may be closed."""
        with self._cond:
            self._cut()
        if self._thread is not None:
            self._thread.join(timeout)

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
                paces = self._inflight  # (finish() may take them while we write)
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
                with self._cond:
                    paces, self._inflight = list(self._inflight), []
                    self.closed = True
                    self._clear()
                _consume(paces)
                self.server.wake()
                return
            with self._cond:
                paces, self._inflight = list(self._inflight), []
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

    def __init__(self, server: Host) -> None:
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
