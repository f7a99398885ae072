"""The supervisor against real processes: generations, event order, restart policy,
and the five cases of issue 13 (stop wins, failures surface, start racing close,
keys never wait on each other, the README's missing command)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Hashable, Iterator
from typing import Any, Optional

import pytest

import proctable
from proctable import AsyncSupervisor, RestartPolicy, Supervisor, SupervisorClosed, TeardownError
from proctable.supervise import Event, StartCancelled, _dispatch
from proctable.supervise._machine import Exited
from proctable.supervise._timers import _Timers

from ._lineage import IDLE_SHARE, MODES, cpu_seconds
from ._reliability import SLOW
from ._supervise import LeftJobs, Recorder, ignore_term, marked_env, running_marked, tag_for
from .conftest import PY, is_root, wait_until

PIDFS = proctable.identity(os.getpid()) is not None and \
    proctable.identity(os.getpid()).handle is not None  # type: ignore[union-attr]


@pytest.fixture
def sup() -> Iterator[tuple[Supervisor, Recorder]]:
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=1.0, kill_timeout=2.0)
    try:
        yield s, rec
    finally:
        s.close()


def _pid_gone(pid: int) -> bool:
    row = proctable.read(pid)
    return row is None or row.state == "Z"


# --- the basics --------------------------------------------------------------------------


def test_start_stop_gives_created_then_exited_killed(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    ident = s.start("a", ["sleep", "60"])
    assert ident.alive()
    assert s.generation("a") == 1 and s.running("a") and s.state("a") == "running"
    status = s.stop("a")
    assert not ident.alive()
    rec.wait_for(lambda r: r.count("exited", "a") == 1)
    assert rec.kinds("a") == [("created", 1, None), ("exited", 1, "killed")]
    assert status is not None and status.signal == signal.SIGTERM
    assert not s.running("a") and "a" in s and s.state("a") == "stopped"  # stop keeps the key
    assert s.stop("a") is None  # nothing runs: nothing to stop


@pytest.mark.skipif(not PIDFS, reason="no pidfs on this kernel: identities have no handle")
def test_identities_carry_the_pidfs_handle(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    ident = s.start("h", ["sleep", "60"])
    assert ident.handle is not None
    assert ident == proctable.identity(ident.pid)  # the same process, handle and all
    p = subprocess.Popen(["sleep", "60"])
    try:
        bare = proctable.Identity(p.pid, proctable.identity(p.pid).start_time)  # type: ignore[union-attr]
        adopted = s.adopt("ad", bare)
        assert adopted.handle is not None and adopted.start_time == bare.start_time
        rec.wait_for(lambda r: r.count("created") == 2)
        assert all(e.identity is not None and e.identity.handle is not None for e in rec.events)
        s.remove("ad", grace=0.5)
    finally:
        p.kill()
        p.wait(timeout=10)


def test_remove_running_that_ignores_sigterm(sup: tuple[Supervisor, Recorder],
                                             tmp_path: Any) -> None:
    s, rec = sup
    marker = str(tmp_path / "ready")
    ident = s.start("sh", ignore_term(marker))
    wait_until(lambda: os.path.exists(marker))
    s.remove("sh", grace=0.5)
    rec.wait_for(lambda r: r.count("deleted") == 1)
    assert rec.kinds("sh") == [("created", 1, None), ("exited", 1, "killed"), ("deleted", 1, None)]
    exited = next(e for e in rec.events if e.kind == "exited")
    assert exited.exit is not None and exited.exit.signal == signal.SIGKILL
    assert not ident.alive()
    assert "sh" not in s
    assert s.generation("sh") == 1  # kept after remove
    with pytest.raises(KeyError):
        s.remove("sh")


def test_natural_exit_then_remove_gives_one_exited(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    s.start("x", [PY, "-c", "import sys; sys.exit(4)"])
    rec.wait_for(lambda r: r.count("exited", "x") == 1)
    s.remove("x")
    rec.wait_for(lambda r: r.count("deleted", "x") == 1)
    assert rec.kinds("x") == [("created", 1, None), ("exited", 1, "exited"), ("deleted", 1, None)]
    ev = next(e for e in rec.events if e.kind == "exited")
    assert ev.exit is not None and ev.exit.code == 4


def test_signal_death_is_signaled(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    ident = s.start("k", ["sleep", "60"])
    os.kill(ident.pid, signal.SIGKILL)  # not sent by the supervisor
    rec.wait_for(lambda r: r.count("exited", "k") == 1)
    ev = next(e for e in rec.events if e.kind == "exited")
    assert ev.status == "signaled" and ev.exit is not None and ev.exit.signal == 9


def test_timeout(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    ident = s.start("t", ["sleep", "60"], timeout=0.3)
    rec.wait_for(lambda r: r.count("exited", "t") == 1)
    assert rec.kinds("t") == [("created", 1, None), ("exited", 1, "timeout")]
    assert not ident.alive()


def test_respawn_with_late_exit_of_old_generation(sup: tuple[Supervisor, Recorder],
                                                  tmp_path: Any) -> None:
    """The old process's exit arrives after the new one has exited and been removed."""
    s, rec = sup
    marker = str(tmp_path / "ready")
    old = s.start("k", ignore_term(marker))
    wait_until(lambda: os.path.exists(marker))
    new = s.start("k", [PY, "-c", "import time; time.sleep(0.2)"])  # supersedes: old is killed
    assert old != new and s.generation("k") == 2
    rec.wait_for(lambda r: r.count("exited", "k") == 2)
    s.remove("k")
    rec.wait_for(lambda r: r.count("deleted", "k") == 1)
    assert s.flush_events()
    assert rec.kinds("k") == [
        ("created", 1, None), ("exited", 1, "killed"),
        ("created", 2, None), ("exited", 2, "exited"), ("deleted", 2, None),
    ]
    # A later start is a newer generation, never a reused one.
    s.start("k", ["sleep", "60"])
    assert s.generation("k") == 3
    s.remove("k")


