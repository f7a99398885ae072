"""AsyncSupervisor: the same machine awaited from asyncio; teardowns run off the loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import os
import signal
import subprocess
import sys
import termios
import threading
import time
from typing import Any, Optional

import pytest

import proctable
from proctable import AsyncSupervisor, InputBlocked, NoInput, SupervisorClosed
from proctable.supervise import Event

from ._supervise import Recorder, ignore_term, marked_env, running_marked, tag_for
from .conftest import wait_until


async def _until(pred: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout}s: {pred}")
        await asyncio.sleep(0.01)


class _Lag:
    """Measures how late the loop wakes up a 10 ms sleeper, while it runs."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._stop = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop:
            t = loop.time()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, loop.time() - t - 0.01)

    def stop(self) -> None:
        self._stop = True


def test_start_stop_events_and_close() -> None:
    async def main() -> tuple[list[tuple[str, int, Any]], proctable.Identity, Any]:
        loop_thread = threading.get_ident()
        seen_in: set[int] = set()

        def on_event(ev: Event) -> None:
            seen_in.add(threading.get_ident())

        sup = AsyncSupervisor(on_event=on_event, grace=1.0, kill_timeout=2.0)

        async def collect() -> list[tuple[str, int, Any]]:
            return [(e.kind, e.generation, e.key) async for e in sup.events()]

        # Beside on_event, events() yields from its first iteration on.
        collector = asyncio.ensure_future(collect())
        await asyncio.sleep(0)
        ident = await sup.start("a", ["sleep", "60"])
        assert sup.running("a") and sup.generation("a") == 1 and "a" in sup
        status = await sup.stop("a")
        with pytest.raises(FileNotFoundError):
            await sup.start("m", ["/nonexistent/command"])
        await sup.start("b", ["sh", "-c", "exit 2"])
        await sup.remove("a")
        await sup.close()
        kinds = await asyncio.wait_for(collector, 30)
        assert seen_in == {loop_thread}  # on_event runs in the loop
        with pytest.raises(SupervisorClosed):
            await sup.start("c", ["sleep", "1"])
        return kinds, ident, status

    kinds, ident, status = asyncio.run(main())
    assert not ident.alive()
    assert status is not None and status.signal == signal.SIGTERM
    a = [k for k in kinds if k[2] == "a"]
    assert a == [("created", 1, "a"), ("exited", 1, "a"), ("deleted", 1, "a")]
    b = [k[0] for k in kinds if k[2] == "b"]
    assert b == ["created", "exited"]
    assert not [k for k in kinds if k[2] == "m"]


def test_the_loop_keeps_running_during_a_one_second_teardown(tmp_path: Any) -> None:
    marker = str(tmp_path / "ready")

    async def main() -> tuple[float, float, float]:
        async with AsyncSupervisor(grace=1.0, kill_timeout=2.0) as sup:
            await sup.start("slow", ignore_term(marker))
            await _until(lambda: os.path.exists(marker))
            lag = _Lag()
            ticker = asyncio.ensure_future(lag.run())
            await asyncio.sleep(0.05)
            t0 = time.monotonic()
            await sup.stop("slow")  # SIGTERM is ignored: the whole 1 s grace, then SIGKILL
            took = time.monotonic() - t0
            lag.stop()
            await ticker
            return took, lag.worst, lag.worst

    took, worst, _ = asyncio.run(main())
    assert took >= 1.0  # the teardown did take its grace...
    # ...and the loop went on meanwhile. (50 ms is the promise; 0.5 s is asserted so
    # that a loaded shared machine cannot fail it: the figure is in the report.)
    assert worst < 0.5, f"the loop stalled {worst * 1000:.0f} ms"
    print(f"\nloop lag during a {took:.2f}s teardown: worst {worst * 1000:.1f} ms")


def test_events_iterate_while_the_supervisor_runs() -> None:
    async def main() -> list[str]:
        sup = AsyncSupervisor(grace=0.5, kill_timeout=2.0)
        got: list[str] = []

        async def consume() -> None:
            async for ev in sup.events():
                got.append(ev.kind)

        consumer = asyncio.ensure_future(consume())
        await sup.start("x", ["sh", "-c", "exit 0"], restart=proctable.RestartPolicy(
            max_fast_exits=2))
        await _until(lambda: "gave_up" in got)
        await sup.close()
        await asyncio.wait_for(consumer, 20)  # ends after close
        return got

    got = asyncio.run(main())
    assert got == ["created", "exited", "restarting", "created", "exited", "gave_up"]


def test_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        AsyncSupervisor()


