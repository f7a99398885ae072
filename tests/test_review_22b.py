"""Hostile review of issue 22's last fixes (the per-key output bound, AsyncSupervisor's
bound and input calls, Lineage.communicate in text mode): each test is a defect
found with real processes, kept as a regression test."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from proctable import AsyncSupervisor, NoInput, Supervisor, _output
from proctable._output import Bound, Output, Tail
from proctable.supervise import Event

from ._lineage import Tracker
from .test_supervise_output import check_order

_EACH = 3 << 20


def _writer(letter: str, end: bytes = b"") -> list[str]:
    """A command that writes _EACH bytes of letter to stdout (then end) and exits."""
    return ["sh", "-c", f"head -c {_EACH} /dev/zero | tr '\\0' {letter}; printf '{end.decode()}'"]


def _wait_tail_ends(sup: Supervisor, key: str, end: bytes) -> None:
    """Until the key's tail ends with end: everything it wrote has been read (bounded)."""
    deadline = time.monotonic() + 60
    while not sup.tail(key, 64).endswith(end):
        assert time.monotonic() < deadline, "the writer's output never arrived"
        time.sleep(0.02)


def test_remove_then_start_while_the_consumer_is_behind_keeps_one_bound() -> None:
    """A key removed and started again is the same key (its generations go on): what
    waits undelivered of all its generations stays within one output_buffer. It held
    one bound per remove(): 2 MiB waited for a bound of 1 MiB."""
    bound = 1 << 20
    events: list[Event] = []
    gate = threading.Event()

    def on_event(ev: Event) -> None:
        events.append(ev)
        if ev.kind == "created" and ev.generation == 1:
            gate.wait(60)  # a consumer stuck (bounded) while the key is removed and restarted

    with Supervisor(on_event=on_event, output_buffer=bound) as sup:
        sup.start("k", _writer("A", b"END1"), output="events", drop_output=True)
        _wait_tail_ends(sup, "k", b"END1")
        sup.remove("k")
        sup.start("k", _writer("B", b"END2"), output="events", drop_output=True)
        _wait_tail_ends(sup, "k", b"END2")
        sup.remove("k")  # while its output still waits
        gate.set()
        assert sup.flush_events(30)
        # A removed key's parked bound follows no buffer once its output is delivered
        # (and goes when the last reference to its last buffer does).
        gc.collect()
        assert all(len(b) == 0 and b.size == 0 for b in sup._parked_bounds.values())
    check_order(events)
    for g, letter, end in ((1, b"A", b"END1"), (2, b"B", b"END2")):
        outs = [e for e in events if e.kind == "output" and e.generation == g]
        data = b"".join(e.data or b"" for e in outs)
        assert set(data) <= set(letter + end), f"generation {g} got bytes of another"
        assert len(data) + sum(e.dropped for e in outs) == _EACH + len(end)
    delivered = sum(len(e.data or b"") for e in events if e.kind == "output")
    assert delivered <= bound, f"{delivered} bytes waited for a bound of {bound}"


