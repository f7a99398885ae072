"""A hostile review of the sidecar's wire (issues 29 and 31): pacing, binary frames
and durable sessions, attacked with real sidecars, real clients and real commands.
Each test names what broke and how it was found."""

from __future__ import annotations

import select
import socket
import time
from pathlib import Path

from ._serve import Peer, Sidecar
from .test_serve_pacing import Got, _watch

MiB = 1 << 20


def _read_for(peer: Peer, seconds: float) -> None:
    """Read whatever comes for about seconds (nothing coming is no failure)."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        if b"\n" not in peer.buf:

            r, _, _ = select.select([peer.rfd], [], [], left)
            if not r:
                return
        peer.read(max(0.01, deadline - time.monotonic()))


def test_a_pacing_client_that_half_closes_and_stops_reading_does_not_hold_its_key() -> None:
    """Found by a client that starts a large writer, reads none of it, then says
    goodbye with ``shutdown(SHUT_WR)`` (what Node's ``socket.end()`` does) and reads no
    more: the sidecar drops it from its clients (pacing passes on, docs/serve.md) and
    gives it 10 s to read what is queued, but the writer thread stayed blocked in
    ``writev`` holding the key's paced bytes, so the key never ran on (stalled for
    good, 45 s and more, though the other client read all the time), and the
    socket's fd was closed under the blocked writer (a number a later client may get).
    Now the queued output stops holding the key when its client leaves, and a
    client that still does not read after the drain is cut (its writer unblocked)."""
    side = Sidecar("socket")
    try:
        a = side.peer
        b = side.connect()
        b.call("hello", {"output": "binary"})
        got = _watch(b, Got("big", drops=True))
        a.call("start", {"key": "big", "args": ["head", "-c", str(64 * MiB), "/dev/zero"]})
        # The key runs, paced by A, which reads nothing: until A's socket is full and
        # the key waits for it (B gets nothing more for a second).
        deadline = time.monotonic() + 30
        seen = -1
        while seen != got.bytes and time.monotonic() < deadline:
            seen = got.bytes
            _read_for(b, 1.0)
        assert 0 < got.bytes < 64 * MiB
        side.socks[0].shutdown(socket.SHUT_WR)  # A leaves (half-closed), reading nothing
        deadline = time.monotonic() + 60
        while not got.exited:
            b.read(max(0.01, deadline - time.monotonic()))
        assert got.exited["code"] == 0
        assert got.bytes + got.dropped + got.lost == 64 * MiB
    finally:
        side.close()


def _outputs(peer: Peer, key: str, generation: int) -> bytes:
    return b"".join(Peer.data(o["params"]) for o in peer.seen if o.get("method") == "output"
                    and o["params"]["key"] == key and o["params"]["generation"] == generation)


def test_a_readopted_key_reruns_its_fresh_args_after_a_clean_exit(state: Path) -> None:
    """Found by SIGKILLing a durable sidecar while a key started with
    ``restart.fresh_args`` ran, and letting it exit 0 after the new sidecar took it
    back: docs/serve.md says a re-adopted key's clean rerun takes the fallback,
    ``fresh_args`` where it has them, but the sidecar turned ``fresh_args`` into a
    function, which the state directory cannot record, so the next sidecar reran the
    first command instead (over and over: a fresh rerun spends no budget)."""
    first = ["sh", "-c", "echo first; sleep 1.5; exit 0"]
    fresh = ["sh", "-c", "echo fresh; exec sleep 300"]
    side = Sidecar("stdio", "--state", str(state))
    try:
        p = side.peer
        p.call("hello", {"output": "binary"})
        p.call("start", {"key": "agent", "args": first, "restart": {"fresh_args": fresh}})
        p.until(lambda o: o.get("method") == "output")
        side.proc.kill()
        side.proc.wait(30)
    finally:
        side.close()
    side = Sidecar("stdio", "--state", str(state))
    try:
        p = side.peer
        p.call("hello", {"output": "binary"})
        assert p.event("agent", "adopted")["generation"] == 1
        assert p.event("agent", "exited")["code"] == 0
        p.until(lambda o: o.get("method") == "output" and o["params"]["generation"] == 2)
        assert _outputs(p, "agent", 2) == b"fresh\n"
        p.call("close")
    finally:
        side.close()
