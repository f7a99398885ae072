"""The hostile review of the rebuilt supervisor (issue 13 follow-up), finding by
finding, against real processes: a caller that stops waiting, a fresh factory that
blocks or calls back in, the asyncio loop during many starts, memory that must be
released (timers, machines of removed keys)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

import proctable
from proctable import AsyncSupervisor, RestartPolicy, Supervisor
from proctable.supervise._runtime import _Timers

from ._lineage import MODES, build_leader_exits, read_line
from ._supervise import Recorder, ignore_term, marked_env, running_marked
from .conftest import Procs, wait_until
from .test_supervisor import _Freezer, _read, needs_freezer


@pytest.fixture
def sup() -> Iterator[tuple[Supervisor, Recorder]]:
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=0.5, kill_timeout=2.0)
    try:
        yield s, rec
    finally:
        s.close()


def _tag(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name}-{os.getpid()}-"


def _one_exited_per_generation(rec: Recorder, key: Hashable) -> None:
    per_gen: dict[int, list[str]] = {}
    for kind, gen, _ in rec.kinds(key):
        per_gen.setdefault(gen, []).append(kind)
    for gen, kinds in per_gen.items():
        if "created" in kinds:
            assert kinds.count("exited") == 1, (gen, kinds)


# --- finding 1: a caller that stops waiting never breaks the key -----------------------------


def test_a_cancelled_submit_start_goes_on_in_the_background(
        sup: tuple[Supervisor, Recorder], request: pytest.FixtureRequest) -> None:
    """cancel() on submit_start's future used to make the answer raise
    InvalidStateError and drop the exit watch: the key stayed running forever."""
    s, rec = sup
    tag = _tag(request)
    fut = s.submit_start("k", ["sh", "-c", "sleep 0.2; exit 1"],
                         restart=RestartPolicy(max_restarts=2), env=marked_env(tag))
    assert fut.cancel() is False  # the call is under way: it cannot be cancelled
    ident = fut.result(timeout=30)
    assert isinstance(ident, proctable.Identity)
    rec.wait_for(lambda r: r.count("gave_up", "k") == 1)  # the crash loop ran, and ended
    assert [k for k, _, _ in rec.kinds("k")].count("created") == 3
    _one_exited_per_generation(rec, "k")
    assert s.state("k") == "gave_up" and running_marked(tag) == {}


def test_a_future_its_caller_resolved_does_not_break_the_key(
        sup: tuple[Supervisor, Recorder], request: pytest.FixtureRequest) -> None:
    """Whatever a caller does to its future, the machine's other actions (the exit
    watch, the timeout, other replies) are carried out."""
    s, rec = sup
    tag = _tag(request)
    fut = s.submit_start("k", ["sleep", "60"], timeout=0.3, env=marked_env(tag))
    fut.set_result(None)  # a caller that answers itself: the real answer cannot be set
    rec.wait_for(lambda r: r.count("exited", "k") == 1)
    assert rec.kinds("k") == [("created", 1, None), ("exited", 1, "timeout")]
    assert running_marked(tag) == {}


def test_an_awaited_start_cancelled_by_wait_for_goes_on(request: pytest.FixtureRequest) -> None:
    tag = _tag(request)

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
    thread, deferred behind it, then runs (it used to hang until the 300 s net)."""
    tag = _tag(request)
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


# --- finding 2: a process whose main thread exited (the rebuilt lineage) ---------------------


@pytest.fixture(scope="module")
def leader_exits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_leader_exits(tmp_path_factory.mktemp("leader"))


def _leader_exited(pid: int) -> None:
    row = proctable.read(pid)
    assert row is not None and row.state == "Z" and row.num_threads > 1, row


@pytest.mark.parametrize("mode", MODES)
def test_adopt_of_a_process_whose_main_thread_exited(
        mode: str, leader_exits: Path, procs: Procs) -> None:
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=0.3, kill_timeout=3.0, mode=mode)
    try:
        p = procs.popen([str(leader_exits), "ignore-term"], stdout=subprocess.PIPE)
        pid = int(read_line(p.stdout))
        _leader_exited(pid)
        ident = proctable.identity(pid)
        assert ident is not None
        s.adopt("lx", ident)
        lin = s.lineage("lx")
        assert lin is not None
        assert pid in [m.pid for m in lin.members()]  # live: a member, not an ended root
        assert s.flush_events() and rec.count("exited", "lx") == 0 and s.running("lx")
        status = s.stop("lx")  # it ignores SIGTERM: the grace, then a SIGKILL
        assert not ident.alive()
        assert status is not None and status.signal == 9
        assert s.flush_events()
        assert rec.kinds("lx") == [("created", 1, None), ("exited", 1, "killed")]
        assert p.wait(timeout=10) == -9
    finally:
        s.close()


def _output(rec: Recorder, key: str) -> bytes:
    return b"".join(e.data or b"" for e in rec.of(key) if e.kind == "output")


