"""The supervisor against real processes: generations, event order, restart policy."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Hashable, Iterator
from typing import Optional

import pytest

import proctable
from proctable import RestartPolicy, Supervisor
from proctable.supervise import Event

from .conftest import PY, wait_until


class Recorder:
    """Collects events; wait_for() blocks (bounded) until a predicate holds."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.cond = threading.Condition()
        self.hook: Optional[object] = None

    def __call__(self, ev: Event) -> None:
        with self.cond:
            self.events.append(ev)
            self.cond.notify_all()
        if callable(self.hook):
            self.hook(ev)

    def kinds(self, key: Hashable = None) -> list[tuple[str, int, Optional[str]]]:
        with self.cond:
            return [(e.kind, e.generation, e.status) for e in self.events
                    if key is None or e.key == key]

    def wait_for(self, pred: object, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred(self):  # type: ignore[operator]
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"events so far: {self.events}")
                self.cond.wait(left)

    def count(self, kind: str, key: Hashable = None) -> int:
        return sum(1 for k, _, _ in self.kinds(key) if k == kind)


@pytest.fixture
def sup() -> Iterator[tuple[Supervisor, Recorder]]:
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=1.0, kill_timeout=2.0)
    try:
        yield s, rec
    finally:
        s.close()


def ignore_term(marker: str) -> str:
    """A program that ignores SIGTERM, and says so by creating marker."""
    return ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"open({marker!r}, 'w').close(); time.sleep(60)")


def _pid_gone(pid: int) -> bool:
    row = proctable.read(pid)
    return row is None or row.state == "Z"


def test_start_stop_gives_created_then_exited_killed(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    ident = s.start("a", ["sleep", "60"])
    assert ident.alive()
    assert s.generation("a") == 1 and s.running("a")
    status = s.stop("a")
    assert not ident.alive()
    rec.wait_for(lambda r: r.count("exited", "a") == 1)
    assert rec.kinds("a") == [("created", 1, None), ("exited", 1, "killed")]
    assert status is not None and status.signal == signal.SIGTERM
    assert not s.running("a") and "a" in s  # stop keeps the key


def test_remove_running_that_ignores_sigterm(sup: tuple[Supervisor, Recorder],
                                             tmp_path: object) -> None:
    s, rec = sup
    marker = os.path.join(str(tmp_path), "ready")
    ident = s.start("sh", [PY, "-c", ignore_term(marker)])
    wait_until(lambda: os.path.exists(marker))
    t0 = time.monotonic()
    s.remove("sh", grace=0.5)
    assert time.monotonic() - t0 < 0.5 + 2.0 + 2.0
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
                                                  tmp_path: object) -> None:
    """The old process's exit arrives after the new one has exited and been removed."""
    s, rec = sup
    marker = os.path.join(str(tmp_path), "ready")
    old = s.start("k", [PY, "-c", ignore_term(marker)])
    wait_until(lambda: os.path.exists(marker))
    new = s.start("k", [PY, "-c", "import time; time.sleep(0.2)"])  # supersedes: old is killed
    assert old != new and s.generation("k") == 2
    rec.wait_for(lambda r: r.count("exited", "k") == 2)
    s.remove("k")
    rec.wait_for(lambda r: r.count("deleted", "k") == 1)
    time.sleep(0.3)  # room for any late event to (wrongly) show up
    assert rec.kinds("k") == [
        ("created", 1, None), ("exited", 1, "killed"),
        ("created", 2, None), ("exited", 2, "exited"), ("deleted", 2, None),
    ]
    # A later start is a newer generation, never a reused one.
    s.start("k", ["sleep", "60"])
    assert s.generation("k") == 3
    s.remove("k")


