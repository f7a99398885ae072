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
    go = state.parent / "go"  # the first run exits 0 once it is there: after the kill
    first = ["sh", "-c", f"echo first; while [ ! -e '{go}' ]; do sleep 0.02; done; exit 0"]
    fresh = ["sh", "-c", "echo fresh; exec sleep 300"]
    side = Sidecar("stdio", "--state", str(state))
    try:
        p = side.peer
        p.call("hello", {"output": "binary"})
        p.call("start", {"key": "agent", "args": first, "restart": {"fresh_args": fresh}})
        if not _outputs(p, "agent", 1):  # (it may have come before start's answer)
            p.until(lambda o: o.get("method") == "output")
        side.proc.kill()
        side.proc.wait(30)
    finally:
        side.close()
    go.touch()
    side = Sidecar("stdio", "--state", str(state))
    try:
        p = side.peer
        p.call("hello", {"output": "binary"})
        try:
            assert p.event("agent", "adopted")["generation"] == 1
            assert p.event("agent", "exited")["code"] == 0
            if not _outputs(p, "agent", 2):
                p.until(lambda o: o.get("method") == "output"
                        and o["params"]["generation"] == 2)
            assert _outputs(p, "agent", 2) == b"fresh\n"
        finally:
            p.call("close")  # (a durable sidecar's SIGTERM would leave the key running)
    finally:
        side.close()


def test_hello_switching_the_output_form_mid_stream_loses_and_repeats_nothing() -> None:
    """Tried and held: a client that reads a fast 32 MiB stream while it says
    ``hello`` again and again, switching between base64 lines and binary frames,
    gets every byte once, in order (offsets contiguous, the hash whole): no frame
    is cut by a switch and no line comes in a form the client did not ask for."""
    from .test_serve_pacing import SEED, _expected, _writer
    n = 32 * MiB
    side = Sidecar("stdio")
    try:
        p = side.peer
        got = _watch(p, Got("w"))
        forms = ["binary", "base64"]
        p.call("hello", {"output": "binary"})
        p.send("start", {"key": "w", "args": _writer(n)})
        deadline = time.monotonic() + 120
        i = 0
        while not got.exited:
            if i % 50 == 0:
                p.send("hello", {"output": forms[(i // 50) % 2]})  # answered in the stream
            i += 1
            p.read(max(0.01, deadline - time.monotonic()))
        assert got.exited["code"] == 0 and got.bytes == n and got.lost == 0
        assert got.hash.hexdigest() == _expected(n), SEED
    finally:
        side.close()


def test_tail_since_of_a_generation_that_ended_in_the_gap_is_not_the_successors(
        state: Path) -> None:
    """Found by SIGKILLing a durable sidecar while a key with a restart policy wrote
    numbered lines, letting the key exit 0 and rerun (generation 2) under the next
    sidecar, then doing what docs/serve.md and the Node README's restart example do:
    ``tail`` with ``since`` = where the client stopped reading generation 1. The
    answer is generation 2's bytes from that offset (``offset`` == ``since``,
    ``dropped`` 0), which a client that checks offsets alone stitches into
    generation 1's stream: the successor's output delivered as its predecessor's.
    Only the answer's ``generation`` tells, and ``tail`` cannot be asked for a
    generation. Now ``tail`` takes ``generation`` and answers ``generation_ended``
    when that generation is no longer the current one."""
    args = ["sh", "-c", "for i in $(seq 1 40); do echo A$i; sleep 0.03; done; exit 0"]
    side = Sidecar("stdio", "--state", str(state))
    try:
        p = side.peer
        p.call("hello", {"output": "binary"})
        p.call("start", {"key": "r", "args": args, "restart": {"fast_exit": 0}})
        o = p.until(lambda o: o.get("method") == "output" and o["params"]["offset"] > 10)
        stopped = o["params"]["offset"] + o["params"]["size"]
        side.proc.kill()
        side.proc.wait(30)
    finally:
        side.close()
    side = Sidecar("stdio", "--state", str(state))
    try:
        p = side.peer
        p.call("hello", {"output": "binary"})
        p.until(lambda o: o.get("method") == "event" and o["params"]["kind"] == "created"
                and o["params"]["generation"] == 2)
        try:
            r = p.response(p.send("tail", {"key": "r", "since": stopped, "generation": 1}))
            err = r["error"]
            assert (err["code"], err["data"]["error"]) == (-32012, "generation_ended"), err
            assert (err["data"]["generation"], err["data"]["current"]) == (1, 2), err
            r = p.response(p.send("tail", {"key": "r", "since": 0, "generation": 2}))
            assert r["result"]["generation"] == 2, r
        finally:
            p.call("close")  # (a durable sidecar's SIGTERM would leave the key running)
    finally:
        side.close()
