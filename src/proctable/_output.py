"""Owned output: the fds a command writes to, read continuously, drained and closed.

Three parts, shared by the supervisor and :meth:`Lineage.communicate`:

- :func:`drain`: read what is left in an fd without ever blocking (EOF, EAGAIN or
  EIO ends it), so that a process outside the lineage still holding the write end
  cannot keep a generation open;
- :class:`Output`: one generation's owned fds (the read ends, the pty master,
  the stdin pipe's write end) with a buffer of what was read and not yet
  delivered, and the one lock that every use of its input fd takes, so that no
  write or resize ever reaches an fd number after it was closed (and perhaps
  reused);
- :class:`Bound`: one key's bound on what waits in all of its generations'
  buffers together (beyond it the oldest bytes are dropped, and counted to the
  generation that wrote them);
- :class:`Reader`: one thread per owner that reads every registered fd with
  ``poll`` (never a thread per fd), into its Output.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import logging
import os
import select
import struct
import termios
import threading
import time
from collections.abc import Hashable
from typing import Any, Callable, Optional

from ._fdwait import readable
from ._threads import start_thread
from .errors import InputBlocked, NoInput, ProctableError

__all__ = ["Bound", "Output", "Reader", "Tail", "drain", "grow_pipe", "pending",
           "set_winsize"]

CHUNK = 65536
READ = 1 << 18  # the reader's read size: a pipe grown to 1 MiB fills in a few reads
PIPE_SIZE = 1 << 20  # F_SETPIPE_SZ asked for (pipe-max-size's default); optional
DRAIN_LIMIT = 16 << 20  # a drain reads at most this much: a writer outside cannot hold it
log = logging.getLogger("proctable.output")
_HUP = select.POLLHUP | select.POLLERR | select.POLLNVAL


def _nonblocking(fd: int) -> None:
    os.set_blocking(fd, False)


def drain(fd: int, limit: Optional[int] = None) -> list[bytes]:
    """What is left in fd, read without blocking: until EOF, EAGAIN, EIO (a pty whose
    slave side is closed) or ``limit`` bytes (``DRAIN_LIMIT`` by default). The fd is
    left non-blocking."""
    if limit is None:
        limit = DRAIN_LIMIT
    _nonblocking(fd)
    out: list[bytes] = []
    total = 0
    while total < limit:
        try:
            data = os.read(fd, min(CHUNK, limit - total))
        except BlockingIOError:
            break
        except OSError as e:
            if e.errno == errno.EIO:
                break
            raise
        if not data:
            break
        out.append(data)
        total += len(data)
    return out


def pending(fd: int) -> Optional[int]:
    """The bytes waiting to be read in a pipe or a pty master (FIONREAD), None where
    that cannot be asked."""
    try:
        buf = fcntl.ioctl(fd, termios.FIONREAD, struct.pack("i", 0))
    except OSError:
        return None
    n: int = struct.unpack("i", buf)[0]
    return n


def grow_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe (fewer wake-ups for a chatty child); a refusal is fine."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, AttributeError):
        pass


def set_winsize(fd: int, rows: int, cols: int) -> None:
    """Set a terminal's size (the foreground group gets SIGWINCH when it changes)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Tail:
    """The last bytes a key wrote, all streams in read order, across its generations
    (at least ``keep`` of them once that much was written; chunks are kept whole,
    so adding one never copies what is kept), each with its generation and its
    offset in that generation's output (for :meth:`since`)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._chunks: collections.deque[tuple[object, int, bytes]] = collections.deque()
        self._size = 0
        self._lock = threading.Lock()
        self._last: object = None  # the owner (a generation's Output) of the last chunk

    def add(self, data: bytes, owner: object = None, offset: int = 0) -> None:
        with self._lock:
            self._last = owner
            self._chunks.append((owner, offset, data))
            self._size += len(data)
            while self._size - len(self._chunks[0][2]) >= self.keep:
                self._size -= len(self._chunks.popleft()[2])

    def get(self, n: int) -> bytes:
        n = min(n, self.keep)
        if n <= 0:
            return b""
        with self._lock:
            parts: list[bytes] = []
            size = 0
            for _g, _o, chunk in reversed(self._chunks):
                parts.append(chunk)
                size += len(chunk)
                if size >= n:
                    break
        return b"".join(reversed(parts))[-n:]

    def since(self, offset: int, most: int) -> tuple[int, bytes]:
        """(where the bytes start, the bytes) of the latest generation's output from
        offset on (at most ``most``), as far as they are kept: a start past offset
        means the bytes in between are no longer kept."""
        with self._lock:
            owner = self._last
            picked = [(o, d) for g, o, d in self._chunks
                      if g is owner and o + len(d) > offset]
            ends = [o + len(d) for g, o, d in self._chunks if g is owner]
        if not picked:
            return (max(offset, ends[-1] if ends else offset), b"")
        first, data0 = picked[0]
        skip = max(0, offset - first)
        start = first + skip
        out = b"".join([data0[skip:], *(d for _o, d in picked[1:])])
        return start, out[:most]



class Bound:
    """One key's bound on output read and not yet delivered, over the buffers of all
    of its generations together.

    By default it paces the command, as a pipe does: once ``limit`` bytes are read
    and not yet consumed (``outstanding``: in the buffers, or taken and not yet
    delivered), the reader stops reading the key's fds, and reads on once the
    consumer has brought that under half the limit. Nothing is dropped; a command
    that writes faster than its consumer reads waits.

    With ``drop`` (the key's choice, for output nobody must see whole), past
    ``limit`` bytes in the buffers the oldest are dropped instead: those of the
    oldest generation that still has some (a predecessor's output is delivered
    before its successor's, so its bytes are the oldest in delivery order too), its
    oldest first. A dropped byte is counted to the generation that wrote it, never
    to another: that generation's next output (or, when nothing of it is left, an
    output without data, still before its ``exited``) says how many. ``lock``
    guards every buffer of the key.
    """

    def __init__(self, limit: int, drop: bool = False) -> None:
        self.limit = limit
        self.drop = drop
        self.lock = threading.Lock()
        self.size = 0  # bytes waiting in all of the key's buffers
        self.outstanding = 0  # read and not yet consumed (taken or not)
        self.paused: list[Output] = []  # whose fds the reader stopped reading
        self._outputs: collections.deque[Output] = collections.deque()  # in launch order

    def over(self) -> bool:
        """The key is paced now (under the lock): its reads wait for its consumer."""
        return not self.drop and self.outstanding >= self.limit

    def join(self, out: Output) -> None:
        with self.lock:
            self._outputs.append(out)

    def shed(self) -> None:
        """Drop the key's oldest bytes until it is within the limit (under the lock)."""
        self.tidy()
        while self.size > self.limit:
            victim = next(o for o in self._outputs if o._size)
            self.size -= victim._cut(self.size - self.limit)

    def tidy(self) -> None:
        """Forget the oldest buffers that are empty for good (under the lock)."""
        outs = self._outputs
        while outs and outs[0]._sealed and not outs[0]._chunks:
            outs.popleft()

    def __len__(self) -> int:
        """The buffers still followed (for tests: they do not pile up)."""
        with self.lock:
            return len(self._outputs)


class Output:
    """One generation's owned fds and what was read from them, not yet delivered.

    ``streams`` maps each read fd to its stream name (``stdout``, ``stderr``,
    ``pty``); ``input`` is the fd that ``write`` uses (the pty master or the stdin
    pipe's write end), None without one. ``notify`` is called (outside any lock)
    when data waits and nobody was told yet; ``take`` hands it over. What waits
    counts against the key's ``bound``, shared with its other generations.
    """

    def __init__(self, streams: dict[int, str], input_fd: Optional[int], pty: bool,
                 bound: Bound, tail: Tail) -> None:
        self.streams = streams
        self.input = input_fd
        self.had_input = input_fd is not None  # (input goes None once closed)
        self.pty = pty
        self.bound = bound
        self.tail = tail
        self.notify: Optional[Callable[[Output], None]] = None
        self.reader: Optional[Reader] = None  # the reader of its fds (to read on after a pause)
        self.key: Hashable = None         # set by the owner, for its events
        self.identity: Any = None
        self.generation = 0
        self.finished = False
        self._closing = False  # finish() began: a write waiting for room gives up
        self.io_lock = threading.Lock()   # every use of an fd of ours other than reading
        self._lock = bound.lock           # the buffer (the key's, shared by its generations)
        # (stream, data, offset): the offset of data's first byte in the generation's
        # output. A gap between what was taken last and the next chunk is what was
        # dropped there (a chunk cut at the front keeps its end): the offsets are
        # the count, never a separate counter.
        self._chunks: collections.deque[tuple[str, bytes, int]] = collections.deque()
        self._size = 0
        self.position = 0       # where the next byte read goes (also past dropped ones)
        self._taken = 0         # where what was taken ends (the next output's start)
        self._last_stream = ""  # the stream of the last chunk added or cut
        self._scheduled = False
        self._live = False
        self._sealed = False  # nothing more will be added
        for fd in streams:
            _nonblocking(fd)
        if input_fd is not None:
            _nonblocking(input_fd)
        bound.join(self)

    # -- filling and emptying the buffer --------------------------------------------------

    def add(self, stream: str, data: bytes, offset: Optional[int] = None) -> bool:
        """Keep data (read from stream; ``offset`` where its first byte is in the
        generation's output, by default right after what came before: a larger one
        says the bytes in between were dropped before they got here); past the
        key's bound, drop its oldest and count it. True when more than half the
        bound waits (the reader then lets the consumer run before it reads on)."""
        tell = False
        b = self.bound
        with self._lock:
            at = self.position if offset is None else max(offset, self.position)
            self.position = at + len(data)
            self._last_stream = stream
            self.tail.add(data, self, at)
            self._chunks.append((stream, data, at))
            self._size += len(data)
            b.size += len(data)
            b.outstanding += len(data)
            if b.drop and b.size > b.limit:
                b.shed()
            if self._live and not self._scheduled:
                self._scheduled = tell = True
            full = b.over() if not b.drop else 2 * b.size > b.limit
        if tell and self.notify is not None:
            self.notify(self)
        return full

    def _cut(self, most: int) -> int:
        """Drop at most ``most`` of the oldest bytes waiting here (under the lock): how
        many were dropped (the gap they leave is counted for this generation's next
        output)."""
        s, old, at = self._chunks[0]
        cut = min(len(old), most)
        if cut == len(old):
            self._chunks.popleft()
            if not self._chunks:  # nothing after it to carry the count: a marker
                self._chunks.append((s, b"", at + cut))
        else:
            self._chunks[0] = (s, old[cut:], at + cut)
        self._size -= cut
        return cut

    def lost(self, stream: str, n: int) -> None:
        """Count n bytes of stream that were never read (a drain that hit its limit):
        they come after everything read, so they are told after it."""
        if n <= 0:
            return
        with self._lock:
            self.position += n
            self._chunks.append((stream, b"", self.position))

    def discard(self) -> None:
        """The generation never ran (its spawn failed): nothing of it is kept or told."""
        with self._lock:
            self.bound.size -= self._size
            self.bound.outstanding -= self._size
            self._chunks.clear()
            self._size = 0
            self._sealed = True
            self.bound.tidy()

    def go_live(self, generation: int, identity: Any = None) -> None:
        """The generation was announced (``created``): what is read may be delivered."""
        tell = False
        with self._lock:
            self.generation = generation
            self.identity = identity
            self._live = True
            if self._chunks and not self._scheduled:
                self._scheduled = tell = True
        if tell and self.notify is not None:
            self.notify(self)

    def take(self, most: int = 1 << 20) -> list[tuple[str, bytes, int, int]]:
        """What waits, as (stream, data, dropped before it, offset of data's first
        byte); adjacent chunks of a stream are joined up to ``most`` bytes. Everything
        waiting is taken; a count of bytes dropped with nothing after them comes as
        (stream, b"", dropped, the offset after them). Nothing is given for a
        generation never announced (a discarded launch): it has no number."""
        with self._lock:
            b = self.bound
            b.size -= self._size
            chunks = list(self._chunks)
            self._chunks.clear()
            self._size = 0
            self._scheduled = False
            live = self._live
            cursor = self._taken
            if chunks:
                _s, last_d, last_at = chunks[-1]
                self._taken = last_at + len(last_d)
            b.tidy()
        if not live:
            return []
        out: list[tuple[str, bytes, int, int]] = []
        run: list[bytes] = []
        size = dropped = start = 0
        stream = ""
        for s, data, at in chunks:
            gap = max(0, at - cursor)
            if run and (s != stream or gap or size + len(data) > most):
                out.append((stream, b"".join(run), dropped, start))
                run, size, dropped = [], 0, 0
            if not data:  # a marker: the count of a drop with nothing after it (yet)
                dropped += gap
                cursor = at
                if dropped:
                    out.append((s, b"", dropped, at))
                    dropped = 0
                continue
            if not run:
                start = at
                dropped += gap
            stream = s
            run.append(data)
            size += len(data)
            cursor = at + len(data)
        if run:
            out.append((stream, b"".join(run), dropped, start))
        return out

    def delivered(self, offset: int) -> None:
        """Every byte before offset went to the consumer (a keeper is told so)."""

    def consumed(self, n: int) -> None:
        """n bytes of what was taken went to the consumer, or are gone for good: the
        key's pace counts them no more (the reader reads its fds again once the
        outstanding bytes are under half the bound)."""
        if n <= 0:
            return
        b = self.bound
        with self._lock:
            b.outstanding = max(0, b.outstanding - n)
            wake = b.paused if b.paused and 2 * b.outstanding <= b.limit else []
            if wake:
                b.paused = []
        for out in wake:
            reader = out.reader
            if reader is not None:
                reader.resume(out)

    def pull(self, fd: int, ev: int) -> tuple[bool, bool]:
        """Read what fd has (the reader thread's call when poll says it has some):
        (more than half the key's bound waits, fd is done: EOF or EIO)."""
        try:
            data = os.read(fd, READ)
        except BlockingIOError:
            return False, False
        except OSError:  # EIO: a pty whose every slave fd is closed
            data = b""
        if data:
            return self.add(self.streams[fd], data), False
        return False, bool(ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR))

    # -- input -------------------------------------------------------------------------

    def write(self, data: bytes, timeout: float) -> int:
        """Write all of data within timeout; InputBlocked past it, NoInput without input."""
        view = memoryview(data)
        done = 0
        deadline = time.monotonic() + timeout
        with self.io_lock:
            fd = self.input
            if fd is None or self.finished:
                raise NoInput("no input to write to: the key's input is closed")
            while done < len(view):
                try:
                    done += os.write(fd, view[done:done + CHUNK])
                    continue
                except BlockingIOError:
                    pass
                except BrokenPipeError:
                    raise NoInput("the command closed its input") from None
                if self._closing:
                    raise NoInput("the generation ended while this write waited")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise InputBlocked(f"only {done} of {len(view)} bytes could be written "
                                       f"within {timeout:g}s: the command does not read "
                                       "its input", done)
                p = select.poll()
                p.register(fd, select.POLLOUT)
                ev = p.poll(max(1, int(min(left, 0.05) * 1000)))  # and look at _closing
                if ev and ev[0][1] & _HUP and not ev[0][1] & select.POLLOUT:
                    raise NoInput("the command's input is closed at the other end")
        return done

    def close_input(self) -> None:
        """EOF on the input: close a stdin pipe; on a pty, write the EOF character."""
        with self.io_lock:
            fd = self.input
            if fd is None or self.finished:
                raise NoInput("no input to close: the key's input is closed already")
            if not self.pty:
                self.input = None
                os.close(fd)
                return
            try:
                eof = termios.tcgetattr(fd)[6][termios.VEOF]
            except termios.error:
                eof = b"\x04"
            eof = eof if isinstance(eof, bytes) else bytes([eof])
        self.write(eof, 5.0)

    def resize(self, rows: int, cols: int) -> None:
        with self.io_lock:
            if not self.pty or self.input is None or self.finished:
                raise NoInput("no terminal to resize: the key was not started with pty=")
            set_winsize(self.input, rows, cols)

    # -- the end -----------------------------------------------------------------------

    def finish(self, reader: Optional[Reader]) -> None:
        """The generation ended (its lineage is torn down): stop reading, read what is
        left without blocking, close every fd. Idempotent."""
        if self.finished:
            return
        self._closing = True
        if reader is not None:
            reader.remove(self)
        for fd, stream in self.streams.items():
            try:
                got = drain(fd)
            except OSError:  # the fd is ours and open: a read error ends its stream
                continue
            for data in got:
                self.add(stream, data)
        with self.io_lock:
            self.finished = True
            fds = set(self.streams)
            if self.input is not None:
                fds.add(self.input)
            self.input = None
            # What the pipe holds now (a drain stopped at its limit, or a writer
            # outside the lineage wrote after its last read) is discarded by the
            # close: counted as dropped, never lost silently. Looked at right before
            # each close; only what such a writer adds in between goes uncounted.
            for fd in fds:
                name = self.streams.get(fd)
                if name is not None:
                    left = pending(fd)
                    if left is None:  # pragma: no cover - pipes and ptys answer FIONREAD
                        log.warning("output of %r: the bytes left unread in %s are "
                                    "unknown", self.key, name)
                    else:
                        self.lost(name, left)
                try:
                    os.close(fd)
                except OSError:  # pragma: no cover - each fd is closed once, here
                    pass
        with self._lock:
            self._sealed = True


