"""A durable session's keeper: starting one, and the connection to it.

``proctable-lineage keep`` (csrc/pt_session.c) starts the command under two
helpers that outlive this process: ``pt-session`` (a subreaper that only guards
the keeper) and ``pt-keeper`` (a subreaper that holds the command's terminal or
pipes, reads its output into a ring, keeps its exit status, and serves one
supervisor at a time on a Unix socket in the state directory). This module:

- :func:`launch` runs the helper and reads its status line (a :class:`Kept`);
- :class:`Connection` speaks the keeper's framed protocol: attach, the output
  and the exit as they come, acknowledgements, ``tail``, release;
- :func:`connect` reaches a keeper again (after a restart of the supervisor),
  checking that the peer is the keeper recorded (uid, pid and start time).

The lineage over a keeper is an ordinary :class:`~proctable.Lineage` of the
``cgroup`` or ``subreaper`` backend whose reaper is the keeper
(``Lineage._over_keeper``); it releases the keeper through this connection.
"""

from __future__ import annotations

import array
import collections
import errno
import os
import socket
import struct
import subprocess
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .._status import ExitStatus, decode_wait_status
from ..errors import ProctableError
from ..table import Identity, _has_pidfs
from . import _helper

__all__ = ["HDR", "Connection", "Hello", "KeeperGone", "Kept", "connect", "launch",
           "reap_if_ours", "wait_gone"]

HDR = struct.Struct("=IBBHQ")
"""A frame's header: payload length, type, stream, zero, offset."""
U64_MAX = (1 << 64) - 1
FROM_ACKED = U64_MAX
STREAMS = {1: "stdout", 2: "stderr", 3: "pty"}
TAIL_WAIT = 10.0


class KeeperGone(ProctableError):
    """The session's keeper is not there (or not the one recorded)."""


@dataclass(frozen=True)
class Kept:
    """A started session: the keeper's status line, read."""

    keeper: Identity
    session: Identity
    command: Identity
    cgroup: Optional[str]
    inside: bool


def launch(args: list[Any], popen_kwargs: dict[str, Any], *, dir_fd: int, name: str,
           key_hex: str, generation: int, ring: int, orphan_timeout: Optional[float],
           pty: Optional[tuple[int, int]], pipes: bool, stdin_pipe: bool,
           cgroup_parent: Optional[str], session_cgroup: Optional[str],
           home: Optional[str], timeout: float = 30.0) -> Kept:
    """Start args as a durable session (bounded); OSError as subprocess raises it
    for a command that cannot start, ProctableError for a helper that cannot."""
    kw = dict(popen_kwargs)
    terminal = kw.pop("terminal", None)
    if terminal is not None:
        raise ValueError("a durable session opens its terminal itself: pass pty=(rows, cols)")
    filename = kw.get("executable") or args[0]
    ignore = kw.pop("ignore_signals", [])
    status_r, status_w = os.pipe()
    try:
        extra = ["--dir-fd", str(dir_fd), "--name", name, "--key", key_hex,
                 "--generation", str(generation), "--ring", str(ring)]
        if orphan_timeout is not None:
            extra += ["--orphan-timeout-ms", str(int(orphan_timeout * 1000))]
        if pty is not None:
            extra += ["--pty", f"{pty[0]},{pty[1]}"]
        if pipes:
            extra.append("--pipes")
        if stdin_pipe:
            extra.append("--stdin-pipe")
        if cgroup_parent is not None:
            extra += ["--cgroup-parent", cgroup_parent]
        if session_cgroup is not None:
            extra += ["--session-cgroup", session_cgroup]
        if home is not None:
            extra += ["--home", home]
        argv = _helper.prepare("keep", args, kw, status_w, terminal=None, ignore=ignore,
                               extra=tuple(extra))
        kw["pass_fds"] = (*kw["pass_fds"], dir_fd)
        kw.pop("close_fds", None)
        launcher = subprocess.Popen(argv, close_fds=True, **kw)
        os.close(status_w)
        status_w = -1
        try:
            line = _helper.read_status(status_r, timeout)
        finally:
            try:
                launcher.wait(timeout=timeout)  # it exits once the session process left
            except subprocess.TimeoutExpired:
                launcher.kill()
                launcher.wait()
    finally:
        os.close(status_r)
        if status_w >= 0:
            os.close(status_w)
    if not line or line[0] != b"ok":
        if line and line[0] == b"nosubreaper":
            raise ProctableError("durable sessions need PR_SET_CHILD_SUBREAPER, which this "
                                 f"host denies ({b' '.join(line[2:]).decode(errors='replace')})")
        _helper.raise_error(line, filename)
    keeper, cmd, cmd_start, inside, handle = (int(x) for x in line[1:6])
    cgroup = None if line[6] == b"-" else os.fsdecode(line[6])
    session, session_start, keeper_start = (int(x) for x in line[7:10])
    return Kept(Identity(keeper, keeper_start), Identity(session, session_start),
                Identity(cmd, cmd_start, handle if handle and _has_pidfs() else None),
                cgroup, bool(inside))