def test_late_exit_of_a_removed_generation_is_dropped(sup: tuple[Supervisor, Recorder]) -> None:
    """Field bug 1, at the point where it bit: the old process's exit notification
    arrives after its successor has exited and been removed. It must reach no one."""
    s, rec = sup
    s.start("k", ["sleep", "60"])
    old_ticket = s._machines["k"].ticket("watch")  # white-box: what the old exit answers
    assert old_ticket is not None
    s.start("k", [PY, "-c", "pass"])  # supersedes generation 1 (exited killed)
    rec.wait_for(lambda r: r.count("exited", "k") == 2)
    s.remove("k")
    rec.wait_for(lambda r: r.count("deleted", "k") == 1)
    before = rec.kinds("k")
    s._feed("k", Exited(old_ticket, proctable.ExitStatus(0, None), time.monotonic()))
    s.start("k", ["sleep", "60"])  # a third generation, current now
    s._feed("k", Exited(old_ticket, proctable.ExitStatus(0, None), time.monotonic()))
    assert s.flush_events()
    assert rec.kinds("k") == [*before, ("created", 3, None)]  # nothing else, no exited
    assert s.running("k") and s.generation("k") == 3


def test_callbacks_call_back_in_without_deadlock(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    done = threading.Event()

    def hook(ev: Event) -> None:
        if ev.key == "r" and ev.kind == "exited" and ev.generation == 1:
            s.start("r", ["sleep", "60"])  # from inside the callback
            s.stop("r")
            s.start("r", ["sleep", "60"])
            s.remove("r")
            done.set()

    rec.hook = hook
    s.start("r", [PY, "-c", "pass"])
    assert done.wait(30)
    assert s.flush_events()
    assert rec.kinds("r") == [("created", 1, None), ("exited", 1, "exited"),
                              ("created", 2, None), ("exited", 2, "killed"),
                              ("created", 3, None), ("exited", 3, "killed"),
                              ("deleted", 3, None)]


def test_deliberate_exit_reruns_fresh(sup: tuple[Supervisor, Recorder], tmp_path: Any) -> None:
    s, rec = sup
    calls: list[Hashable] = []
    log = str(tmp_path / "log")

    def prog(word: str) -> list[str]:
        return ["sh", "-c", f"echo {word} >> '{log}'"]

    def fresh(key: Hashable) -> Optional[list[str]]:
        calls.append(key)  # asked at the restart, after the delay
        return None if len(calls) >= 2 else prog("fresh")

    s.start("f", prog("original"), restart=RestartPolicy(fresh=fresh))
    rec.wait_for(lambda r: r.count("gave_up", "f") == 1)
    kinds = [k for k, _, _ in rec.kinds("f")]
    assert kinds == ["created", "exited", "restarting", "created", "exited", "restarting",
                     "gave_up"]
    restarting = next(e for e in rec.events if e.kind == "restarting")
    assert restarting.reason is not None and "fresh" in restarting.reason
    gave_up = next(e for e in rec.events if e.kind == "gave_up")
    assert gave_up.reason == "the fresh factory said stop" and gave_up.generation == 2
    assert calls == ["f", "f"]
    with open(log) as f:
        assert f.read().split() == ["original", "fresh"]  # the rerun took the fresh args


def test_a_bad_fresh_answer_gives_up_loudly(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    s.start("b", [PY, "-c", "pass"], restart=RestartPolicy(fresh=lambda key: "not a list"))
    rec.wait_for(lambda r: r.count("gave_up", "b") == 1)
    gave_up = next(e for e in rec.events if e.kind == "gave_up")
    assert gave_up.reason is not None and "fresh factory failed" in gave_up.reason
    assert rec.count("created", "b") == 1


def test_adopt_carries_the_policy_and_factory(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    p = subprocess.Popen([PY, "-c", "import time; time.sleep(0.5)"])
    try:
        ident = proctable.identity(p.pid)
        assert ident is not None
        s.adopt("a", ident, restart=RestartPolicy(fresh=lambda key: ["sleep", "60"]))
        rec.wait_for(lambda r: r.count("created", "a") == 2)
        assert [k for k, _, _ in rec.kinds("a")] == ["created", "exited", "restarting", "created"]
        assert s.generation("a") == 2 and s.running("a")
    finally:
        p.wait(timeout=10)


def test_adopted_without_args_gives_up_on_a_crash(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    p = subprocess.Popen(["sh", "-c", "sleep 0.3; exit 3"])
    try:
        ident = proctable.identity(p.pid)
        assert ident is not None
        s.adopt("a", ident, restart=RestartPolicy())
        rec.wait_for(lambda r: r.count("gave_up", "a") == 1)
        gave_up = next(e for e in rec.events if e.kind == "gave_up")
        assert "unknown" in (gave_up.reason or "")
    finally:
        p.wait(timeout=10)


def test_crash_recovers_with_original_args_then_gives_up(
        sup: tuple[Supervisor, Recorder], tmp_path: Any) -> None:
    s, rec = sup
    marker = str(tmp_path / "runs")
    s.start("c", ["sh", "-c", f"printf x >> '{marker}'; exit 3"],
            restart=RestartPolicy(max_restarts=2))
    rec.wait_for(lambda r: r.count("gave_up", "c") == 1)
    kinds = [k for k, _, _ in rec.kinds("c")]
    assert kinds == ["created", "exited", "restarting", "created", "exited", "restarting",
                     "created", "exited", "gave_up"]
    with open(marker) as f:
        assert f.read() == "xxx"  # the original args each time
    gave_up = next(e for e in rec.events if e.kind == "gave_up")
    assert "budget" in (gave_up.reason or "")
    assert [e.generation for e in rec.events if e.kind == "created"] == [1, 2, 3]


def test_fast_clean_exits_give_up(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    s.start("q", ["true"], restart=RestartPolicy(max_fast_exits=3, fast_exit=5.0))
    rec.wait_for(lambda r: r.count("gave_up", "q") == 1)
    assert rec.count("created", "q") == 3
    assert s.flush_events()
    assert rec.count("created", "q") == 3 and s.state("q") == "gave_up"


def test_gave_up_is_a_state_of_its_own(sup: tuple[Supervisor, Recorder]) -> None:
    """After gave_up the key reads gave_up, not stopped as after a deliberate stop;
    a start runs it again, and a stop of it then reads stopped."""
    s, rec = sup
    s.start("g", ["sh", "-c", "exit 4"], restart=RestartPolicy(max_restarts=0))
    rec.wait_for(lambda r: r.count("gave_up", "g") == 1)
    assert s.state("g") == "gave_up" and "g" in s and not s.running("g")
    assert s.stop("g") is None and s.state("g") == "gave_up"  # nothing ran to stop
    s.start("g", ["sleep", "60"])
    assert s.state("g") == "running"
    s.stop("g")
    assert s.state("g") == "stopped"


def test_a_crash_of_a_fresh_rerun_reruns_the_fresh_args(
        sup: tuple[Supervisor, Recorder], tmp_path: Any) -> None:
    """The rerun after a crash is of the args that crashed, the fresh ones here, and
    the restarting event says so (it used to say "with the original args")."""
    s, rec = sup
    log = str(tmp_path / "log")

    def fresh(key: Hashable) -> list[str]:
        return ["sh", "-c", f"echo fresh >> '{log}'; exit 3"]

    s.start("r", ["sh", "-c", f"echo original >> '{log}'"],
            restart=RestartPolicy(fresh=fresh, max_restarts=1))
    rec.wait_for(lambda r: r.count("gave_up", "r") == 1)
    assert [k for k, _, _ in rec.kinds("r")] == [
        "created", "exited", "restarting", "created", "exited", "restarting",
        "created", "exited", "gave_up"]
    with open(log) as f:
        assert f.read().split() == ["original", "fresh", "fresh"]
    recover = [e for e in rec.of("r") if e.kind == "restarting"][1]
    assert recover.reason is not None and "original" not in recover.reason
    assert "exit 3" in recover.reason, recover.reason  # the fresh args, named


def test_adopt_then_remove(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    p = subprocess.Popen(["sleep", "60"])
    try:
        ident = proctable.identity(p.pid)
        assert ident is not None
        got = s.adopt("ad", ident)
        assert got == ident
        s.remove("ad", grace=0.5)
        rec.wait_for(lambda r: r.count("deleted", "ad") == 1)
        assert rec.kinds("ad") == [("created", 1, None), ("exited", 1, "killed"),
                                   ("deleted", 1, None)]
        assert p.wait(timeout=10) == -signal.SIGTERM
    finally:
        if p.returncode is None:
            p.kill()
            p.wait(timeout=10)


def test_stop_kills_escaped_setsid_child(sup: tuple[Supervisor, Recorder],
                                         tmp_path: Any) -> None:
    s, _rec = sup
    pidfile = str(tmp_path / "pid")
    s.start("e", ["sh", "-c", f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 60' & sleep 60"])

    def escaped() -> Optional[int]:
        try:
            with open(pidfile) as f:
                text = f.read().strip()
        except FileNotFoundError:
            return None
        return int(text) if text else None

    pid = wait_until(escaped)
    assert isinstance(pid, int)
    row = proctable.read(pid)
    assert row is not None and row.sid == pid  # it left the session
    s.stop("e", grace=0.5)
    assert _pid_gone(pid)  # stop returns once every member is proven gone


def test_bad_input(sup: tuple[Supervisor, Recorder]) -> None:
    s, _ = sup
    with pytest.raises(TypeError):
        s.start("b", "sleep 5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):  # a list, as asked: a wrong value
        s.start("b", [])
    with pytest.raises(TypeError):
        s.start("b", ["sleep", 1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="delay"):
        s.start("b", ["sleep", "1"], restart=RestartPolicy(delay="1"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        s.start("b", ["sleep", "1"], restart="always")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        s.start("b", ["sleep", "1"], timeout=0)
    with pytest.raises(KeyError):
        s.stop("nope")
    with pytest.raises(TypeError):
        s.adopt("b", 1234)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        s.stop("nope", grace=-1)
    assert "b" not in s and "nope" not in s and s.keys() == []


def test_an_on_event_that_cannot_be_called_is_refused() -> None:
    """``Supervisor(on_event="x")`` was accepted, and then every event logged a
    TypeError (issue 30, item 10, found by the outside review's wrong-typed inputs)."""
    async def make_async(bad: Any) -> None:
        proctable.AsyncSupervisor(on_event=bad)

    for bad in ("x", 1, ["f"]):
        with pytest.raises(TypeError, match="on_event"):
            Supervisor(on_event=bad)
        with pytest.raises(TypeError, match="on_event"):
            asyncio.run(make_async(bad))
    Supervisor(on_event=None).close()


def test_an_unknown_key_is_a_key_error_naming_it_from_the_call(
        sup: tuple[Supervisor, Recorder]) -> None:
    """``stop("nokey")`` raised a bare KeyError out of concurrent.futures (issue 30,
    item 10, found by the outside review): the KeyError names the key in its message,
    still has the key as its argument, and its traceback ends in the call, not in
    concurrent.futures."""
    s, _ = sup
    for call in (lambda: s.stop("nokey"), lambda: s.remove("nokey")):
        with pytest.raises(KeyError) as info:
            call()
        assert "nokey" in str(info.value) and info.value.args[0] == "nokey"
        files = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
        assert not any("concurrent" in f for f in files), files
        assert any(f.endswith(os.path.join("supervise", "_runtime.py")) for f in files)


def test_a_key_that_is_none_or_empty_is_refused(sup: tuple[Supervisor, Recorder]) -> None:
    """``start("", ...)`` and ``start(None, ...)`` were accepted where the sidecar
    refuses an empty key (issue 30, item 10, found by the outside review): None and
    unhashable keys are a TypeError, an empty str or bytes a ValueError, for start and
    adopt alike; nothing is created."""
    s, rec = sup
    with pytest.raises(ValueError, match="empty"):
        s.start("", ["sleep", "5"])
    with pytest.raises(ValueError, match="empty"):
        s.start(b"", ["sleep", "5"])
    with pytest.raises(TypeError, match="None"):
        s.start(None, ["sleep", "5"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="hashable"):
        s.start(["k"], ["sleep", "5"])  # type: ignore[arg-type]
    me = proctable.identity(os.getpid())
    assert me is not None
    with pytest.raises(ValueError, match="empty"):
        s.adopt("", me)
    with pytest.raises(TypeError, match="None"):
        s.adopt(None, me)  # type: ignore[arg-type]
    assert s.flush_events()
    assert s.keys() == [] and rec.events == []
    s.start(0, ["true"])  # other falsy keys are keys
    assert 0 in s


@pytest.mark.parametrize("io", [
    {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL},
    {},
    {"output": "events"},
    {"pty": (24, 80)},
], ids=["devnull", "inherit", "events", "pty"])
def test_exited_of_a_natural_exit_comes_after_its_teardown(tmp_path: Any,
                                                           io: dict[str, Any]) -> None:
    """A command that leaves ``setsid nohup`` jobs and exits: with output not owned
    (``stdout=DEVNULL`` here, ``output: "discard"`` over the sidecar), its ``exited``
    came at once, with all four jobs still running, 25 runs of 25; only owned output
    held it back (issue 30, item 4, found by the acceptance scenarios). In every
    output mode the natural exit's teardown ends first: at the ``exited`` (looked at
    in ``on_event`` itself) no job runs, by pid and start time."""
    jobs = LeftJobs(str(tmp_path))
    at_exited: list[list[proctable.Identity]] = []
    rec = Recorder()

    def on_event(ev: Event) -> None:
        if ev.kind == "exited":  # looked at before the event is recorded and waited for
            at_exited.append(jobs.alive())
        rec(ev)

    try:
        # (the jobs ignore SIGTERM: the teardown waits out the grace, long enough
        # for an exited sent at once to find them running)
        with Supervisor(on_event=on_event, grace=0.3, kill_timeout=2.0) as s:
            s.start("p", jobs.args, **io)
            assert len(jobs.started()) == 4
            jobs.go()
            rec.wait_for(lambda r: r.count("exited", "p") == 1)
            assert at_exited == [[]], "jobs ran at the exited event"
            ev = [e for e in rec.of("p") if e.kind != "output"]
            assert [(e.kind, e.status) for e in ev] == [("created", None), ("exited", "exited")]
            assert ev[1].exit is not None and ev[1].exit.code == 0
            assert s.state("p") == "stopped"
    finally:
        jobs.clean()


# --- issue 13, case 5: a command that cannot start ------------------------------------------


def test_start_of_a_missing_command_raises_and_emits_nothing(
        sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    with pytest.raises(FileNotFoundError):
        s.start("m", ["/nonexistent/command"])
    assert s.flush_events()
    assert rec.of("m") == [] and "m" not in s and s.generation("m") == 0
    s.start("m", ["sleep", "60"])  # the key is free: the failed start used no generation
    assert s.generation("m") == 1
    with pytest.raises(FileNotFoundError):  # a running key is stopped first, then it fails
        s.start("m", ["/nonexistent/command"])
    assert s.flush_events()
    assert rec.kinds("m") == [("created", 1, None), ("exited", 1, "killed")]
    assert "m" in s and s.state("m") == "stopped"


def test_a_restart_that_cannot_start_gives_up(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    s.start("m", ["true"], restart=RestartPolicy(fresh=lambda key: ["/nonexistent/command"]))
    rec.wait_for(lambda r: r.count("gave_up", "m") == 1)
    assert [k for k, _, _ in rec.kinds("m")] == ["created", "exited", "restarting", "gave_up"]
    gave_up = rec.of("m")[-1]
    assert "could not start" in (gave_up.reason or "") and "/nonexistent/command" in gave_up.reason


# --- issue 13, case 1: stop during a restart delay ------------------------------------------


def test_stop_during_a_restart_delay_stops_the_key(
        sup: tuple[Supervisor, Recorder], request: pytest.FixtureRequest) -> None:
    s, rec = sup
    tag = tag_for(request)
    s.start("d", ["sh", "-c", "exit 1"], restart=RestartPolicy(delay=1.0),
            env=marked_env(tag))
    rec.wait_for(lambda r: r.count("restarting", "d") == 1)
    assert s.state("d") == "restart_pending"
    assert s.stop("d") is None  # it had exited already; the pending restart is cancelled
    assert s.state("d") == "stopped" and not s.running("d")
    time.sleep(1.5)  # past the delay: the restart that must not happen would be due
    assert s.flush_events()
    assert [k for k, _, _ in rec.kinds("d")] == ["created", "exited", "restarting"]
    assert running_marked(tag) == {}


def test_stop_wins_against_an_immediate_restart(
        sup: tuple[Supervisor, Recorder], request: pytest.FixtureRequest) -> None:
    """delay=0: the restart and the stop race. Stopped at every point of a crash loop
    (and from the restarting callback), the key stays stopped and nothing of it runs."""
    s, rec = sup
    tag = tag_for(request)
    policy = RestartPolicy(delay=0.0, max_restarts=10_000)
    stopped_in_callback = threading.Event()

    def hook(ev: Event) -> None:
        if ev.key == "cb" and ev.kind == "restarting" and not stopped_in_callback.is_set():
            s.stop("cb")  # the relaunch is due at once: stop from inside the race
            stopped_in_callback.set()

    rec.hook = hook
    s.start("cb", ["sh", "-c", "exit 1"], restart=policy, env=marked_env(tag + "cb"))
    assert stopped_in_callback.wait(30)
    keys = [f"loop{i}" for i in range(4)]
    for i, key in enumerate(keys):
        s.start(key, ["sh", "-c", "exit 1"], restart=policy, env=marked_env(tag + key))
        rec.wait_for(lambda r, k=key, n=i: r.count("restarting", k) >= 1 + n)
        s.stop(key)
    assert s.flush_events()
    counts = {k: rec.count("created", k) for k in ["cb", *keys]}
    for key in ["cb", *keys]:
        assert s.state(key) == "stopped"
        assert rec.kinds(key)[-1][0] != "created"
    assert running_marked(tag) == {}
    time.sleep(0.5)  # a restart that was not cancelled would show up here
    assert s.flush_events()
    assert {k: rec.count("created", k) for k in ["cb", *keys]} == counts
    for key in ["cb", *keys]:
        per_gen: dict[int, list[str]] = {}
        for kind, gen, _ in rec.kinds(key):
            per_gen.setdefault(gen, []).append(kind)
        assert all(v.count("exited") == 1 for v in per_gen.values()), per_gen


def test_a_deferred_start_is_cancelled_by_a_later_stop(
        sup: tuple[Supervisor, Recorder], tmp_path: Any) -> None:
    s, rec = sup
    marker = str(tmp_path / "ready")
    s.start("k", ignore_term(marker))
    wait_until(lambda: os.path.exists(marker))
    stopping = threading.Thread(target=s.stop, args=("k",), kwargs={"grace": 1.0})
    stopping.start()
    wait_until(lambda: s.state("k") == "stopping")
    fut = s.submit_start("k", ["sleep", "60"])  # waits for the stop's teardown...
    s.submit_stop("k")                          # ...and a stop that comes after it wins
    with pytest.raises(StartCancelled):
        fut.result(timeout=30)
    stopping.join(30)
    assert s.flush_events()
    assert rec.kinds("k") == [("created", 1, None), ("exited", 1, "killed")]


def test_a_stop_cancels_a_start_being_launched(
        sup: tuple[Supervisor, Recorder], request: pytest.FixtureRequest) -> None:
    """stop() while another thread's start() launches: the start raises
    StartCancelled, its process is torn down without a created, nothing runs."""
    s, rec = sup
    tag = tag_for(request)
    cancelled = 0
    for i in range(5):
        key = f"k{i}"
        fut = s.submit_start(key, ["sleep", "60"], env=marked_env(tag))
        assert s.state(key) in ("starting", "running")  # submit fed it already
        s.stop(key)
        try:
            fut.result(timeout=30)
        except StartCancelled:
            cancelled += 1
            assert rec.of(key) == [] and key not in s and s.generation(key) == 0
        else:  # the launch won the race: then the stop stopped it
            assert s.flush_events()
            assert rec.kinds(key) == [("created", 1, None), ("exited", 1, "killed")]
        assert running_marked(tag) == {}
    assert cancelled >= 1  # a launch takes tens of ms: the stop comes first at least once


# --- issue 13, case 2: a teardown that cannot prove every member gone -----------------------

FREEZER = "/sys/fs/cgroup/freezer"
needs_freezer = pytest.mark.skipif(
    not (is_root() and os.path.isfile(os.path.join(FREEZER, "cgroup.procs"))),
    reason="needs root and a cgroup v1 freezer at /sys/fs/cgroup/freezer")


class _Freezer:
    """A cgroup v1 freezer cgroup of this test's own: a frozen process there cannot
    die, not even of SIGKILL, until it is thawed."""

    def __init__(self, name: str) -> None:
        self.path = os.path.join(FREEZER, name)
        os.mkdir(self.path)

    def _state(self, value: str) -> None:
        with open(os.path.join(self.path, "freezer.state"), "w") as f:
            f.write(value)
        wait_until(lambda: self.state() == value, timeout=10)

    def state(self) -> str:
        with open(os.path.join(self.path, "freezer.state")) as f:
            return f.read().strip()

    def freeze(self, pid: int) -> None:
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(pid))
        self._state("FROZEN")

    def thaw(self) -> None:
        self._state("THAWED")

    def remove(self) -> None:
        self.thaw()
        deadline = time.monotonic() + 10
        while os.path.isdir(self.path):
            try:
                os.rmdir(self.path)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def _v2_cgroup(pid: int) -> Optional[str]:
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip()
    return None


@needs_freezer
def test_teardown_failure_surfaces_keeps_the_key_and_retries(tmp_path: Any) -> None:
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=0.2, kill_timeout=0.5)
    pidfile = str(tmp_path / "child")
    fz = _Freezer(f"proctable-test-{os.getpid()}-{time.monotonic_ns()}")
    child: Optional[int] = None
    try:
        root = s.start("f", ["sh", "-c", f"sleep 60 & echo $! > '{pidfile}'; wait"])
        child = int(wait_until(lambda: _read(pidfile)))  # type: ignore[call-overload]
        lin = s.lineage("f")
        assert lin is not None
        cg = _v2_cgroup(child) if lin.mode == "cgroup" else None
        fz.freeze(child)

        with pytest.raises(TeardownError) as err:
            s.stop("f")
        assert child in [p.pid for p in err.value.survivors]
        rec.wait_for(lambda r: r.count("teardown_failed", "f") == 1)
        failed = rec.of("f")[-1]
        assert failed.survivors is not None and child in [p.pid for p in failed.survivors]
        # The root's own exited still says what the root did: it was stopped.
        exited = next(e for e in rec.of("f") if e.kind == "exited")
        assert exited.status == "killed" and exited.identity == root
        assert s.state("f") == "failed_exited" and "f" in s and s.lineage("f") is lin
        if cg is not None:  # the lineage keeps its cgroup for the retry
            assert os.path.isdir("/sys/fs/cgroup/unified" + cg)

        with pytest.raises(TeardownError):
            s.remove("f")  # not deleted while a member is known to run
        with pytest.raises(TeardownError):
            s.start("f", ["sleep", "1"])  # refused: stop() it first
        with pytest.raises(TeardownError):
            s.close()
        assert s.flush_events()
        assert rec.count("deleted", "f") == 0 and rec.count("teardown_failed", "f") == 3
        assert rec.count("created", "f") == 1 and "f" in s

        fz.thaw()
        assert s.stop("f") is None  # the retry proves it gone; the root had ended already
        assert _pid_gone(child)
        if cg is not None:
            assert not os.path.exists("/sys/fs/cgroup/unified" + cg)
        s.remove("f")
        assert s.flush_events()
        assert [k for k, _, _ in rec.kinds("f")] == [
            "created", "exited", "teardown_failed", "teardown_failed", "teardown_failed",
            "deleted"]
        s.close()
    finally:
        fz.remove()
        if child is not None and not _pid_gone(child):
            os.kill(child, signal.SIGKILL)
        try:
            s.close()
        except TeardownError:
            pass


@needs_freezer
def test_events_go_on_after_a_close_that_raised_and_end_after_one_that_worked(
        tmp_path: Any) -> None:
    """A close() that raised TeardownError has not closed the supervisor: the failed key
    keeps its lineage, its events are still to come, and events() goes on; it ends after
    the close() that succeeds.

    Found by the hostile review of the rebuilt supervisor (issue 13 follow-up), against
    real processes (finding 6)."""
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


# --- issue 13, case 3: start() racing close() ---------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "scan"])
def test_start_racing_close_leaves_nothing_running(
        mode: str, request: pytest.FixtureRequest) -> None:
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=0.5, kill_timeout=2.0, mode=mode)
    tag = tag_for(request)
    results: list[tuple[Hashable, Any]] = []
    lock = threading.Lock()
    go = threading.Event()

    def starter(n: int) -> None:
        go.wait(10)
        for i in range(100):
            key = f"{n}-{i}"
            try:
                got: Any = s.start(key, ["sleep", "60"], env=marked_env(tag))
            except SupervisorClosed as exc:
                got = exc
            with lock:
                results.append((key, got))
            if isinstance(got, SupervisorClosed):
                return

    threads = [threading.Thread(target=starter, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    go.set()
    rec.wait_for(lambda r: r.count("created") >= 3)
    s.close()
    closed_at = time.monotonic()
    for t in threads:
        t.join(60)
    assert all(isinstance(got, (proctable.Identity, SupervisorClosed)) for _, got in results)
    assert any(isinstance(got, SupervisorClosed) for _, got in results)
    for _key, got in results:
        if isinstance(got, proctable.Identity):
            assert not got.alive()
    assert running_marked(tag) == {}
    with pytest.raises(SupervisorClosed):
        s.start("late", ["sleep", "60"])
    assert time.monotonic() >= closed_at
    per_key: dict[Hashable, list[str]] = {}
    for e in rec.events:
        per_key.setdefault(e.key, []).append(e.kind)
    assert all(v == ["created", "exited"] for v in per_key.values()), per_key


# --- issue 13, case 4: keys never wait on each other ----------------------------------------


def test_a_slow_teardown_does_not_delay_another_keys_timeout(tmp_path: Any) -> None:
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=3.0, kill_timeout=2.0)
    try:
        marker = str(tmp_path / "ready")
        s.start("slow", ignore_term(marker))
        wait_until(lambda: os.path.exists(marker))
        stopper = threading.Thread(target=s.stop, args=("slow",))
        t0 = time.monotonic()
        stopper.start()
        wait_until(lambda: s.state("slow") == "stopping")
        started = time.monotonic()
        s.start("quick", ["sleep", "60"], timeout=0.5)
        rec.wait_for(lambda r: r.count("exited", "quick") == 1)
        _, arrived = rec.first("exited", "quick")
        late = arrived - started - 0.5
        # Waiting behind the slow key would make it at least its 3 s grace late: a
        # margin of 1 s for a loaded host (a shorter grace would leave less).
        assert late < 2.0, f"the timeout fired {late:.2f}s late"
        assert rec.first("exited", "quick")[0].status == "timeout"
        stopper.join(30)
        assert time.monotonic() - t0 >= 3.0  # the slow one did need its grace
    finally:
        s.close()


def test_close_tears_every_key_down_side_by_side(tmp_path: Any) -> None:
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=1.0, kill_timeout=2.0)
    markers = [str(tmp_path / f"ready{i}") for i in range(4)]
    for i, m in enumerate(markers):
        s.start(f"k{i}", ignore_term(m))
    wait_until(lambda: all(os.path.exists(m) for m in markers))
    t0 = time.monotonic()
    s.close()
    took = time.monotonic() - t0
    assert took >= 1.0  # each needed its grace...
    assert took < 3.5, f"close took {took:.2f}s: the sum of the graces is 4s"  # ...side by side
    assert rec.count("exited") == 4
    assert all(e.exit is not None and e.exit.signal == signal.SIGKILL
               for e in rec.events if e.kind == "exited")


def test_closed_supervisor_refuses_and_close_stops_all() -> None:
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=0.5, kill_timeout=2.0)
    a = s.start("a", ["sleep", "60"])
    b = s.start("b", ["sleep", "60"])
    s.close()
    assert not a.alive() and not b.alive()
    assert rec.count("exited") == 2
    with pytest.raises(SupervisorClosed):
        s.start("c", ["sleep", "1"])
    assert s.stop("a") is None and s.state("a") == "closed"
    s.close()  # twice is fine


# -- a caller that stops waiting never breaks the key ----------------------------------


def _one_exited_per_generation(rec: Recorder, key: Hashable) -> None:
    per_gen: dict[int, list[str]] = {}
    for kind, gen, _ in rec.kinds(key):
        per_gen.setdefault(gen, []).append(kind)
    for gen, kinds in per_gen.items():
        if "created" in kinds:
            assert kinds.count("exited") == 1, (gen, kinds)


def test_a_cancelled_submit_start_goes_on_in_the_background(
        sup: tuple[Supervisor, Recorder], request: pytest.FixtureRequest) -> None:
    """cancel() on submit_start's future used to make the answer raise InvalidStateError
    and drop the exit watch: the key stayed running forever.

    Found by the hostile review of the rebuilt supervisor (issue 13 follow-up), against
    real processes (finding 1)."""
    s, rec = sup
    tag = tag_for(request)
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
    watch, the timeout, other replies) are carried out.

    Found by the hostile review of the rebuilt supervisor (issue 13 follow-up), against
    real processes (finding 1)."""
    s, rec = sup
    tag = tag_for(request)
    fut = s.submit_start("k", ["sleep", "60"], timeout=0.3, env=marked_env(tag))
    fut.set_result(None)  # a caller that answers itself: the real answer cannot be set
    rec.wait_for(lambda r: r.count("exited", "k") == 1)
    assert rec.kinds("k") == [("created", 1, None), ("exited", 1, "timeout")]
    assert running_marked(tag) == {}


# -- a stop never waits for a fresh() factory ------------------------------------------


class _BlockedFresh:
    """A fresh() factory that blocks (a network call that hangs, bounded) until
    released, then answers command."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.entered, self.release = threading.Event(), threading.Event()
        self.worker: list[threading.Thread] = []

    def __call__(self, key: Hashable) -> list[str]:
        self.worker.append(threading.current_thread())
        self.entered.set()
        self.release.wait(60)
        return self.command

    def answered(self) -> None:
        """Release it, and wait (bounded) for its answer to have gone: its worker is
        done with the job once it is idle again (named so) or ended (an idle one
        lingers 2 s before it ends)."""
        self.release.set()
        worker = self.worker[0]
        wait_until(lambda: worker.name == "proctable-supervisor-idle" or not worker.is_alive(),
                   timeout=30)


def test_a_stop_does_not_wait_for_a_blocking_fresh_factory(
        sup: tuple[Supervisor, Recorder], request: pytest.FixtureRequest) -> None:
    """A stop() waited for a fresh() factory that blocks (a network call that hangs).
    Found by the hostile review of the rebuilt supervisor (issue 13 follow-up), against
    real processes (finding 3)."""
    s, rec = sup
    tag = tag_for(request)
    fresh = _BlockedFresh(["sleep", "60"])
    s.start("k", ["true"], restart=RestartPolicy(fresh=fresh), env=marked_env(tag))
    assert fresh.entered.wait(30)
    assert s.state("k") == "freshening"
    t0 = time.monotonic()
    assert s.stop("k") is None  # nothing ran: the last run had exited already
    took = time.monotonic() - t0
    assert took < 5.0, f"stop waited {took:.1f}s for the factory"  # it used to wait for it
    assert s.state("k") == "stopped"
    fresh.answered()  # the factory returned; its answer came, stale
    assert s.flush_events()
    assert [k for k, _, _ in rec.kinds("k")] == ["created", "exited", "restarting"]
    assert s.state("k") == "stopped" and running_marked(tag) == {}
    print(f"\nstop() during a blocked fresh(): {took * 1000:.1f} ms")


@pytest.mark.parametrize("call", ["stop", "remove", "close"])
def test_a_fresh_factory_may_stop_its_own_key(
        call: str, request: pytest.FixtureRequest) -> None:
    """A factory that calls sup.stop(key) / remove(key) / close() used to deadlock
    itself (~301 s): the call waited for the launch that was waiting for it.

    Found by the hostile review of the rebuilt supervisor (issue 13 follow-up), against
    real processes (finding 3)."""
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=0.5, kill_timeout=2.0)
    tag = tag_for(request)
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
    """start() while the factory runs starts at once; the factory's late answer launches
    nothing.

    Found by the hostile review of the rebuilt supervisor (issue 13 follow-up), against
    real processes (finding 3)."""
    s, rec = sup
    tag = tag_for(request)
    fresh = _BlockedFresh(["sh", "-c", "echo late; sleep 60"])
    s.start("k", ["true"], restart=RestartPolicy(fresh=fresh), env=marked_env(tag + "old"))
    assert fresh.entered.wait(30)
    s.start("k", ["sleep", "60"], env=marked_env(tag + "new"))
    fresh.answered()
    assert s.flush_events()
    assert [k for k, _, _ in rec.kinds("k")] == ["created", "exited", "restarting", "created"]
    assert s.generation("k") == 2 and list(running_marked(tag)) == [tag + "new"]


# -- memory that is released: timers, machines of removed keys -------------------------


def test_cancelled_timers_leave_the_heap() -> None:
    """Memory that must be released: a cancelled timer leaves the heap (a compaction
    bounds what cancelled entries keep). Found by the hostile review of the rebuilt
    supervisor (issue 13 follow-up), against real processes (finding 8)."""
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
    """Memory that must be released: a supervisor keeps only the timers of live keys.
    Found by the hostile review of the rebuilt supervisor (issue 13 follow-up), against
    real processes (finding 8)."""
    s, _rec = sup
    s.start("anchor", ["sleep", "60"], timeout=1800)
    for i in range(40):
        s.start(("t", i), ["sleep", "60"], timeout=3600)
        s.remove(("t", i), grace=0.2)
    assert len(s._timers) == 1  # white-box: the anchor's timeout only
    assert s._timers.entries <= 1 + 2 * _Timers._COMPACT_FROM


def test_a_removed_key_leaves_only_its_generation(sup: tuple[Supervisor, Recorder]) -> None:
    """Memory that must be released: a removed key keeps no machine, only its last
    generation number. Found by the hostile review of the rebuilt supervisor (issue 13
    follow-up), against real processes (finding 8)."""
    s, rec = sup
    n = 20 if SLOW else 6
    for i in range(n):
        s.start(i, ["sleep", "60"])
        s.remove(i, grace=0.2)
    assert s._machines == {}  # white-box: no machine is kept for a removed key
    assert all(s.generation(i) == 1 for i in range(n)) and s.keys() == []
    s.start(3, ["sleep", "60"])  # a later start is a newer generation, never a reused one
    assert s.generation(3) == 2
    s.remove(3, grace=0.2)
    rec.wait_for(lambda r: r.count("deleted", 3) == 2)
    assert [e.generation for e in rec.of(3) if e.kind == "created"] == [1, 2]


# --- the supervisor's own threads: nothing dies silently (issue 30, item 2) -----------------


def _timed_out(rec: Recorder, key: str) -> bool:
    return any(e.kind == "exited" and e.status == "timeout" for e in rec.of(key))


def test_a_timeout_or_delay_the_timer_cannot_hold_is_refused(
        sup: tuple[Supervisor, Recorder]) -> None:
    """``start(..., timeout=1e300)`` was accepted, and the timer thread died of an
    OverflowError in its wait: from then on no key's timeout fired and no restart
    delay ended (issue 30, item 2, found by the outside review). Every number of
    seconds the supervisor waits on is refused past ``MAX_SECONDS``, where it is
    given; a key's timeout still fires afterwards."""
    s, rec = sup
    for huge in (1e300, 2**70, proctable.supervise.MAX_SECONDS * 2):
        with pytest.raises(ValueError, match="timeout"):
            s.start("a", ["sleep", "60"], timeout=huge)
        with pytest.raises(ValueError, match="delay"):
            RestartPolicy(delay=huge)
        with pytest.raises(ValueError, match="grace"):
            Supervisor(grace=huge)
        with pytest.raises(ValueError, match="write_timeout"):
            Supervisor(write_timeout=huge)
        s.start("b", ["sleep", "60"])
        with pytest.raises(ValueError, match="grace"):
            s.stop("b", grace=huge)
        with pytest.raises(ValueError, match="timeout"):
            s.flush_events(timeout=huge)
    assert "a" not in s
    s.start("a", ["sleep", "60"], timeout=proctable.supervise.MAX_SECONDS)  # the largest
    s.start("t", ["sleep", "60"], timeout=0.5)
    rec.wait_for(lambda r: _timed_out(r, "t"), timeout=20)
    assert s.running("a") and s.health == ()


def test_a_wait_too_long_for_the_platform_does_not_kill_the_timers(
        sup: tuple[Supervisor, Recorder]) -> None:
    """A value that got past the checks and breaks the wait itself: the timer thread
    died of ``OverflowError: timestamp out of range for platform time_t`` at a
    1e300 s timer, silently (issue 30, item 2). Its waits are bounded now, so the
    thread lives, and the other keys' timeouts fire."""
    s, rec = sup
    s._timers.set("ghost", -1, 1e300)  # a timer no check let through
    s.start("t", ["sleep", "60"], timeout=0.5)
    rec.wait_for(lambda r: _timed_out(r, "t"), timeout=20)
    assert s.health == ()
    s._timers.cancel("ghost", -1)


def test_a_failure_of_the_timer_thread_surfaces_and_the_timers_go_on(
        monkeypatch: pytest.MonkeyPatch, sup: tuple[Supervisor, Recorder]) -> None:
    """Whatever fails inside the timer thread is listed in ``health`` and logged, and
    the thread goes on: a key's timeout set before the failure fires after it, a
    key started after it times out, and a crash loop's restart delays end (issue
    30, item 2). The failure is injected into the thread's own step (the only way
    to make it fail once the waits are bounded)."""
    s, rec = sup
    timers = s._timers
    real = timers._next_due
    failed = threading.Event()

    def fail_once() -> Any:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("injected into the timer thread")
        return real()

    s.start("before", ["sleep", "60"], timeout=1.5)
    monkeypatch.setattr(timers, "_next_due", fail_once)
    s.start("first", ["sleep", "60"], timeout=0.3)  # wakes the thread: it fails after
    rec.wait_for(lambda r: _timed_out(r, "first"), timeout=20)
    wait_until(failed.is_set, timeout=10)
    s.start("after", ["sleep", "60"], timeout=0.3)
    s.start("crash", ["sh", "-c", "exit 3"], restart=RestartPolicy(delay=0.2, max_restarts=2))
    rec.wait_for(lambda r: _timed_out(r, "before") and _timed_out(r, "after")
                 and r.count("gave_up", "crash") == 1, timeout=30)
    assert rec.count("restarting", "crash") == 2
    faults = s.health
    assert len(faults) == 1, faults
    assert faults[0].thread == "timers" and "injected" in str(faults[0].error)
    assert "injected" in str(faults[0])


def test_an_on_event_that_raises_system_exit_does_not_end_the_events(
        sup: tuple[Supervisor, Recorder]) -> None:
    """``sys.exit()`` in ``on_event`` ended the dispatch thread silently (a thread
    ignores SystemExit): no event came after it, and ``flush_events()`` said True
    for events never delivered (issue 30, item 2). Like any exception of the
    callback it is logged, and the next events come."""
    s, rec = sup

    def hook(ev: Event) -> None:
        if ev.kind == "created" and ev.key == "x":
            raise SystemExit(3)

    rec.hook = hook
    s.start("x", ["sleep", "60"])
    s.stop("x")
    assert s.flush_events()
    assert rec.kinds("x") == [("created", 1, None), ("exited", 1, "killed")]
    assert s.health == ()


def test_a_failure_of_the_dispatch_thread_surfaces_and_the_events_go_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure inside the dispatch thread (here injected where it turns a
    generation's output into events) is listed in ``health``, and the thread goes
    on: the key's exited and every later event come (issue 30, item 2)."""
    real = _dispatch.output_events
    failed = threading.Event()

    def fail_once(out: Any) -> Any:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("injected into the dispatch thread")
        return real(out)

    monkeypatch.setattr(_dispatch, "output_events", fail_once)
    rec = Recorder()
    with Supervisor(on_event=rec, grace=1.0) as s:
        s.start("o", ["sh", "-c", "echo hi; sleep 60"], output="events")
        wait_until(failed.is_set, timeout=20)
        s.stop("o")
        s.start("next", ["true"])
        rec.wait_for(lambda r: r.count("exited", "next") == 1 and r.count("exited", "o") == 1)
        faults = s.health
        assert [f.thread for f in faults] == ["events"], faults
        assert "injected" in str(faults[0].error)
    # The bytes of the failed turn were not lost: they came with the next one.
    assert b"".join(e.data or b"" for e in rec.of("o") if e.kind == "output") == b"hi\n"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failure_of_the_exit_watcher_surfaces_and_exits_are_still_seen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """When the exit watcher's thread failed, it cancelled every watch, and the
    supervisor took a cancelled watch for its own shutdown: no exit of any running
    key was seen again (and a later start's watch failed at once, as if it had
    exited). The fault is listed in ``health``, and a new watcher watches every key
    (issue 30, item 2). The failure is injected into the watcher thread's own step."""
    rec = Recorder()
    with Supervisor(on_event=rec, grace=1.0) as s:
        first = s.start("first", ["sleep", "60"])  # the watcher's thread runs
        watcher = s._watcher

        def boom(*_args: Any) -> None:
            raise RuntimeError("injected into the exit watcher")

        monkeypatch.setattr(watcher, "_forget", boom)
        s.start("dies", ["sh", "-c", "sleep 0.3; exit 4"])
        rec.wait_for(lambda r: r.count("exited", "dies") == 1)
        assert [e.exit.code for e in rec.of("dies") if e.kind == "exited"] == [4]  # type: ignore[union-attr]
        assert s._watcher is not watcher
        os.kill(first.pid, signal.SIGTERM)  # a key watched before the failure
        rec.wait_for(lambda r: r.count("exited", "first") == 1)
        assert rec.of("first")[-1].status == "signaled"
        s.start("later", ["sh", "-c", "sleep 0.2; exit 5"])
        rec.wait_for(lambda r: r.count("exited", "later") == 1)
        assert rec.of("later")[-1].exit.code == 5  # type: ignore[union-attr]
        faults = s.health
        assert [f.thread for f in faults] == ["watcher"], faults


@pytest.mark.parametrize("output", ["inherit", "events"])
@pytest.mark.parametrize("mode", MODES)
def test_close_waiting_out_the_grace_costs_no_cpu(mode: str, output: str,
                                                  tmp_path: Any) -> None:
    """close() of four keys that ignore SIGTERM waits out the grace of each: in
    cgroup mode those waits spun (issue 30, item 1, measured by a reviewer: 2.77 s
    of CPU in 2.02 s for four keys). Their CPU time is held against the wall time,
    with the output owned (drained at the teardown) and not."""
    sup = Supervisor(grace=0.6, kill_timeout=5.0, mode=mode)
    try:
        for k in "abcd":
            sup.start(k, ignore_term(str(tmp_path / k)), output=output)
        for k in "abcd":
            wait_until(lambda k=k: os.path.exists(tmp_path / k), timeout=30)
        cpu, t0 = cpu_seconds(), time.monotonic()
        sup.close()
        cpu, wall = cpu_seconds() - cpu, time.monotonic() - t0
    finally:
        sup.close()
    assert wall >= 0.6
    assert cpu < IDLE_SHARE * wall, f"{cpu:.2f} s of CPU in a {wall:.2f} s close()"