class KeptOutput(Output):
    """A durable session's output: the keeper reads the command's fds into its ring,
    and this reads the keeper's connection (a :class:`proctable.lineage._session.Connection`),
    whose frames carry each chunk's offset. The input fd (pty master or stdin pipe)
    came with the keeper's hello. Delivered bytes are acknowledged to the keeper,
    so that a supervisor after this one asks for what this one never delivered."""

    def __init__(self, conn: Any, pty: bool, bound: Bound, tail: Tail) -> None:
        super().__init__({conn.fd: "keeper"}, conn.input_fd, pty, bound, tail)
        self.conn = conn
        # From the last byte a supervisor acknowledged: where the ring no longer holds
        # what came after it (it overflowed while nobody read), the first output
        # event's offset jumps past the lost bytes, and its ``dropped`` counts them.
        self.position = self._taken = conn.hello.acked
        self._acked = self.position
        self._full = False
        conn.on_output = self._got

    def _got(self, stream: str, data: bytes, offset: int) -> bool:
        self._full = self.add(stream, data, offset) or self._full
        return self._full

    def pull(self, fd: int, ev: int) -> tuple[bool, bool]:
        self._full = False
        done = self.conn.on_readable()
        return self._full, done

    def delivered(self, offset: int) -> None:
        if offset > self._acked:
            self._acked = offset
            self.conn.ack(offset)

    def close_input(self) -> None:
        if not self.pty:
            with self.io_lock:
                fd = self.input
                if fd is None or self.finished:
                    raise NoInput("no input to close: the key's input is closed already")
                self.input = None
                os.close(fd)
            self.conn.end_input()
            return
        super().close_input()

    def finish(self, reader: Optional[Reader], timeout: float = 10.0) -> None:
        """The generation ended and the keeper was released: wait (bounded) until it
        said "end" (every byte of the output came through), then close."""
        if self.finished:
            return
        self._closing = True
        if reader is None or not reader.running:
            # Nobody reads the connection any more (the supervisor detached while this
            # teardown went on): read it here, to its end, bounded.
            deadline = time.monotonic() + timeout
            while not self.conn.ended.is_set() and time.monotonic() < deadline:
                if readable([self.conn.fd], min(0.1, max(0.0, deadline - time.monotonic()))):
                    self.conn.on_readable()
        if not self.conn.ended.wait(timeout):
            log.warning("output of %r: the session's keeper did not end within %gs",
                        self.key, timeout)
        if reader is not None:
            reader.remove(self)
        with self.io_lock:
            self.finished = True
            fd, self.input = self.input, None
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
            end = self.conn.end_offset
            if end is not None and end > self.position:  # (never: it sent all it had)
                self.lost("keeper", end - self.position)
            self.conn.close()
        with self._lock:
            self._sealed = True

    def let_go(self, reader: Optional[Reader]) -> None:
        """The supervisor detaches: stop reading, leave the session and its fds to the
        keeper (nothing is released, nothing more is delivered)."""
        if reader is not None:
            reader.remove(self)
        with self.io_lock:
            self.finished = True
            fd, self.input = self.input, None
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.conn.detach()
        self.conn.close()
        with self._lock:
            self._sealed = True