@dataclass(frozen=True)
class Hello:
    """What the keeper says when a supervisor attaches."""

    key_hex: str
    generation: int
    keeper: Identity
    session: Identity
    command: Identity
    exited: Optional[int]     # the command's raw wait status, once it ended
    ring: int
    low: int                  # the oldest output byte the ring holds
    high: int                 # the next output byte's offset
    acked: int                # every byte before it was delivered to a supervisor
    cgroup: Optional[str]
    input: str                # "pty", "pipe" or "none"
    released: bool

    @classmethod
    def parse(cls, text: bytes) -> Hello:
        f: dict[str, list[str]] = {}
        for line in text.decode("ascii", "replace").splitlines():
            word, _, rest = line.partition(" ")
            f[word] = rest.split(" ")
        try:
            k, s, c = f["keeper"], f["session"], f["command"]
            status = f["status"]
            ring = [int(x) for x in f["ring"][:5]]
            handle: Optional[int] = int(c[2])
            return cls(f["key"][0], int(f["generation"][0]), Identity(int(k[0]), int(k[1])),
                       Identity(int(s[0]), int(s[1])),
                       Identity(int(c[0]), int(c[1]), handle if handle and _has_pidfs()
                                else None),
                       int(status[1]) if status[0] == "exited" else None,
                       ring[0], ring[1], ring[2], ring[3],
                       None if f["cgroup"][0] == "-" else " ".join(f["cgroup"]),
                       f["input"][0], f["released"][0] == "1")
        except (KeyError, IndexError, ValueError) as exc:
            raise ProctableError(f"the session's keeper said something unreadable: {exc!r}"
                                 ) from None


