"""Durable sessions over the wire: ``proctable serve --state PATH``.

A real sidecar is spoken to by the wire only; it is SIGKILLed, or asked to
detach, and a new one on the same state directory gives a reconnecting client
its sessions back (``adopted`` events, output by offset, ``tail`` with ``since``).
What runs is checked by the sessions' markers in the process table.
"""

from __future__ import annotations

import base64
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import proctable

from ._durable import marked, session_names
from ._serve import Peer, Sidecar
from .conftest import wait_until

COUNTER = "i=0; while :; do echo $i; i=$((i+1)); sleep 0.01; done"


def _outputs(peer: Peer, key: str) -> list[dict[str, Any]]:
    return [o["params"] for o in peer.seen if o.get("method") == "output"
            and o["params"]["key"] == key]


def _stitch(pieces: list[tuple[int, bytes]]) -> bytes:
    """The bytes of a key's output from pieces (offset, data), each byte once by its
    offset; a gap fails the test (nothing was dropped)."""
    out = bytearray()
    for off, data in sorted(pieces, key=lambda p: p[0]):
        assert off <= len(out), f"a gap before offset {off} (have {len(out)})"
        out += data[len(out) - off:]
    return bytes(out)


def _seen(p: Peer, pred: Any, timeout: float = 30.0) -> dict[str, Any]:
    """The first object read so far, or to come, that pred accepts."""
    for o in p.seen:
        if pred(o):
            return o
    return p.until(pred, timeout)


def _numbers(data: bytes) -> list[int]:
    return [int(x) for x in data[:data.rfind(b"\n") + 1].decode().split()]


def test_a_killed_durable_sidecar_gives_the_next_one_its_sessions(state: Path) -> None:
    """SIGKILL of ``proctable serve --state``: the sessions run on (a counter, a pty
    shell with a job, one that exits with code 7 meanwhile); a new sidecar on the same
    directory tells its client ``adopted`` for each (then the exit 7, exact), and
    the counter's numbered lines are all there once, from the events before the
    kill, ``tail`` with ``since`` and the events after."""
    go = state.parent / "go"  # seven exits once it is there: after the kill
    side = Sidecar("stdio", "--state", str(state))
    try:
        p = side.peer
        assert p.call("hello")["capabilities"]["durable"] is True
        p.call("start", {"key": "count", "args": ["sh", "-c", COUNTER]})
        p.call("start", {"key": "shell", "args": ["sh"], "pty": {"rows": 24, "cols": 80}})
        p.call("write", {"key": "shell", "data_b64": base64.b64encode(
            b"nohup sleep 390 >/dev/null 2>&1 & echo J$((1+1))\n").decode()})
        seven = p.call("start", {"key": "seven", "args": [
            "sh", "-c", f"while [ ! -e '{go}' ]; do sleep 0.02; done; exit 7"]})
        _seen(p, lambda o: o.get("method") == "output" and o["params"]["key"] == "shell"
              and b"J2" in base64.b64decode(o["params"]["data_b64"]))
        _seen(p, lambda o: o.get("method") == "output" and o["params"]["key"] == "count"
              and o["params"]["offset"] > 30)
        before = [(o["offset"], base64.b64decode(o["data_b64"])) for o in _outputs(p, "count")]
        last = max(off + len(d) for off, d in before)
        names = session_names(state)
        side.proc.kill()
        side.proc.wait(30)
    finally:
        side.close()
    assert len(marked(names)) >= 4  # counter, shell, its job, seven
    go.touch()  # seven exits while no sidecar is there
    wait_until(lambda: _ended(seven["pid"], seven["start_time"]), timeout=30, interval=0.02)
    side = Sidecar("stdio", "--state", str(state))
    try:
        p = side.peer
        p.call("hello")
        for key in ("count", "shell", "seven"):
            assert p.event(key, "adopted")["generation"] == 1
        ex = p.event("seven", "exited")
        assert ex["status"] == "exited" and ex["code"] == 7
        replay = p.call("tail", {"key": "count", "since": last})
        assert replay["dropped"] == 0 and replay["offset"] == last
        _seen(p, lambda o: o.get("method") == "output" and o["params"]["key"] == "count"
              and o["params"]["offset"] > replay["end"])
        after = [(o["offset"], base64.b64decode(o["data_b64"])) for o in _outputs(p, "count")]
        nums = _numbers(_stitch([*before, (replay["offset"],
                                           base64.b64decode(replay["data_b64"])), *after]))
        assert nums == list(range(len(nums))) and len(nums) > 20
        p.call("write", {"key": "shell", "data_b64": base64.b64encode(
            b"echo al$((1+1))ve\n").decode()})
        _seen(p, lambda o: o.get("method") == "output" and o["params"]["key"] == "shell"
              and b"al2ve" in base64.b64decode(o["params"]["data_b64"]))
        members = p.call("members", {"key": "shell"})["members"]
        assert len(members) == 2  # the shell and its nohup job
        p.call("close")
        assert not marked(names)
    finally:
        side.close()


