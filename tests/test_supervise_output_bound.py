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
import gc
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

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


def _stuck_at_the_first_start(events: list[Event],
                              gate: threading.Event) -> Callable[[Event], None]:
    """An on_event that keeps every event in events and is stuck (bounded) from the
    first generation's created on until gate is set: a consumer that falls behind."""

    def on_event(ev: Event) -> None:
        events.append(ev)
        if ev.kind == "created" and ev.generation == 1:
            gate.wait(60)

    return on_event


def _wait_gave_up(sup: Supervisor, key: str) -> None:
    """Until the key's crash loop has given up (bounded)."""
    deadline = time.monotonic() + 60
    while sup.state(key) != "gave_up" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sup.state(key) == "gave_up"


def test_drops_of_a_crash_loop_are_counted_to_the_generation_that_wrote_them(
        tmp_path: Path) -> None:
    bound = 64 << 10
    events: list[Event] = []
    gate = threading.Event()
    on_event = _stuck_at_the_first_start(events, gate)  # while the key crash-loops

    counter = str(tmp_path / "generations")
    with Supervisor(on_event=on_event, output_buffer=bound) as sup:
        sup.start("k", [PY, "-c", _NUMBERED, counter],
                  restart=RestartPolicy(max_restarts=_GENERATIONS - 1), output="events",
                  drop_output=True)
        _wait_gave_up(sup, "k")
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


def test_bytes_a_writer_outside_adds_after_the_drain_are_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A teardown's drain that ends on EAGAIN (below its limit) was followed by the
    close without a look at the pipe: what a writer outside the lineage wrote in between
    was discarded uncounted (1 MiB of 254 MB once, with a writer on /proc/PID/fd/1 of a
    stopped key). Real pipe; the drain is made to stop before the bytes, as if they came
    right after its last read.

    Found by a hostile review of issue 22's last fixes, with real processes."""
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


# -- one bound per key: across generations, restarts and removes -----------------------


def test_output_bound_holds_per_key_across_generations() -> None:
    """docs/supervisor.md: "Per key, output read but not yet delivered is bounded
    (output_buffer)". Each generation gets its own buffer of that size, so a key that
    crash-loops while on_event is busy holds generations x output_buffer.

    Found by a review of issue 22 (owned output and pseudo-terminals) with real
    processes."""
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
        _wait_gave_up(sup, "k")
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


_LETTERS = 3 << 20  # what _letters writes


def _letters(letter: str, end: bytes = b"") -> list[str]:
    """A command that writes _LETTERS bytes of letter to stdout (then end) and exits."""
    return ["sh", "-c",
            f"head -c {_LETTERS} /dev/zero | tr '\\0' {letter}; printf '{end.decode()}'"]


def _wait_tail_ends(sup: Supervisor, key: str, end: bytes) -> None:
    """Until the key's tail ends with end: everything it wrote has been read (bounded)."""
    deadline = time.monotonic() + 60
    while not sup.tail(key, 64).endswith(end):
        assert time.monotonic() < deadline, "the writer's output never arrived"
        time.sleep(0.02)


def test_remove_then_start_while_the_consumer_is_behind_keeps_one_bound() -> None:
    """A key removed and started again is the same key (its generations go on): what
    waits undelivered of all its generations stays within one output_buffer. It held one
    bound per remove(): 2 MiB waited for a bound of 1 MiB.

    Found by a hostile review of issue 22's last fixes, with real processes."""
    bound = 1 << 20
    events: list[Event] = []
    gate = threading.Event()
    on_event = _stuck_at_the_first_start(events, gate)  # while it is removed and restarted

    with Supervisor(on_event=on_event, output_buffer=bound) as sup:
        sup.start("k", _letters("A", b"END1"), output="events", drop_output=True)
        _wait_tail_ends(sup, "k", b"END1")
        sup.remove("k")
        sup.start("k", _letters("B", b"END2"), output="events", drop_output=True)
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
        assert len(data) + sum(e.dropped for e in outs) == _LETTERS + len(end)
    delivered = sum(len(e.data or b"") for e in events if e.kind == "output")
    assert delivered <= bound, f"{delivered} bytes waited for a bound of {bound}"