def test_async_write_is_not_held_up_by_writes_blocked_on_other_keys() -> None:
    """AsyncSupervisor.write ran on the loop's default executor: writes blocked on keys
    that do not read (up to write_timeout each) took every worker, and a write to a
    key that reads waited behind them. Each write now has a thread of its own."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        loop.set_default_executor(pool)  # an application's choice (2 workers: fewer keys)
        async with AsyncSupervisor(write_timeout=3600.0) as sup:
            blocked = []
            for i in range(2):
                await sup.start(f"deaf{i}", ["sleep", "300"], stdin=subprocess.PIPE)
                blocked.append(asyncio.ensure_future(sup.write(f"deaf{i}", b"x" * (4 << 20))))
            await sup.start("reader", ["sh", "-c", "cat > /dev/null"], stdin=subprocess.PIPE)
            await asyncio.sleep(0.2)  # let the blocked writes take their threads
            try:
                assert await asyncio.wait_for(sup.write("reader", b"hello\n"), 60) == 6
                assert not any(f.done() for f in blocked)  # they still wait: not queued behind
            finally:
                await sup.close(grace=1.0)  # a stop ends the blocked writes (NoInput)
                for f in blocked:
                    with pytest.raises(NoInput):
                        await asyncio.wait_for(f, 60)

    asyncio.run(main())


def _gated_cat(flag: Path) -> list[str]:
    """cat, once flag exists (until then its stdin is not read)."""
    return ["sh", "-c", f"while [ ! -e '{flag}' ]; do sleep 0.05; done; exec cat"]


def test_communicate_after_a_timeout_goes_on_feeding_the_first_input(
        track: Tracker, tmp_path: Path) -> None:
    """Popen's pattern: catch TimeoutExpired and call communicate() again. The input
    the first call could not write yet was dropped (stdin closed at once): the
    command read 64 KiB of 4 MiB, silently."""
    flag = tmp_path / "go"
    data = bytes(range(256)) * (16 << 10)  # 4 MiB: far more than the stdin pipe holds
    lin = track.spawn(_gated_cat(flag), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    with pytest.raises(subprocess.TimeoutExpired):
        lin.communicate(data, timeout=0.3)
    flag.touch()
    out, err = lin.communicate(timeout=60)
    assert out == data and err is None


def test_communicate_after_a_timeout_refuses_another_input(
        track: Tracker, tmp_path: Path) -> None:
    """A second call with a different input cannot send it (the first is half written):
    ValueError, as Popen's, instead of silently dropping both inputs' rest."""
    flag = tmp_path / "go"
    data = b"y" * (1 << 20)
    lin = track.spawn(_gated_cat(flag), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    with pytest.raises(subprocess.TimeoutExpired):
        lin.communicate(data, timeout=0.3)
    with pytest.raises(ValueError, match="input"):
        lin.communicate(b"other", timeout=60)
    flag.touch()
    out, _ = lin.communicate(data, timeout=60)  # the same input again is its continuation
    assert out == data


def test_communicate_that_cannot_decode_still_closes_the_pipes(track: Tracker) -> None:
    """In text mode, output that does not decode raises UnicodeDecodeError as Popen's;
    the pipes were left open (Popen closes them): an fd pair leaked per call."""
    cmd = [sys.executable, "-c",
           "import sys; sys.stdout.buffer.write(b'ok\\xff'); sys.stderr.buffer.write(b'e')"]
    lin = track.spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(UnicodeDecodeError):
        lin.communicate(timeout=60)
    p = lin.process
    assert p.stdout is not None and p.stdout.closed
    assert p.stderr is not None and p.stderr.closed
    assert p.returncode == 0 and lin.closed


def test_bytes_a_writer_outside_adds_after_the_drain_are_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A teardown's drain that ends on EAGAIN (below its limit) was followed by the
    close without a look at the pipe: what a writer outside the lineage wrote in
    between was discarded uncounted (1 MiB of 254 MB once, with a writer on
    /proc/PID/fd/1 of a stopped key). Real pipe; the drain is made to stop before
    the bytes, as if they came right after its last read."""
    monkeypatch.setattr(_output, "drain", lambda fd, limit=None: [])
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        written = os.write(w, b"y" * 30_000)
        out = Output({r: "stdout"}, None, False, Bound(1 << 20), Tail(16))
        out.go_live(1)
        out.finish(None)
        got = out.take()
    finally:
        os.close(w)
    assert got == [("stdout", b"", written, written)]


def test_async_output_nobody_iterates_is_not_kept_for_removed_keys() -> None:
    bound = 256 << 10

    async def main() -> int:
        seen: list[Event] = []
        async with AsyncSupervisor(on_event=seen.append, output_buffer=bound) as sup:
            for k in range(8):
                await sup.start(k, ["sh", "-c", f"head -c {bound} /dev/zero; echo end"],
                                output="events")
            deadline = time.monotonic() + 60
            while sum(1 for e in seen if e.kind == "exited") < 8:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            for k in range(8):
                await sup.remove(k)
            return sum(sup._unread_size.values())

    held = asyncio.run(main())
    assert held <= bound, f"{held} bytes of 8 removed keys kept for an events() never called"