class Reader:
    """One thread that reads every registered Output's fds, with epoll (a wake-up
    costs what is ready, not what is registered: poll(2) over 50 keys' pipes spent
    more time in the kernel than the reads).

    Registrations and removals go through a queue and a wake-up pipe, so only the
    thread touches the poll set; ``remove`` returns once the thread let go of the
    Output's fds (bounded), so that its owner may drain and close them. A key that
    is paced (its bound says its consumer is behind) has its fds taken out of the
    poll set by the thread itself, and put back by ``resume`` (from the consumer's
    thread, through the queue).

    The thread never ends of a failure: an fd that epoll refuses is left to its
    owner's teardown (which drains it), anything else that fails in a turn makes a
    new poll set of the fds it reads; each failure goes to ``on_fault(error, what,
    output)`` (and is logged without one).
    """

    def __init__(self, name: str = "proctable-output",
                 on_fault: Optional[Callable[[BaseException, str, Optional[Output]], None]]
                 = None) -> None:
        self._name = name
        self._on_fault = on_fault
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._ops: collections.deque[tuple[str, Output, Optional[threading.Event]]] = (
            collections.deque())
        self._fds: dict[int, Output] = {}
        self._paused: dict[int, Output] = {}  # fds not polled while their key is paced
        self._closed = False
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def add(self, out: Output) -> None:
        with self._lock:
            if self._closed:
                raise ProctableError("the output reader is closed")
            if self._thread is None:
                self._thread = start_thread(self._run, self._name)
            out.reader = self
            self._ops.append(("add", out, None))
        self._wake()

    @property
    def running(self) -> bool:
        """Its thread reads (not closed)."""
        with self._lock:
            return not self._closed

    def resume(self, out: Output) -> None:
        """Read out's fds again (its key's consumer caught up)."""
        with self._lock:
            if self._closed:
                return
            self._ops.append(("resume", out, None))
        self._wake()

    def remove(self, out: Output, timeout: float = 5.0) -> None:
        done = threading.Event()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                return
            self._ops.append(("remove", out, done))
        self._wake()
        if threading.current_thread() is not self._thread:
            done.wait(timeout)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            t = self._thread
        self._wake()
        if t is not None and t is not threading.current_thread():
            t.join(5.0)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _pause(self, poll: select.epoll, out: Output) -> None:
        """Stop reading out's fds while its key is over its bound (decided under the
        key's lock, where the consumer looks: a resume never goes unheard)."""
        b = out.bound
        with b.lock:
            if not b.over():
                return  # consumed meanwhile
            if out not in b.paused:
                b.paused.append(out)
        for fd in out.streams:
            if self._fds.get(fd) is out:
                del self._fds[fd]
                poll.unregister(fd)
                self._paused[fd] = out

    @property
    def failed(self) -> bool:
        """The thread ended without being closed (it never should: for health)."""
        t = self._thread
        return t is not None and not t.is_alive() and not self._closed

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # a wake-up is pending already

    def _fault(self, exc: BaseException, what: str, out: Optional[Output]) -> None:
        if self._on_fault is None:
            log.error("output reader: %s", what, exc_info=exc)
            return
        try:
            self._on_fault(exc, what, out)
        except Exception:  # the reader goes on whatever its owner does with it
            log.exception("output reader: reporting %s", what)

    def _run(self) -> None:
        pause = 0.0
        while True:
            poll = select.epoll()
            try:
                self._loop(poll)
            except Exception as exc:  # a new poll set of the same fds; never the end
                self._fault(exc, "reading the owned output failed; the reader goes on "
                            "with a new poll set", None)
            else:
                return
            finally:
                poll.close()
            pause = min(max(pause * 2, 0.01), 1.0)  # a failure that repeats must not spin
            time.sleep(pause)

    def _loop(self, poll: select.epoll) -> None:
        poll.register(self._wake_r, select.EPOLLIN)
        for fd in list(self._fds):  # after a failure: what was read before it
            try:
                poll.register(fd, select.EPOLLIN)
            except OSError:
                del self._fds[fd]  # its owner's teardown drains it
        while True:
            with self._lock:
                ops = list(self._ops)
                self._ops.clear()
                closed = self._closed
            for op, out, done in ops:
                for fd in out.streams:
                    if op == "add":
                        try:
                            poll.register(fd, select.EPOLLIN)
                        except OSError as exc:  # left to the teardown, which drains it
                            self._fault(exc, f"cannot watch the output fd {fd}; it is read "
                                        "at its generation's teardown", out)
                            continue
                        self._fds[fd] = out
                    elif op == "resume":
                        if self._paused.get(fd) is out:
                            del self._paused[fd]
                            try:
                                poll.register(fd, select.EPOLLIN)
                            except OSError as exc:  # left to the teardown, which drains it
                                self._fault(exc, f"cannot watch the output fd {fd} again; "
                                            "it is read at its generation's teardown", out)
                                continue
                            self._fds[fd] = out
                    elif self._fds.pop(fd, None) is not None:
                        try:
                            poll.unregister(fd)
                        except OSError:  # closed by its owner already: not watched any more
                            pass
                    else:
                        self._paused.pop(fd, None)
                if done is not None:
                    done.set()
            if closed:
                return
            crowded = False
            for fd, ev in poll.poll():
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                out2 = self._fds.get(fd)
                if out2 is None:
                    continue
                full, at_end = out2.pull(fd, ev)
                if at_end:
                    del self._fds[fd]
                    poll.unregister(fd)
                elif full and not out2.bound.drop:
                    self._pause(poll, out2)
                else:
                    crowded = crowded or full
            if crowded:
                # A buffer is half full: give the GIL to the consumer for a moment
                # rather than drop. Bounded: a consumer that is stuck only slows
                # the reading by a millisecond a round, and then the oldest goes.
                time.sleep(0.001)


