"""The bound on output read but not yet delivered: one per key, over all its
generations, for Supervisor's on_event and AsyncSupervisor's events() alike.

By default it paces the command (a consumer that reads on gets every byte; one that
is stuck makes the command wait, as a pipe would); with ``drop_output=True`` the
oldest bytes go instead. What must hold, checked on the events: every byte a
generation wrote is either delivered as that generation's or counted in a
``dropped`` of that generation (never of another), nothing of a generation comes
after its ``exited``, and what waits for a consumer that is stuck stays near the
bound.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

import proctable
from proctable import AsyncSupervisor, InputBlocked, RestartPolicy, Supervisor, _output
from proctable._output import Bound, Output, Tail
from proctable.supervise import Event

from .conftest import PY
from .test_supervise_output import check_order

# Generation g (counted in a file, so that each generation knows its number) writes
# 200,000 bytes of the digit g to stdout, and crashes.
_NUMBERED = ("import os, sys\n"
             "p = sys.argv[1]\n"
             "with open(p, 'a') as f: f.write('x')\n"
             "g = os.path.getsize(p)\n"
             "sys.stdout.buffer.write(str(g).encode() * 200000)\n"
             "sys.stdout.flush()\n"
             "sys.exit(1)\n")
_EACH = 200_000
_GENERATIONS = 6


def check_each_generation(events: list[Event]) -> None:
    """Each generation's bytes are its own digit, and delivered + dropped is all it wrote."""
    check_order(events)
    for g in range(1, _GENERATIONS + 1):
        outs = [e for e in events if e.kind == "output" and e.generation == g]
        data = b"".join(e.data or b"" for e in outs)
        assert set(data) <= {ord(str(g))}, f"generation {g} got bytes of another"
        assert len(data) + sum(e.dropped for e in outs) == _EACH, g


def test_drops_of_a_crash_loop_are_counted_to_the_generation_that_wrote_them(
        tmp_path: Path) -> None:
    bound = 64 << 10
    events: list[Event] = []
    gate = threading.Event()

    def on_event(ev: Event) -> None:
        events.append(ev)
        if ev.kind == "created" and ev.generation == 1:
            gate.wait(60)  # a consumer stuck while the key crash-loops (bounded)

    counter = str(tmp_path / "generations")
    with Supervisor(on_event=on_event, output_buffer=bound) as sup:
        sup.start("k", [PY, "-c", _NUMBERED, counter],
                  restart=RestartPolicy(max_restarts=_GENERATIONS - 1), output="events",
                  drop_output=True)
        deadline = time.monotonic() + 60
        while sup.state("k") != "gave_up" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sup.state("k") == "gave_up"
        gate.set()
        assert sup.flush_events(30)
        # The key's buffers that are empty for good are not kept (a crash loop of a
        # stuck consumer leaves only the bound's worth, and no buffer per generation).
        assert len(sup._bounds["k"]) <= 1
    check_each_generation(events)
    delivered = sum(len(e.data or b"") for e in events if e.kind == "output")
    assert delivered <= bound  # the whole key waited within the bound
    # The oldest went first: the last generation's bytes are all delivered.
    last = [e for e in events if e.kind == "output" and e.generation == _GENERATIONS]
    assert sum(len(e.data or b"") for e in last) == min(_EACH, bound)