@pytest.mark.parametrize("mode", MODES)
def test_stop_ends_descendants_whose_main_thread_exited(
        mode: str, leader_exits: Path, request: pytest.FixtureRequest) -> None:
    """As a child, as an escaped (setsid) descendant and as the command itself, each
    ignoring SIGTERM: stop() ends them all, or raises."""
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=0.3, kill_timeout=3.0, mode=mode)
    tag = _tag(request)
    exe = str(leader_exits)
    commands = {
        "child": ["sh", "-c", '"$0" ignore-term & wait', exe],
        "escaped": ["sh", "-c", 'setsid "$0" ignore-term & wait', exe],
        "root": [exe, "ignore-term"],
    }
    try:
        for key, cmd in commands.items():
            s.start(key, cmd, output="events", env=marked_env(tag + key))
            lin = s.lineage(key)
            assert lin is not None
            rec.wait_for(lambda r, key=key: b"\n" in _output(r, key))
            pid = int(_output(rec, key).split(b"\n")[0])
            _leader_exited(pid)
            assert wait_until(lambda lin=lin, pid=pid: pid in [m.pid for m in lin.members()])
        for key in commands:
            s.stop(key)
            assert running_marked(tag + key) == {}, key
        assert s.flush_events()
        for key in commands:
            assert [k for k in rec.kinds(key) if k[0] != "output"] == [
                ("created", 1, None), ("exited", 1, "killed")], key
    finally:
        s.close()


# --- finding 3: a stop never waits for a fresh() factory -------------------------------------


def test_a_stop_does_not_wait_for_a_blocking_fresh_factory(
        sup: tuple[Supervisor, Recorder], request: pytest.FixtureRequest) -> None:
    s, rec = sup
    tag = _tag(request)
    entered, release = threading.Event(), threading.Event()
    worker: list[threading.Thread] = []

    def fresh(key: Hashable) -> list[str]:
        worker.append(threading.current_thread())
        entered.set()
        release.wait(60)  # a network call that hangs
        return ["sleep", "60"]

    s.start("k", ["true"], restart=RestartPolicy(fresh=fresh), env=marked_env(tag))
    assert entered.wait(30)
    assert s.state("k") == "freshening"
    t0 = time.monotonic()
    assert s.stop("k") is None  # nothing ran: the last run had exited already
    took = time.monotonic() - t0
    assert took < 5.0, f"stop waited {took:.1f}s for the factory"  # it used to wait for it
    assert s.state("k") == "stopped"
    release.set()
    worker[0].join(30)  # the factory returned; its answer came, stale
    assert not worker[0].is_alive()
    assert s.flush_events()
    assert [k for k, _, _ in rec.kinds("k")] == ["created", "exited", "restarting"]
    assert s.state("k") == "stopped" and running_marked(tag) == {}
    print(f"\nstop() during a blocked fresh(): {took * 1000:.1f} ms")


@pytest.mark.parametrize("call", ["stop", "remove", "close"])
def test_a_fresh_factory_may_stop_its_own_key(
        call: str, request: pytest.FixtureRequest) -> None:
    """A factory that calls sup.stop(key) / remove(key) / close() used to deadlock
    itself (~301 s): the call waited for the launch that was waiting for it."""
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=0.5, kill_timeout=2.0)
    tag = _tag(request)
    box: dict[str, Any] = {}
    done = threading.Event()

    def fresh(key: Hashable) -> list[str]:
        t0 = time.monotonic()
        try:
            if call == "close":
                s.close()
            else:
                getattr(s, call)(key)
            box["ok"] = True
        except Exception as exc:  # pragma: no cover - reported by the assert
            box["error"] = exc
        box["took"] = time.monotonic() - t0
        done.set()
        return ["sleep", "60"]  # too late: the key is stopped

    try:
        s.start("k", ["true"], restart=RestartPolicy(fresh=fresh), env=marked_env(tag))
        assert done.wait(30), "the factory's own call did not return"
        assert box.get("ok") is True, box
        assert box["took"] < 10.0
        wait_until(lambda: s.state("k") == {"stop": "stopped", "remove": "gone",
                                            "close": "closed"}[call])
        s.flush_events()
        kinds = [k for k, _, _ in rec.kinds("k")]
        assert kinds == ["created", "exited", "restarting",
                         *(["deleted"] if call == "remove" else [])]
        assert running_marked(tag) == {}
    finally:
        s.close()


