"""The sidecar's per-client writer: a line goes out at once from the thread that sends
it when that cannot block (nothing queued, the writer idle), and otherwise through the
writer thread, in the order sent, whatever the peer's reading does."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import pytest

from proctable.serve import _client as _server_client


class _Server:
    """What a client needs of its server."""

    max_line = 1 << 20

    def wake(self) -> None:
        pass


def _client(wfd: int, sock: Any = None) -> Any:
    return _server_client._Client(_Server(), -1, wfd, sock, "test")


def _read_all(fd: int, want: int, timeout: float = 20.0) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while len(data) < want and time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            time.sleep(0.001)
            continue
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.parametrize("kind", ["socketpair", "pipe", "socket"])
def test_lines_arrive_whole_and_in_order_from_two_threads(kind: str) -> None:
    """Two senders (a dispatch thread, a worker answering) and a peer that reads late:
    some lines go out at once, some partly, the rest through the writer; the peer
    gets every line whole, each sender's in its order."""
    if kind == "pipe":
        r, w = os.pipe()
        c = _client(w)
        reader = r
    else:
        a, b = socket.socketpair()
        c = _client(b.fileno(), b if kind == "socket" else None)
        reader = a.fileno()
    n = 2000
    pad = b"x" * 300  # 2 x 2000 lines of ~330 bytes: far more than the buffers hold

    def send(tag: str) -> None:
        for i in range(n):
            c.send(f"{tag} {i} ".encode() + pad + b"\n")

    threads = [threading.Thread(target=send, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    time.sleep(0.2)  # the buffers fill up: direct writes stop, the queue takes over
    want = sum(len(f"{t} {i} ") + len(pad) + 1 for t in ("a", "b") for i in range(n))
    data = _read_all(reader, want)
    for t in threads:
        t.join(20)
    lines = data.split(b"\n")
    assert lines[-1] == b""
    lines = lines[:-1]
    assert len(lines) == 2 * n
    seen: dict[bytes, int] = {b"a": -1, b"b": -1}
    for line in lines:
        tag, num, rest = line.split(b" ", 2)
        assert rest == pad
        assert int(num) == seen[tag] + 1, (tag, num, seen)
        seen[tag] = int(num)
    c.drain(5.0)


@pytest.mark.parametrize("kind", ["socketpair", "pipe"])
def test_a_peer_that_reads_nothing_never_blocks_the_sender(kind: str) -> None:
    """Its buffer full, a line is queued (the writer thread waits for the peer), never
    written by the sender's thread (a pipe's free bytes are no promise: its slots
    are whole pages, so a small write into a pipe 60 KiB full blocked)."""
    if kind == "pipe":
        rfd, wfd = os.pipe()
    else:
        a, b = socket.socketpair()
        rfd, wfd = os.dup(a.fileno()), os.dup(b.fileno())
        a.close()
        b.close()
    c = _client(wfd)
    done = threading.Event()

    def flood() -> None:
        for i in range(5000):
            c.send(f"line {i} ".encode() + b"y" * 300 + b"\n")
        done.set()

    threading.Thread(target=flood, daemon=True).start()
    assert done.wait(10.0), "a send waited for the peer"
    got = _read_all(rfd, 1)
    assert got.startswith(b"line 0 ")
    with c._cond:
        c._cut()  # (the sidecar cuts a client off when its backlog passes the limit)
    os.close(rfd)
    c._thread.join(10.0)
    os.close(wfd)