class Connection:
    """One supervisor's connection to a keeper.

    The supervisor's output reader calls :meth:`on_readable` when the socket has
    something (frames are parsed there: output goes to ``on_output(stream, data,
    offset)``, the command's exit resolves :attr:`exit`, ``tail`` answers resolve
    their futures, the keeper's end calls ``on_end()``); any other thread may
    send (``ack``, ``tail``, ``release``, ``end_input``), under a lock. After
    :meth:`detach` nothing is sent any more (a release included): the session goes
    on without us.
    """

    def __init__(self, sock: socket.socket, hello: Hello, input_fd: Optional[int],
                 where: Optional[tuple[int, str]] = None) -> None:
        self.sock = sock
        self.where = where  # (the sessions folder's fd, the session's name): for queries
        self.fd = sock.fileno()
        self.hello = hello
        self.input_fd = input_fd
        self.exit: Future[ExitStatus] = Future()
        self.exit.set_running_or_notify_cancel()
        self.on_output: Optional[Callable[[str, bytes, int], bool]] = None
        self.on_end: Optional[Callable[[], None]] = None
        self.ended = threading.Event()   # the keeper said "end", or the socket closed
        self.end_offset: Optional[int] = None
        self.position = hello.low        # where the output read so far ends
        self._buf = bytearray()
        self._send_lock = threading.Lock()
        self._tails: collections.deque[Future[tuple[int, bytes]]] = collections.deque()
        self._detached = False
        self._released = False
        self.release_sent = False  # the keeper was told: it ends once nothing is below it
        if hello.exited is not None:
            self._exited(hello.exited)

    # -- sending ---------------------------------------------------------------------

    def _send(self, kind: bytes, off: int = 0, payload: bytes = b"") -> bool:
        with self._send_lock:
            if self._detached:
                return False
            try:
                self.sock.sendall(HDR.pack(len(payload), kind[0], 0, 0, off) + payload)
            except OSError:
                return False
            return True

    def attach(self, offset: Optional[int] = None) -> None:
        """Ask for the output from offset on (None: from the last acknowledged byte)."""
        self._send(b"a", FROM_ACKED if offset is None else offset)

    def ack(self, offset: int) -> None:
        """Every output byte before offset was delivered."""
        self._send(b"k", offset)

    def drop_mode(self, drop: bool) -> None:
        self._send(b"m", 0, b"drop" if drop else b"block")

    def end_input(self) -> None:
        """Close the keeper's copy of the stdin pipe (ours is closed by its owner)."""
        self._send(b"e")

    def release(self) -> None:
        """The lineage is torn down: the keeper may drain, say "end" and exit. Once."""
        if self._released:
            return
        self._released = True
        self.release_sent = self._send(b"r")

    def tail(self, since: int, most: int, timeout: float = TAIL_WAIT) -> tuple[int, bytes]:
        """(offset of the first byte, bytes) of the output from ``since`` on, at most
        ``most`` bytes, as the keeper's ring holds them. Asked on a connection of its
        own: the answer never waits behind output this one is slow to read (a key
        whose consumer is behind is paced: its connection is not read meanwhile)."""
        if self.where is not None:
            return query_tail(*self.where, since, most, timeout)
        fut: Future[tuple[int, bytes]] = Future()
        # Packed first: a request is queued only once it can be sent, or the answers
        # that follow would each go to the request before theirs.
        frame = HDR.pack(8, ord("t"), 0, 0, since) + struct.pack("=Q", min(most, U64_MAX))
        with self._send_lock:
            if self._detached or self.ended.is_set():
                raise KeeperGone("the session's keeper is not connected")
            self._tails.append(fut)
            try:
                self.sock.sendall(frame)
            except OSError:
                self._tails.remove(fut)
                raise KeeperGone("the session's keeper is not connected") from None
        return fut.result(timeout=timeout)

    def detach(self) -> None:
        """Leave the session running: send nothing more, and close our end."""
        with self._send_lock:
            self._detached = True
        self._close()

    # -- receiving (the output reader's thread) -----------------------------------------

    def on_readable(self) -> bool:
        """Read and handle what came; True when the socket is done (EOF or an error)."""
        try:
            data = self.sock.recv(1 << 18)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            self._lost()
            return True
        buf = self._buf
        buf += data
        pos = 0
        n = len(buf)
        while n - pos >= HDR.size:
            length, kind, stream, _zero, off = HDR.unpack_from(buf, pos)
            if n - pos - HDR.size < length:
                break
            start = pos + HDR.size
            payload = bytes(buf[start:start + length])
            pos = start + length
            self._frame(kind, stream, off, payload)
        del buf[:pos]
        return False

    def _frame(self, kind: int, stream: int, off: int, payload: bytes) -> None:
        if kind == ord("O"):
            self.position = off + len(payload)
            cb = self.on_output
            if cb is not None:
                cb(STREAMS.get(stream, "stdout"), payload, off)
        elif kind == ord("X"):
            try:
                self._exited(int(payload))
            except ValueError:
                self._exited(None)
        elif kind == ord("T"):
            if self._tails:
                fut = self._tails.popleft()
                fut.set_result((off, payload))
        elif kind == ord("E"):
            self.end_offset = off
            self._lost()

    def _exited(self, raw: Optional[int]) -> None:
        if self.exit.done():
            return
        try:
            status = decode_wait_status(raw) if raw is not None else None
        except ValueError:
            status = None
        if status is None:
            self.exit.set_exception(ProctableError("the command's status is unknown"))
        else:
            self.exit.set_result(status)

    def _lost(self) -> None:
        """The keeper ended (said so, or its socket closed)."""
        if self.ended.is_set():
            return
        self.ended.set()
        while self._tails:
            self._tails.popleft().set_exception(KeeperGone("the session's keeper ended"))
        if not self.exit.done() and not self._detached:
            self.exit.set_exception(ProctableError(
                "the session's keeper ended without telling the command's status"))
        cb = self.on_end
        if cb is not None:
            cb()

    def _close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        """Free the socket and the input fd (the owner of the input fd closes it
        itself where it took it over)."""
        self._close()
        self.sock.close()
        self.ended.set()