def test_an_upgrade_detaches_the_old_sidecar_and_the_new_one_adopts(state: Path) -> None:
    """The old sidecar is asked to ``detach`` (it answers, then exits 0 leaving every
    session running); the new one, on the same directory, adopts them. A sidecar
    whose input ends (its app quit) detaches too."""
    old = Sidecar("stdio", "--state", str(state))
    try:
        old.peer.call("start", {"key": "a", "args": ["sleep", "300"]})
        old.peer.call("detach")
        assert old.wait(30) == 0
    finally:
        old.close()
    names = session_names(state)
    assert len(marked(names)) == 1
    mid = Sidecar("stdio", "--state", str(state))
    try:
        assert mid.peer.event("a", "adopted")["generation"] == 1
        mid.end_input()  # the app quits: the sessions go on
        assert mid.wait(30) == 0
    finally:
        mid.close()
    assert len(marked(names)) == 1
    new = Sidecar("stdio", "--state", str(state))
    try:
        new.peer.event("a", "adopted")
        assert new.peer.call("start", {"key": "a", "args": ["sleep", "301"]})["generation"] == 2
        new.peer.call("close")
    finally:
        new.close()
    assert not marked(session_names(state))


def test_events_while_no_client_is_connected_wait_for_the_next_one(state: Path) -> None:
    """Socket mode: the client leaves (its app restarts); what happens meanwhile (an
    exit, output) is kept for the next client that connects, in order."""
    side = Sidecar("socket", "--state", str(state))
    try:
        p = side.peer
        r = p.call("start", {"key": "k", "args": ["sh", "-c", "sleep 0.5; echo bye; exit 3"]})
        side.socks.pop().close()  # the client leaves
        wait_until(lambda: _ended(r["pid"], r["start_time"]), timeout=30, interval=0.02)
        q = side.connect()
        ex = q.event("k", "exited")
        assert ex["code"] == 3
        outs = [o for o in q.seen if o.get("method") == "output"]
        assert [base64.b64decode(o["params"]["data_b64"]) for o in outs] == [b"bye\n"]
        q.call("close")
    finally:
        side.close()


def test_detach_needs_a_durable_sidecar() -> None:
    side = Sidecar("stdio")
    try:
        err = side.peer.fails("detach")
        assert err["data"]["error"] == "not_supported"
        assert side.peer.call("hello")["capabilities"]["durable"] is False
    finally:
        side.close()