class Collected:
    """What :func:`read_until` read so far from each fd (kept across calls, so that a
    caller whose wait timed out may call again without losing a byte)."""

    def __init__(self) -> None:
        self.chunks: dict[int, list[bytes]] = {}
        self.fed = 0  # bytes of the input written
        self.data = b""  # the input (the first call's: a call after a timeout goes on with it)


def read_until(reads: list[int], write: Optional[int], data: bytes, ended: Optional[int],
               still_running: Callable[[], bool], got: Collected,
               deadline: Optional[float], close_write: Callable[[], None]) -> bool:
    """Read ``reads`` (and feed ``data`` to ``write``, then ``close_write()``) until
    the process has ended (``ended``, a pidfd, polls readable; or ``still_running()``
    says False, looked at every 50 ms without a pidfd). True once it ended, False at
    the deadline. Never waits for EOF: a process outside still holding a pipe
    cannot keep this open. The fds are made non-blocking."""
    for fd in reads:
        _nonblocking(fd)
        got.chunks.setdefault(fd, [])
    open_reads = set(reads)
    if write is not None:
        _nonblocking(write)
        if got.fed >= len(data):
            close_write()
            write = None
    while True:
        if not still_running():
            return True
        p = select.poll()
        for fd in open_reads:
            p.register(fd, select.POLLIN)
        if write is not None:
            p.register(write, select.POLLOUT)
        if ended is not None:
            p.register(ended, select.POLLIN)
        step = 0.05 if ended is None else 1.0
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            step = min(step, left)
        for fd, ev in p.poll(max(1, int(step * 1000))):
            if fd == ended:
                continue  # still_running() says so at the top
            if fd == write:
                try:
                    got.fed += os.write(fd, data[got.fed:got.fed + CHUNK])
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    got.fed = len(data)
                if got.fed >= len(data):
                    close_write()
                    write = None
                continue
            try:
                chunk = os.read(fd, CHUNK)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if chunk:
                got.chunks[fd].append(chunk)
            elif ev & (select.POLLIN | _HUP):
                open_reads.discard(fd)