def _recv_hello(sock: socket.socket, timeout: float) -> tuple[Hello, Optional[int]]:
    """The keeper's hello (and the input fd riding along), bounded."""
    sock.settimeout(timeout)
    fds: list[int] = []
    try:
        body = _recv_frame_with_fds(sock, fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        sock.settimeout(None)
    for extra in fds[1:]:
        os.close(extra)
    first = fds[0] if fds else None
    if first is not None:
        os.set_inheritable(first, False)
    return Hello.parse(body), first


def _recv_frame_with_fds(sock: socket.socket, fds: list[int]) -> bytes:
    head = b""
    while len(head) < HDR.size:
        data, anc, _flags, _addr = sock.recvmsg(HDR.size - len(head), socket.CMSG_SPACE(4))
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(raw[:len(raw) - len(raw) % a.itemsize])
                fds.extend(a)
        if not data:
            raise KeeperGone("the session's keeper closed the connection")
        head += data
    length, kind, _s, _z, _off = HDR.unpack(head)
    if kind != ord("H") or length > 1 << 16:
        raise KeeperGone("the peer does not speak the keeper's protocol")
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            raise KeeperGone("the session's keeper closed the connection")
        body += chunk
    return body


def connect(dir_fd: int, name: str, keeper: Optional[Identity], *,
            offset: Optional[int] = None, timeout: float = 5.0) -> Connection:
    """Attach to the keeper of session name (its socket in the folder dir_fd).

    The peer must be of our uid and, where ``keeper`` is given, that very process
    (pid and start time, from the socket's credentials): anything else is
    :class:`KeeperGone`, and nothing is sent to it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        return _attach(sock, dir_fd, name, keeper, offset, timeout)
    except BaseException:
        sock.close()
        raise


def _attach(sock: socket.socket, dir_fd: int, name: str, keeper: Optional[Identity],
            offset: Optional[int], timeout: float) -> Connection:
    sock.settimeout(timeout)
    try:
        sock.connect(f"/proc/self/fd/{dir_fd}/{name}.sock")
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK):
            raise KeeperGone(f"no keeper answers for session {name} ({exc.strerror})"
                             ) from None
        raise
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.geteuid():
        raise KeeperGone(f"the peer of session {name} is uid {uid}, not ours")
    if keeper is not None:
        from ..table import read  # noqa: PLC0415 - (import cost: only here)

        row = read(pid)
        if pid != keeper.pid or row is None or row.start_time != keeper.start_time:
            raise KeeperGone(f"the peer of session {name} (pid {pid}) is not its "
                             f"recorded keeper {keeper.pid}")
    try:
        sock.sendall(HDR.pack(0, ord("a"), 0, 0, FROM_ACKED if offset is None else offset))
        hello, input_fd = _recv_hello(sock, timeout)
    except (ConnectionResetError, BrokenPipeError) as exc:
        # It closed with our connection still waiting to be accepted: it was ending.
        raise KeeperGone(f"the keeper of session {name} ended as we came ({exc.strerror})"
                         ) from None
    if keeper is not None and (hello.keeper.pid != keeper.pid
                               or hello.keeper.start_time != keeper.start_time):
        if input_fd is not None:
            os.close(input_fd)
        raise KeeperGone(f"session {name}'s keeper says it is {hello.keeper}, not {keeper}")
    sock.setblocking(False)
    return Connection(sock, hello, input_fd, (dir_fd, name))


def query_tail(dir_fd: int, name: str, since: int, most: int,
               timeout: float = TAIL_WAIT) -> tuple[int, bytes]:
    """Ask the keeper of session name for its output from since on (at most most
    bytes), on a connection of its own (the keeper answers it and closes it); bounded.
    KeeperGone where no keeper answers."""
    since = max(0, min(since, FROM_ACKED - 1))
    most = max(0, min(most, (1 << 63) - 1))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(f"/proc/self/fd/{dir_fd}/{name}.sock")
            sock.sendall(HDR.pack(8, ord("t"), 0, 0, since) + struct.pack("=Q", most))
            head = _recv_exact(sock, HDR.size)
            length, kind, _s, _z, off = HDR.unpack(head)
            if kind != ord("T"):
                raise KeeperGone("the keeper answered a tail with something else")
            return off, _recv_exact(sock, length)
        except (OSError, EOFError) as exc:
            raise KeeperGone(f"the keeper of session {name} did not answer: {exc}") from None
    finally:
        sock.close()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("closed")
        buf += chunk
    return bytes(buf)


def wait_gone(ident: Identity, timeout: float) -> bool:
    """Wait (bounded) until the process ident has ended; True once it has."""
    from .. import _ended  # noqa: PLC0415
    from ..table import read  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    nap = 0.002
    while True:
        row = read(ident.pid)
        if _ended.ended(None, row, ident.start_time):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(nap, left))
        nap = min(nap * 2, 0.05)


def reap_if_ours(ident: Identity) -> None:
    """Reap ident if it is an exited child of ours: a session's guard re-parents to
    the supervisor's process where that is a subreaper (or pid 1, as a container's
    entry point is), and nobody else reaps it there. A zombie child's pid cannot
    name another process until it is reaped, so its start time proves it is ours."""
    from ..table import read  # noqa: PLC0415

    row = read(ident.pid)
    if row is None or row.ppid != os.getpid() or row.start_time != ident.start_time \
            or row.state != "Z":
        return
    try:
        os.waitpid(ident.pid, os.WNOHANG)
    except ChildProcessError:
        pass  # the app reaps its children itself: so much the better