def test_a_bad_state_directory_is_a_clear_error_at_start(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "bad"
    bad.mkdir(mode=0o755)
    os.chmod(bad, 0o755)
    r = subprocess.run([sys.executable, "-m", "proctable", "serve", "--state", str(bad)],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 1 and "mode 0755" in r.stderr, r.stderr


@pytest.mark.parametrize("transport", ["stdio", "socket"])
def test_a_sidecar_killed_while_a_client_was_behind_loses_nothing_the_ring_holds(
        state: Path, transport: str) -> None:
    """A client that did not read for a while (the key paced by it: more than its
    pipe holds waits in the sidecar), then the sidecar SIGKILLed with those lines
    unwritten: the next sidecar replays from the last byte the first one wrote to
    the client, so the client, by offsets, has every byte once."""
    # More than the client's pipe (1 MiB) or socket buffer (8 MiB) holds: 2.7 MB, 11 MB.
    n = 400_000 if transport == "stdio" else 1_500_000
    side = Sidecar(transport, "--state", str(state), "--ring-size", str(16 << 20))
    try:
        p = side.peer
        p.send("start", {"key": "k", "args": ["sh", "-c", f"seq 1 {n}; exec sleep 300"]})
        # Nothing read meanwhile, until every line is written (the command went on to
        # its sleep: all of them fit in the ring, 16 MiB).
        wait_until(lambda: _sleeps(state), timeout=60, interval=0.02)
        if transport == "socket":
            # and until the client's socket is full (about 6 MB of the lines): what the
            # next sidecar replays must fit in the output it keeps for a client that has
            # not connected yet (8 MiB of lines, about 6 MB); killed with less read, the
            # rest of the replay is dropped and told lost before this client connects
            # (seen once, by a kill as soon as the lines were written).
            time.sleep(1.5)
        side.proc.send_signal(signal.SIGKILL)
        side.proc.wait(30)
        got = [(o["params"]["offset"], base64.b64decode(o["params"]["data_b64"]))
               for o in _drain(p) if o.get("method") == "output"]
    finally:
        side.close()
    want = sum(len(f"{i}\n") for i in range(1, n + 1))
    assert sum(len(d) for _o, d in got) < want  # (some was still to come: the case)
    side = Sidecar(transport, "--state", str(state))
    try:
        q = side.peer
        q.event("k", "adopted")

        def pieces() -> list[tuple[int, bytes]]:
            return got + [(o["params"]["offset"], base64.b64decode(o["params"]["data_b64"]))
                          for o in q.seen if o.get("method") == "output"]
        deadline = time.monotonic() + 60
        while len(_stitch(pieces())) < want and time.monotonic() < deadline:
            _read_some(q)
        assert _numbers(_stitch(pieces())) == list(range(1, n + 1))
        q.call("close")
    finally:
        side.close()


def _ended(pid: int, start_time: int) -> bool:
    """The process (pid, start_time) has ended: gone, a zombie, or its pid reused."""
    p = proctable.read(pid)
    return p is None or p.start_time != start_time or p.state in ("Z", "X")


def _sleeps(state: Path) -> bool:
    """A process of the directory's sessions runs sleep (by /proc)."""
    for pid, start_time, _name in marked(session_names(state)):
        p = proctable.read(pid)
        if p is not None and p.start_time == start_time and p.name == "sleep":
            return True
    return False


def _read_some(p: Peer, timeout: float = 1.0) -> None:
    """Read what comes within timeout (nothing is no failure)."""
    import select

    r, _, _ = select.select([p.rfd], [], [], timeout)
    if r:
        chunk = os.read(p.rfd, 1 << 16)
        p.buf += chunk
        while b"\n" in p.buf:
            p.read(1)


def _drain(p: Peer) -> list[dict[str, Any]]:
    """Whatever the (now dead) sidecar had written, read to its end."""
    import select

    while True:
        r, _, _ = select.select([p.rfd], [], [], 2)
        chunk = os.read(p.rfd, 1 << 16) if r else b""
        if not chunk:
            break
        p.buf += chunk
        while b"\n" in p.buf:
            p.read(1)
    return p.seen


def _generation_output(peer: Peer, key: str, generation: int) -> bytes:
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
        if not _generation_output(p, "agent", 1):  # (it may have come before start's answer)
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
            if not _generation_output(p, "agent", 2):
                p.until(lambda o: o.get("method") == "output"
                        and o["params"]["generation"] == 2)
            assert _generation_output(p, "agent", 2) == b"fresh\n"
        finally:
            p.call("close")  # (a durable sidecar's SIGTERM would leave the key running)
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