def test_events_called_before_a_start_yields_that_starts_events() -> None:
    """AsyncSupervisor beside on_event: a stream taken before a start lost its events.
    Found by a hostile review of AsyncSupervisor's events() (issue 21)."""
    # it = sup.events() before the start, iterated after it (a reader made early,
    # as in a class that takes the stream in its constructor): its events were lost,
    # queueing began at the generator's first step, not at the call.
    async def main() -> list[str]:
        seen: list[Event] = []
        sup = AsyncSupervisor(on_event=seen.append, grace=1.0, kill_timeout=2.0)
        stream = sup.events()
        await sup.start("a", ["true"])
        deadline = time.monotonic() + 30
        while not any(e.kind == "exited" for e in seen):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await sup.close()
        return [e.kind async for e in stream]

    kinds = asyncio.run(main())
    assert kinds[:2] == ["created", "exited"], kinds  # was []


# -- a call that waits never holds up another ------------------------------------------


def test_async_blocked_write_does_not_hold_up_other_keys() -> None:
    """AsyncSupervisor runs every call on one feeder thread, so a write() waiting (up to
    write_timeout, 5 s) for a command that does not read holds up a stop() of another
    key until the write gives up.

    Found by a review of issue 22 (owned output and pseudo-terminals) with real
    processes. The write's bound is 30 s here, so that it never gives up by itself in
    a passing run: the stop of the other key comes first, and then a stop of the deaf
    key ends the write (NoInput, not InputBlocked). Held up, the stop would come only
    after the write gave up (30 s)."""
    async def main() -> list[str]:
        order: list[str] = []
        async with AsyncSupervisor(write_timeout=30.0) as sup:
            deaf = await sup.start("deaf", ["sleep", "300"], stdin=subprocess.PIPE,
                                   output="events")
            await sup.start("other", ["sleep", "300"])

            async def blocked_write() -> None:
                try:
                    await sup.write("deaf", b"z" * 1_000_000)  # a pipe holds 64 KiB
                except InputBlocked:
                    order.append("write gave up")
                except NoInput:
                    order.append("write ended by its stop")

            task = asyncio.create_task(blocked_write())
            await _until(lambda: _pipe_bytes(deaf.pid) > 0)  # the write is under way
            await sup.stop("other")
            order.append("other stopped")
            await sup.stop("deaf")
            await asyncio.wait_for(task, 60)
        return order

    assert asyncio.run(main()) == ["other stopped", "write ended by its stop"]


def _pipe_bytes(pid: int) -> int:
    """The bytes waiting in the pipe that is pid's stdin (read through /proc, not taken)."""
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        buf = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    finally:
        os.close(fd)
    return int.from_bytes(buf, sys.byteorder)


def test_async_write_is_not_held_up_by_writes_blocked_on_other_keys() -> None:
    """AsyncSupervisor.write ran on the loop's default executor: writes blocked on keys
    that do not read (up to write_timeout each) took every worker, and a write to a key
    that reads waited behind them. Each write now has a thread of its own.

    Found by a hostile review of issue 22's last fixes, with real processes."""

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


def test_fifty_concurrent_starts_run_nothing_on_the_loop(request: pytest.FixtureRequest) -> None:
    """Each start ran its synchronous part on the loop: 50 concurrent starts stalled it. Found
    by the hostile review of the rebuilt supervisor (issue 13 follow-up), against real
    processes (finding 5)."""
    tag = tag_for(request)

    async def main() -> tuple[float, set[int], int]:
        sup = AsyncSupervisor(grace=0.5, kill_timeout=2.0)
        loop_thread = threading.get_ident()
        fed_in: set[int] = set()
        submit = sup.supervisor.submit_start

        def recording(*a: Any, **kw: Any) -> Any:
            fed_in.add(threading.get_ident())
            return submit(*a, **kw)

        sup.supervisor.submit_start = recording  # type: ignore[method-assign]
        worst = 0.0
        going = True

        async def ticker() -> None:
            nonlocal worst
            loop = asyncio.get_running_loop()
            while going:
                t = loop.time()
                await asyncio.sleep(0.005)
                worst = max(worst, loop.time() - t - 0.005)

        tick = asyncio.ensure_future(ticker())
        await asyncio.sleep(0.02)
        try:
            idents = await asyncio.gather(*(sup.start(i, ["sleep", "60"], env=marked_env(tag))
                                            for i in range(50)))
        finally:
            going = False
            await tick
            await sup.close()
        assert loop_thread not in fed_in
        return worst, fed_in, len(set(idents))

    worst, fed_in, started = asyncio.run(main())
    assert started == 50 and len(fed_in) == 1  # one feeder thread: calls keep their order
    # Each start used to run its synchronous part (10-40 ms under load) on the loop:
    # 50 of them stalled it 0.6 s (idle machine) to 1.9 s (load 12). What is left is
    # the GIL shared with 50 launch threads (0.3 s at worst at load 16); 1 s is
    # asserted so that a loaded machine cannot fail it. The thread check above is
    # what holds the fix.
    assert worst < 1.0, f"the loop stalled {worst * 1000:.0f} ms"
    assert running_marked(tag) == {}
    print(f"\nloop lag during 50 concurrent starts: worst {worst * 1000:.1f} ms "
          f"(load {os.getloadavg()[0]:.1f})")


