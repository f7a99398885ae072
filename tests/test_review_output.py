"""Review of issue 22 (owned output and pseudo-terminals): promises that do not hold.

Each test runs real processes and fails on main as merged.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time

import pytest

from proctable import AsyncSupervisor, Lineage, NoInput, RestartPolicy, Supervisor
from proctable.supervise import Event

from .conftest import PY


def test_output_bound_holds_per_key_across_generations() -> None:
    """docs/supervisor.md: "Per key, output read but not yet delivered is bounded
    (output_buffer)". Each generation gets its own buffer of that size, so a key
    that crash-loops while on_event is busy holds generations x output_buffer."""
    bound = 64 << 10
    events: list[Event] = []
    gate = threading.Event()
    held = threading.Event()

    def on_event(ev: Event) -> None:
        events.append(ev)
        if ev.kind == "output" and not held.is_set():
            held.set()
            gate.wait(60)  # a consumer that falls behind (bounded)

    chatty = [PY, "-c", "import sys; sys.stdout.buffer.write(b'x' * 200000); "
              "sys.stdout.flush(); sys.exit(1)"]
    with Supervisor(on_event=on_event, output_buffer=bound) as sup:
        sup.start("k", chatty, restart=RestartPolicy(max_restarts=9), output="events",
                  drop_output=True)
        deadline = time.monotonic() + 60
        while sup.state("k") != "gave_up" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sup.state("k") == "gave_up"
        gate.set()
        assert sup.flush_events(30)
    outs = [e for e in events if e.kind == "output"]
    created = sum(e.kind == "created" for e in events)
    delivered = sum(len(e.data or b"") for e in outs)
    assert created == 10
    assert delivered + sum(e.dropped for e in outs) == 10 * 200000  # nothing silent
    # Waiting while on_event was stuck: at most the bound (plus the one event in hand).
    assert delivered <= 2 * bound, (
        f"{delivered} bytes were held for one key while on_event was stuck, "
        f"output_buffer={bound}")


def test_resize_of_a_key_without_a_pty_says_so() -> None:
    """resize() of an output="events" key (no pty, no stdin) must say it has no
    terminal; it says "its input is closed" (the pty message is unreachable)."""
    with Supervisor() as sup:
        sup.start("k", ["sleep", "30"], output="events")
        with pytest.raises(NoInput, match="pty"):
            sup.resize("k", 10, 10)


def test_write_to_a_stopped_pty_key_says_it_is_not_running() -> None:
    """write() to a pty key after stop() must say it is not running; it says the key
    "has no pty or stdin pipe", which is false."""
    with Supervisor() as sup:
        sup.start("k", ["sh"], pty=(24, 80))
        sup.stop("k")
        with pytest.raises(NoInput, match="not running"):
            sup.write("k", b"echo hi\n")


def test_async_blocked_write_does_not_hold_up_other_keys() -> None:
    """AsyncSupervisor runs every call on one feeder thread, so a write() waiting (up
    to write_timeout, 5 s) for a command that does not read holds up a stop() of
    another key until the write gives up."""
    async def main() -> list[str]:
        order: list[str] = []
        async with AsyncSupervisor() as sup:
            await sup.start("deaf", ["sleep", "30"], stdin=subprocess.PIPE, output="events")
            await sup.start("other", ["sleep", "30"])

            async def blocked_write() -> None:
                try:
                    await sup.write("deaf", b"z" * 1_000_000)  # a pipe holds 64 KiB
                except NoInput:
                    order.append("write gave up")

            task = asyncio.create_task(blocked_write())
            await asyncio.sleep(0.3)  # the write is waiting (order only, not timing)
            await sup.stop("other")
            order.append("other stopped")
            await asyncio.wait_for(task, 30)
        return order

    assert asyncio.run(main()) == ["other stopped", "write gave up"]


def test_async_output_is_bounded_when_events_are_not_read() -> None:
    """The bound on output read but not delivered (output_buffer, 4 MiB) does not hold
    for AsyncSupervisor: every output event goes into an unbounded asyncio.Queue, so a
    consumer of events() that falls behind holds everything, nothing dropped.
    (AsyncSupervisor takes no output_buffer, tail_size or write_timeout either.)"""
    total = 12_000_000
    bound = 4 << 20  # Supervisor's default output_buffer

    async def main() -> list[Event]:
        got: list[Event] = []
        async with AsyncSupervisor() as sup:
            await sup.start("k", [PY, "-c", "import sys; sys.stdout.buffer.write("
                                  f"b'x' * {total})"], output="events", drop_output=True)
            deadline = time.monotonic() + 60
            while sup.state("k") == "running" and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # events() not read meanwhile: it falls behind
            await sup.remove("k")
            async for ev in sup.events():
                got.append(ev)
                if ev.kind == "removed" or (ev.kind == "exited" and ev.key == "k"):
                    break
        return got

    outs = [e for e in asyncio.run(main()) if e.kind == "output"]
    delivered = sum(len(e.data or b"") for e in outs)
    assert delivered + sum(e.dropped for e in outs) == total
    assert delivered <= 2 * bound, f"{delivered} bytes held undelivered for one key"


def test_lineage_communicate_honours_text_mode_as_popen_does() -> None:
    """docs/lineage.md: communicate() returns (stdout, stderr) "as Popen.communicate
    does". Lineage.spawn(..., text=True) is accepted, but communicate() returns bytes
    (Popen gives str), and input="..." fails inside the read loop with a raw
    TypeError from os.write. Either refuse text=True at spawn, or decode/encode."""
    cmd = ["sh", "-c", "echo hi; echo err >&2"]
    try:
        lin = Lineage.spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except ValueError:
        return  # refused clearly: fine
    try:
        got: object = lin.communicate(timeout=30)
        assert got == ("hi\n", "err\n")
    finally:
        if not lin.closed:
            lin.terminate(grace=1.0)