def test_async_events_not_read_hold_at_most_the_bound_each_generation_counted(
        tmp_path: Path) -> None:
    bound = 64 << 10
    counter = str(tmp_path / "generations")
    seen: list[Event] = []

    async def main() -> list[Event]:
        got: list[Event] = []
        async with AsyncSupervisor(on_event=seen.append, output_buffer=bound) as sup:
            # A reader that lags: its first step is taken (beside on_event, events()
            # yields from its first iteration on), then nothing is read for a while.
            reader = sup.events().__aiter__()
            first = asyncio.ensure_future(reader.__anext__())
            await asyncio.sleep(0)
            await sup.start("k", [PY, "-c", _NUMBERED, counter],
                            restart=RestartPolicy(max_restarts=_GENERATIONS - 1),
                            output="events", drop_output=True)
            deadline = time.monotonic() + 60
            while sup.state("k") != "gave_up" and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # events() not read meanwhile
            assert sup.state("k") == "gave_up"
            # Every event so far handed to the loop (and so queued for events()).
            assert await asyncio.to_thread(sup.supervisor.flush_events, 30)

            async def rest() -> None:
                got.append(await first)
                async for ev in reader:
                    got.append(ev)
                    if ev.kind == "gave_up":
                        break

            await asyncio.wait_for(rest(), 30)  # bounded: all of it is queued by now
        return got

    got = asyncio.run(main())
    check_each_generation(got)
    assert [e.kind for e in got if e.kind != "output"] == [
        e.kind for e in seen if e.kind != "output"]  # lifecycle events are never dropped
    assert sum(e.kind == "created" for e in got) == _GENERATIONS
    delivered = sum(len(e.data or b"") for e in got if e.kind == "output")
    assert delivered <= bound
    check_order(seen)  # on_event saw the output as it reached the loop, in its place


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"output_buffer": 0}, ValueError), ({"output_buffer": "big"}, ValueError),
    ({"tail_size": -1}, ValueError), ({"tail_size": True}, ValueError),
    ({"write_timeout": -1.0}, ValueError), ({"write_timeout": "5"}, TypeError),
    ({"write_timeout": float("nan")}, ValueError),
])
def test_async_supervisor_checks_the_output_keywords_as_supervisor_does(
        kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error) as sync:
        Supervisor(**kwargs)  # type: ignore[arg-type]

    async def main() -> None:
        AsyncSupervisor(**kwargs)  # type: ignore[arg-type]

    with pytest.raises(error) as aio:
        asyncio.run(main())
    assert str(aio.value) == str(sync.value)


def test_async_supervisor_takes_tail_size_and_write_timeout() -> None:
    async def main() -> tuple[bytes, int]:
        async with AsyncSupervisor(tail_size=8, write_timeout=0.5) as sup:
            await sup.start("k", ["sh", "-c", "echo 0123456789abcdef"], output="events")
            async for ev in sup.events():
                if ev.kind == "exited":
                    break
            tail = sup.tail("k")
            await sup.start("deaf", ["sleep", "30"], stdin=subprocess.PIPE, output="events")
            try:
                await sup.write("deaf", b"z" * 4_000_000)  # more than any pipe holds
            except InputBlocked as exc:
                return tail, exc.written
        raise AssertionError("a write to a command that does not read returned")

    tail, written = asyncio.run(main())
    assert tail == b"9abcdef\n"
    assert 0 < written < 4_000_000


def test_tail_refuses_what_is_not_a_number_of_bytes() -> None:
    with Supervisor() as sup:
        sup.start("k", ["sh", "-c", "echo hello"], output="events")
        with pytest.raises(TypeError, match="tail's n must be an int"):
            sup.tail("k", "x")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="tail's n"):
            sup.tail("k", 2.5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="tail's n"):
            sup.tail("k", True)
        with pytest.raises(ValueError, match="tail's n must be a number of bytes >= 0"):
            sup.tail("k", -1)
        assert sup.tail("k", 0) == b""


