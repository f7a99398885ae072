"""The sidecar's transports: stdio, and a Unix socket that only its own uid may use
(others are refused, read from and closed, bounded); the signals that end a serve."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import selectors
import signal
import socket
import stat
import struct
import threading
import time
from typing import Any, Optional

from .._threads import NoThread, start_thread
from ._client import _Client
from ._protocol import (
    Protocol,
    RpcError,
)
from ._server import Server

log = logging.getLogger("proctable.serve")


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
    sel: selectors.BaseSelector = selectors.DefaultSelector()
    sel.register(server._wake_r, selectors.EVENT_READ)
    try:
        sel.register(rfd, selectors.EVENT_READ)
    except PermissionError:
        # stdin is a regular file or /dev/null (``proctable serve < requests.jsonl``):
        # epoll refuses them (EPERM); poll(2) takes them and finds them readable.
        sel.close()
        sel = selectors.PollSelector()
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
    # Bound and listening under a temporary name first, then linked to path: the path
    # appears only once a connect to it is accepted (a client that waits for the file
    # and connects at once was refused between bind and listen, under load).
    tmp = os.path.join(os.path.dirname(path) or ".", f".pt-{os.getpid()}-{os.urandom(3).hex()}")
    if len(os.fsencode(tmp)) > 107:  # sun_path's room
        tmp = path  # (no room there for another name: bound where it goes, as before)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)
        try:
            sock.bind(tmp)
        finally:
            os.umask(old)
        os.chmod(tmp, 0o600)
        sock.listen(64)
        if tmp != path:
            try:
                os.link(tmp, path)  # never replaces: a server that took path meanwhile
            except FileExistsError:
                raise OSError(errno.EADDRINUSE, f"{path} was taken meanwhile") from None
            finally:
                os.unlink(tmp)
    except BaseException:
        sock.close()
        raise
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
        if not c.drain(10.0):
            # It does not read: its writer may be blocked in a write, holding the
            # bytes in hand (their keys wait) and the fd (closed under it, its number
            # could name the next client's socket). Cut it first.
            c.cut(5.0)
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