def test_async_output_is_bounded_when_events_are_not_read() -> None:
    """The bound on output read but not delivered (output_buffer, 4 MiB) does not hold
    for AsyncSupervisor: every output event goes into an unbounded asyncio.Queue, so a
    consumer of events() that falls behind holds everything, nothing dropped.
    (AsyncSupervisor takes no output_buffer, tail_size or write_timeout either.)

    Found by a review of issue 22 (owned output and pseudo-terminals) with real
    processes."""
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


async def _held_after_removing(sup: AsyncSupervisor, seen: list[Event], n: int, bound: int,
                               then: str = "") -> tuple[int, int]:
    """Keys 0..n-1 each write bound bytes as output events (then run the shell code
    then), exit (waited for, bounded) and are removed; the bytes and the events the
    supervisor still holds for events()."""
    for k in range(n):
        await sup.start(k, ["sh", "-c", f"head -c {bound} /dev/zero{then}"], output="events")
    deadline = time.monotonic() + 60
    while sum(1 for e in seen if e.kind == "exited" and e.key in range(n)) < n:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    for k in range(n):
        await sup.remove(k)
    return sum(sup._unread_size.values()), sup._queue.qsize()


def test_async_output_nobody_iterates_is_not_kept_for_removed_keys() -> None:
    """AsyncSupervisor kept every removed key's output for an events() nobody called.
    Found by a hostile review of issue 22's last fixes, with real processes."""
    bound = 256 << 10

    async def main() -> int:
        seen: list[Event] = []
        async with AsyncSupervisor(on_event=seen.append, output_buffer=bound) as sup:
            return (await _held_after_removing(sup, seen, 8, bound, then="; echo end"))[0]

    held = asyncio.run(main())
    assert held <= bound, f"{held} bytes of 8 removed keys kept for an events() never called"


def test_an_events_iterator_given_up_keeps_nothing_after_it() -> None:
    """AsyncSupervisor beside on_event: a reader of events() that left kept everything
    queued for nobody. Found by a hostile review of AsyncSupervisor's events() (issue
    21)."""
    # A reader that takes what it waits for and leaves (break: the generator is
    # closed) while on_event goes on: every later event, and each removed key's
    # last output_buffer of output, stayed queued for nobody (the growth the
    # change was for).
    bound = 64 << 10

    async def main() -> int:
        seen: list[Event] = []
        async with AsyncSupervisor(on_event=seen.append, output_buffer=bound,
                                   grace=1.0, kill_timeout=2.0) as sup:
            stream = sup.events()
            await sup.start("first", ["true"])
            async for ev in stream:
                if ev.kind == "exited":
                    break
            await stream.aclose()  # type: ignore[attr-defined]
            await sup.remove("first")
            return sum(await _held_after_removing(sup, seen, 6, bound))

    held = asyncio.run(main())
    assert held == 0, f"{held} bytes and events kept for an events() given up"


def test_an_events_stream_dropped_unread_keeps_nothing() -> None:
    """The same for a stream never iterated. Found by a hostile review of
    AsyncSupervisor's events() (issue 21)."""
    # events() called and never iterated (no first step, so no finally runs):
    # the supervisor kept queueing for it for ever.
    bound = 64 << 10

    async def main() -> int:
        seen: list[Event] = []
        async with AsyncSupervisor(on_event=seen.append, output_buffer=bound,
                                   grace=1.0, kill_timeout=2.0) as sup:
            stream = sup.events()
            del stream
            gc.collect()
            return sum(await _held_after_removing(sup, seen, 3, bound))

    held = asyncio.run(main())
    assert held == 0, f"{held} bytes and events kept for an events() dropped unread"


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