def test_synchronous_respawn_from_callback(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    done = threading.Event()

    def hook(ev: Event) -> None:
        if ev.kind == "exited" and ev.generation == 1:
            s.start("r", ["sleep", "60"])  # from inside the callback
            done.set()

    rec.hook = hook
    s.start("r", [PY, "-c", "pass"])
    assert done.wait(20)
    rec.wait_for(lambda r: r.count("created", "r") == 2)
    assert rec.kinds("r")[:3] == [("created", 1, None), ("exited", 1, "exited"),
                                  ("created", 2, None)]
    assert s.running("r")


def test_deliberate_exit_reruns_fresh(sup: tuple[Supervisor, Recorder], tmp_path: object) -> None:
    s, rec = sup
    calls: list[Hashable] = []
    log = os.path.join(str(tmp_path), "log")

    def prog(word: str) -> list[str]:
        return [PY, "-c", f"open({log!r}, 'a').write({word!r} + ' '); import time; "
                "time.sleep(2.5)"]

    def fresh(key: Hashable) -> Optional[list[str]]:
        calls.append(key)
        return None if len(calls) >= 2 else prog("fresh")

    s.start("f", prog("original"), restart=RestartPolicy(fresh=fresh))
    rec.wait_for(lambda r: r.count("gave_up", "f") == 1, timeout=30)
    kinds = [k for k, _, _ in rec.kinds("f")]
    assert kinds == ["created", "exited", "restarting", "created", "exited", "gave_up"]
    restarting = next(e for e in rec.events if e.kind == "restarting")
    assert restarting.reason is not None and "fresh" in restarting.reason
    gave_up = next(e for e in rec.events if e.kind == "gave_up")
    assert gave_up.reason == "the fresh factory said stop"
    assert calls == ["f", "f"]
    with open(log) as f:
        assert f.read().split() == ["original", "fresh"]  # the rerun took the fresh args


def test_a_bad_fresh_answer_gives_up_loudly(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    s.start("b", [PY, "-c", "pass"], restart=RestartPolicy(fresh=lambda key: "not a list"))
    rec.wait_for(lambda r: r.count("gave_up", "b") == 1, timeout=30)
    gave_up = next(e for e in rec.events if e.kind == "gave_up")
    assert gave_up.reason is not None and "fresh factory failed" in gave_up.reason
    assert rec.count("created", "b") == 1


def test_late_exit_of_a_removed_generation_is_dropped(
        sup: tuple[Supervisor, Recorder], caplog: pytest.LogCaptureFixture) -> None:
    """Field bug 1, at the point where it bit: the old process's exit notification
    arrives after its successor has exited and been removed. It must reach no one."""
    import logging

    s, rec = sup
    s.start("k", ["sleep", "60"])
    old_slot = s._slots["k"]  # white-box: the slot the old exit is wired to
    s.start("k", [PY, "-c", "pass"])  # supersedes generation 1 (exited killed)
    rec.wait_for(lambda r: r.count("exited", "k") == 2)
    s.remove("k")
    rec.wait_for(lambda r: r.count("deleted", "k") == 1)
    before = rec.kinds("k")
    with caplog.at_level(logging.DEBUG, logger="proctable.supervise"):
        s._work.put(("exit", old_slot, old_slot.future))  # the late notification
        s.start("k", ["sleep", "60"])  # a third generation, current now
        deadline = time.monotonic() + 5
        while "late exit" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "late exit of 'k' generation 1" in caplog.text
    rec.wait_for(lambda r: r.count("created", "k") == 3)
    assert rec.kinds("k") == [*before, ("created", 3, None)]  # nothing else, no exited
    assert s.running("k") and s.generation("k") == 3


def test_adopt_carries_the_policy_and_factory(sup: tuple[Supervisor, Recorder]) -> None:
    import subprocess

    s, rec = sup
    p = subprocess.Popen([PY, "-c", "import time; time.sleep(0.5)"])
    try:
        ident = proctable.identity(p.pid)
        assert ident is not None
        s.adopt("a", ident, restart=RestartPolicy(fresh=lambda key: ["sleep", "60"]))
        rec.wait_for(lambda r: r.count("created", "a") == 2, timeout=30)
        assert [k for k, _, _ in rec.kinds("a")] == ["created", "exited", "restarting", "created"]
        assert s.generation("a") == 2 and s.running("a")
    finally:
        p.wait(timeout=10)


def test_crash_recovers_with_original_args_then_gives_up(
        sup: tuple[Supervisor, Recorder], tmp_path: object) -> None:
    s, rec = sup
    marker = os.path.join(str(tmp_path), "runs")
    code = f"open({marker!r}, 'a').write('x'); import sys; sys.exit(3)"
    s.start("c", [PY, "-c", code], restart=RestartPolicy(max_restarts=2))
    rec.wait_for(lambda r: r.count("gave_up", "c") == 1, timeout=30)
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
    s.start("q", [PY, "-c", "pass"], restart=RestartPolicy(max_fast_exits=3, fast_exit=5.0))
    rec.wait_for(lambda r: r.count("gave_up", "q") == 1, timeout=30)
    assert rec.count("created", "q") == 3
    time.sleep(0.3)
    assert rec.count("created", "q") == 3  # nothing starts after gave_up


def test_adopt_then_remove(sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    import subprocess

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
                                         tmp_path: object) -> None:
    s, _rec = sup
    pidfile = os.path.join(str(tmp_path), "pid")
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
    wait_until(lambda: _pid_gone(pid), timeout=5)


def test_bad_input(sup: tuple[Supervisor, Recorder]) -> None:
    s, _ = sup
    with pytest.raises(TypeError):
        s.start("b", "sleep 5")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        s.start("b", [])
    with pytest.raises(TypeError):
        s.start("b", ["sleep", "1"], restart="always")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        s.start("b", ["sleep", "1"], timeout=0)
    with pytest.raises(KeyError):
        s.stop("nope")
    with pytest.raises(TypeError):
        s.adopt("b", 1234)  # type: ignore[arg-type]


def test_closed_supervisor_refuses_and_close_stops_all() -> None:
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=0.5, kill_timeout=2.0)
    a = s.start("a", ["sleep", "60"])
    b = s.start("b", ["sleep", "60"])
    s.close()
    assert not a.alive() and not b.alive()
    assert rec.count("exited") == 2
    with pytest.raises(proctable.ProctableError):
        s.start("c", ["sleep", "1"])
    s.close()  # twice is fine