def test_bytes_a_drain_leaves_at_its_limit_are_counted_as_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What a teardown's drain leaves unread at its limit (a writer outside the
    lineage kept the pipe full) is counted as dropped, in the generation's last
    output, never lost silently. Real pipes; the limit lowered to 4 KiB."""
    monkeypatch.setattr(_output, "DRAIN_LIMIT", 4096)
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        _output.grow_pipe(r)
        written = os.write(w, b"y" * 60_000)  # what the pipe holds at the teardown
        out = Output({r: "stdout"}, None, False, Bound(1 << 20), Tail(16))
        out.go_live(1)
        out.finish(None)  # drains 4 KiB, counts the rest, closes r
        got = out.take()
    finally:
        os.close(w)
    # What was read, then (after it: those bytes came later) how many were not.
    assert got == [("stdout", b"y" * 4096, 0, 0), ("stdout", b"", written - 4096, written)]


# -- pacing: the default -----------------------------------------------------------------

_FAST = 24 << 20  # written as fast as the command can


def test_a_stuck_consumer_makes_the_command_wait_and_loses_nothing() -> None:
    """Issue 31, item 1: a consumer that reads on gets every byte, whatever rate the
    command writes at; while it is stuck, the command waits (it would write 24 MiB
    in a few tens of milliseconds) and what waits stays near the bound."""
    gate = threading.Event()
    got: list[tuple[int, int]] = []

    def on_event(ev: Event) -> None:
        if ev.kind == "output":
            if not gate.is_set():
                gate.wait(60)
            got.append((len(ev.data or b""), ev.dropped))

    bound = 1 << 20
    with Supervisor(on_event=on_event, output_buffer=bound) as sup:
        ident = sup.start("k", ["head", "-c", str(_FAST), "/dev/zero"], output="events")
        time.sleep(1.0)  # the consumer is stuck meanwhile
        row = proctable.read(ident.pid)
        alive = row is not None and row.start_time == ident.start_time and row.state != "Z"
        held = sup._bounds["k"].outstanding
        gate.set()
        deadline = time.monotonic() + 60
        while sum(n for n, _ in got) < _FAST and time.monotonic() < deadline:
            time.sleep(0.02)
    assert alive, "the command ran to its end while its consumer was stuck"
    assert held <= 2 * bound + (1 << 18), held
    assert sum(n for n, _ in got) == _FAST
    assert sum(d for _, d in got) == 0


def test_an_async_reader_that_lags_makes_the_command_wait_and_loses_nothing() -> None:
    async def main() -> tuple[bool, int, int]:
        async with AsyncSupervisor(output_buffer=1 << 20) as sup:
            ident = await sup.start("k", ["head", "-c", str(_FAST), "/dev/zero"],
                                    output="events")
            stream = sup.events()
            await asyncio.sleep(1.0)  # events() not read meanwhile
            row = proctable.read(ident.pid)
            alive = row is not None and row.start_time == ident.start_time \
                and row.state != "Z"
            total = dropped = 0
            async for ev in stream:
                if ev.kind == "output":
                    total += len(ev.data or b"")
                    dropped += ev.dropped
                if ev.kind == "exited":
                    break
            return alive, total, dropped

    alive, total, dropped = asyncio.run(main())
    assert alive, "the command ran to its end while events() was not read"
    assert (total, dropped) == (_FAST, 0)


def test_a_durable_sessions_output_is_paced_through_its_keeper(state: Path) -> None:
    """The same through a durable session's keeper: the supervisor stops reading the
    keeper, the keeper stops reading the pipe, the command waits; every byte comes."""
    gate = threading.Event()
    got: list[tuple[int, int, int]] = []

    def on_event(ev: Event) -> None:
        if ev.kind == "output":
            gate.wait(60)
            got.append((ev.offset or 0, len(ev.data or b""), ev.dropped))

    with Supervisor(on_event=on_event, output_buffer=1 << 20, state_dir=str(state)) as sup:
        ident = sup.start("k", ["head", "-c", str(_FAST), "/dev/zero"], output="events")
        time.sleep(1.0)
        row = proctable.read(ident.pid)
        alive = row is not None and row.start_time == ident.start_time and row.state != "Z"
        gate.set()
        deadline = time.monotonic() + 60
        while sum(n for _, n, _ in got) < _FAST and time.monotonic() < deadline:
            time.sleep(0.02)
    assert alive
    assert sum(n for _, n, _ in got) == _FAST and sum(d for _, _, d in got) == 0
    ends = [o + n for o, n, _ in got]
    assert [o for o, _, _ in got][1:] == ends[:-1]  # contiguous: no gap, no overlap