def test_a_factory_answer_after_a_restart_by_start_is_dropped(
        sup: tuple[Supervisor, Recorder], request: pytest.FixtureRequest) -> None:
    """start() while the factory runs starts at once; the factory's late answer
    launches nothing."""
    s, rec = sup
    tag = _tag(request)
    entered, release = threading.Event(), threading.Event()
    worker: list[threading.Thread] = []

    def fresh(key: Hashable) -> list[str]:
        worker.append(threading.current_thread())
        entered.set()
        release.wait(60)
        return ["sh", "-c", "echo late; sleep 60"]

    s.start("k", ["true"], restart=RestartPolicy(fresh=fresh), env=marked_env(tag + "old"))
    assert entered.wait(30)
    s.start("k", ["sleep", "60"], env=marked_env(tag + "new"))
    release.set()
    worker[0].join(30)
    assert s.flush_events()
    assert [k for k, _, _ in rec.kinds("k")] == ["created", "exited", "restarting", "created"]
    assert s.generation("k") == 2 and list(running_marked(tag)) == [tag + "new"]


# --- finding 5: the asyncio loop during many starts ------------------------------------------


def test_fifty_concurrent_starts_run_nothing_on_the_loop(request: pytest.FixtureRequest) -> None:
    tag = _tag(request)

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
    machine in that order: the stop wins."""

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


# --- finding 6: events() after a close() that raised -----------------------------------------


@needs_freezer
def test_events_go_on_after_a_close_that_raised_and_end_after_one_that_worked(
        tmp_path: Any) -> None:
    """A close() that raised TeardownError has not closed the supervisor: the failed
    key keeps its lineage, its events are still to come, and events() goes on;
    it ends after the close() that succeeds."""
    pidfile = str(tmp_path / "child")
    fz = _Freezer(f"proctable-test-{os.getpid()}-{time.monotonic_ns()}")
    child: list[int] = []

    async def main() -> tuple[list[str], list[str], bool]:
        sup = AsyncSupervisor(grace=0.2, kill_timeout=0.5)
        got: list[str] = []

        async def consume() -> None:
            async for ev in sup.events():
                got.append(ev.kind)

        consumer = asyncio.ensure_future(consume())
        await sup.start("f", ["sh", "-c", f"sleep 60 & echo $! > '{pidfile}'; wait"])
        child.append(int(await asyncio.to_thread(wait_until, lambda: _read(pidfile))))  # type: ignore[call-overload]
        fz.freeze(child[0])
        with pytest.raises(proctable.TeardownError):
            await sup.close()
        await asyncio.to_thread(wait_until, lambda: "teardown_failed" in got)
        await asyncio.sleep(0.2)  # an end of events() would show now
        ended_early = consumer.done()
        before = list(got)
        fz.thaw()
        await sup.close()  # the retry proves it gone: now it is closed
        await asyncio.wait_for(consumer, 20)
        return before, got, ended_early

    try:
        before, after, ended_early = asyncio.run(main())
    finally:
        fz.remove()
        if child and proctable.read(child[0]) is not None:
            try:
                os.kill(child[0], 9)
            except ProcessLookupError:
                pass
    assert not ended_early
    assert before == ["created", "exited", "teardown_failed"]
    assert after == before  # the retry had nothing more to say: the root had exited


# --- finding 8: memory that must be released ---------------------------------------------------


def test_cancelled_timers_leave_the_heap() -> None:
    fired: list[tuple[Hashable, int]] = []
    timers = _Timers(lambda key, ticket: fired.append((key, ticket)))
    try:
        timers.set("anchor", 0, 3600.0)  # due first: every other cancel is not the cheap one
        for i in range(1, 1001):
            timers.set(i, i, 7200.0)
            timers.cancel(i, i)
        assert len(timers) == 1
        assert timers.entries <= 1 + 2 * _Timers._COMPACT_FROM
        timers.set("soon", 1, 0.0)
        wait_until(lambda: fired == [("soon", 1)])
        timers.cancel("anchor", 0)
        assert len(timers) == 0 and timers.entries == 0
    finally:
        timers.close()


def test_a_supervisor_keeps_only_live_timers(sup: tuple[Supervisor, Recorder]) -> None:
    s, _rec = sup
    s.start("anchor", ["sleep", "60"], timeout=1800)
    for i in range(40):
        s.start(("t", i), ["sleep", "60"], timeout=3600)
        s.remove(("t", i), grace=0.2)
    assert len(s._timers) == 1  # white-box: the anchor's timeout only
    assert s._timers.entries <= 1 + 2 * _Timers._COMPACT_FROM


def test_a_removed_key_leaves_only_its_generation(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    for i in range(20):
        s.start(i, ["sleep", "60"])
        s.remove(i, grace=0.2)
    assert s._machines == {}  # white-box: no machine is kept for a removed key
    assert all(s.generation(i) == 1 for i in range(20)) and s.keys() == []
    s.start(3, ["sleep", "60"])  # a later start is a newer generation, never a reused one
    assert s.generation(3) == 2
    s.remove(3, grace=0.2)
    rec.wait_for(lambda r: r.count("deleted", 3) == 2)
    assert [e.generation for e in rec.of(3) if e.kind == "created"] == [1, 2]