def test_async_calls_keep_their_order() -> None:
    """A start and a stop made one after the other on the loop (as tasks) reach the
    machine in that order: the stop wins.

    Found by the hostile review of the rebuilt supervisor (issue 13 follow-up), against
    real processes (finding 5)."""

    async def main() -> tuple[list[Any], str]:
        rec = Recorder()
        sup = AsyncSupervisor(on_event=rec, grace=0.5, kill_timeout=2.0)
        start = asyncio.ensure_future(sup.start("k", ["sleep", "60"]))
        stop = asyncio.ensure_future(sup.stop("k"))
        outcome = await asyncio.gather(start, stop, return_exceptions=True)
        state = sup.state("k")
        await sup.close()
        return outcome, state

    (started, _stopped), state = asyncio.run(main())
    # Fed in order: the stop came while the start launched (StartCancelled) or
    # after it (the key is stopped); never the other way round (KeyError).
    assert not isinstance(started, KeyError) and not isinstance(_stopped, KeyError)
    assert state in ("stopped", "gone")


# -- a caller that stops waiting never breaks the key ----------------------------------


def test_an_awaited_start_cancelled_by_wait_for_goes_on(request: pytest.FixtureRequest) -> None:
    """A start whose awaiting is cancelled (asyncio.wait_for) goes on: its exit is
    watched and the key ends stopped. Found by the hostile review of the rebuilt
    supervisor (issue 13 follow-up), against real processes (finding 1)."""
    tag = tag_for(request)

    async def main() -> tuple[list[tuple[str, int, Optional[str]]], str]:
        rec = Recorder()
        sup = AsyncSupervisor(on_event=rec, grace=0.5, kill_timeout=2.0)
        try:
            await asyncio.wait_for(sup.start("k", ["sh", "-c", "sleep 0.3; exit 3"],
                                             env=marked_env(tag)), timeout=0.001)
        except asyncio.TimeoutError:
            pass  # the waiting was cancelled, not the start
        await asyncio.to_thread(rec.wait_for, lambda r: r.count("exited", "k") == 1)
        await asyncio.to_thread(wait_until, lambda: sup.state("k") == "stopped")
        state = sup.state("k")
        await sup.close()
        return rec.kinds("k"), state

    kinds, state = asyncio.run(main())
    assert kinds == [("created", 1, None), ("exited", 1, "exited")]
    assert state == "stopped"
    assert running_marked(tag) == {}


def test_a_cancelled_stop_still_answers_a_start_waiting_its_turn(
        tmp_path: Any, request: pytest.FixtureRequest) -> None:
    """A stop whose awaiter is cancelled goes on; a start() of the same key in another
    thread, deferred behind it, then runs (it used to hang until the 300 s net).

    Found by the hostile review of the rebuilt supervisor (issue 13 follow-up), against
    real processes (finding 1)."""
    tag = tag_for(request)
    marker = str(tmp_path / "ready")

    async def main() -> dict[str, Any]:
        rec = Recorder()
        sup = AsyncSupervisor(on_event=rec, grace=1.0, kill_timeout=2.0)
        await sup.start("k", ignore_term(marker), env=marked_env(tag))
        await asyncio.to_thread(wait_until, lambda: os.path.exists(marker))
        stopping = asyncio.ensure_future(sup.stop("k"))
        await asyncio.to_thread(wait_until, lambda: sup.state("k") == "stopping")
        result: dict[str, Any] = {}

        def other() -> None:
            try:
                result["ident"] = sup.supervisor.start("k", ["sleep", "60"],
                                                       env=marked_env(tag))
            except Exception as exc:  # pragma: no cover - reported by the assert
                result["error"] = exc

        th = threading.Thread(target=other)
        th.start()
        await asyncio.to_thread(wait_until, lambda: len(
            sup.supervisor._machines["k"]._deferred) == 1)  # white-box: it waits its turn
        stopping.cancel()
        await asyncio.to_thread(th.join, 60.0)
        result["alive"] = th.is_alive()
        assert await asyncio.to_thread(sup.supervisor.flush_events)  # its created, delivered
        result["kinds"] = rec.kinds("k")
        await sup.close()
        return result

    result = asyncio.run(main())
    assert result["alive"] is False and "error" not in result
    assert isinstance(result["ident"], proctable.Identity)
    assert result["kinds"] == [("created", 1, None), ("exited", 1, "killed"),
                               ("created", 2, None)]
    assert running_marked(tag) == {}

