"""A member whose main thread exited (pthread_exit in main) is a live member.

Such a process shows state Z with more than one thread and runs on. The first
round's lineage took it for gone: it escaped spawned lineages, and an attached
lineage reported "no members" while it ran. Here it must be recorded, listed,
signalled and waited for, in every mode and attached, with and without the proc
connector; and the table, the probe and the watcher must agree that it lives.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

import proctable
from proctable import Supervisor, _pidfd
from proctable.lineage import Ended

from ._lineage import MODES, Tracker, build_leader_exits, pids, read_line
from ._supervise import Recorder, marked_env, running_marked, tag_for
from .conftest import Procs, wait_until


@pytest.fixture(scope="module")
def leader_exits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_leader_exits(tmp_path_factory.mktemp("leader"))


@pytest.fixture(params=[True, False], ids=["events", "no-events"])
def connector(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if not request.param:
        monkeypatch.setenv(_pidfd.DISABLE_ENV, "proc_connector")
    return bool(request.param)


def _leader_exited(pid: int) -> proctable.Proc:
    row = proctable.read(pid)
    assert row is not None and row.state == "Z" and row.num_threads > 1, row
    return row


@pytest.mark.parametrize("how", [*MODES, "attach"])
def test_member_whose_main_thread_exited_is_live_and_torn_down(
        track: Tracker, procs: Procs, leader_exits: Path, how: str, connector: bool) -> None:
    if how == "attach":
        p = procs.popen([str(leader_exits)], stdout=subprocess.PIPE)
        pid = int(read_line(p.stdout))
        assert p.stdout is not None
        p.stdout.close()
        lin = track.attach(p)
    else:
        # The shell stays its parent: found by the walk even without events.
        lin = track.spawn(["sh", "-c", '"$0" & wait', str(leader_exits)], mode=how,
                          stdout=subprocess.PIPE)
        pid = int(read_line(lin.process.stdout))
        assert lin.process.stdout is not None
        lin.process.stdout.close()
    row = _leader_exited(pid)
    ident = proctable.identity(pid)
    assert ident is not None and ident.alive()  # the one predicate: it lives
    assert proctable.exit_probe(pid).state is proctable.ProbeState.LEADER_EXITED
    assert wait_until(lambda: pid in pids(lin), timeout=10)
    assert [p.state for p in lin.members() if p.pid == pid] == ["Z"]  # listed as it is
    report = lin.terminate(grace=3.0, kill_timeout=3.0)
    ends = [m for m in report.members if m.pid == pid]
    assert [m.ended for m in ends] == [Ended.TERM], report
    assert ends[0].identity.handle == ident.handle
    assert not ident.alive()
    assert not report.unresolved
    assert row.start_time == ends[0].proc.start_time


def test_watcher_waits_for_the_whole_thread_group(procs: Procs, leader_exits: Path) -> None:
    """The exit watcher resolves only when the last thread is gone, not at the
    main thread's pthread_exit."""
    p = procs.popen([str(leader_exits)], stdout=subprocess.PIPE)
    pid = int(read_line(p.stdout))
    assert p.stdout is not None
    p.stdout.close()
    _leader_exited(pid)
    with proctable.ExitWatcher() as w:
        fut = w.watch(p)
        assert not fut.done()
        _leader_exited(pid)
        assert not fut.done()  # resolved only by the whole group's end
        os.kill(pid, 15)
        status = fut.result(timeout=10)
    assert status.signal == 15


def test_identity_alive_follows_the_predicate(procs: Procs, leader_exits: Path) -> None:
    p = procs.popen([str(leader_exits)], stdout=subprocess.PIPE)
    pid = int(read_line(p.stdout))
    assert p.stdout is not None
    p.stdout.close()
    ident = proctable.identity(pid)
    assert ident is not None
    _leader_exited(pid)
    assert ident.alive() and proctable.Identity(ident.pid, ident.start_time).alive()
    p.kill()
    wait_until(lambda: not ident.alive(), timeout=10)
    row: Any = proctable.read(pid)
    assert row is not None and row.state == "Z" and row.num_threads == 1  # now ended
    assert p.wait(timeout=10) == -9


@pytest.mark.parametrize("mode", MODES)
def test_member_whose_main_thread_exited_and_ignores_sigterm_is_killed(
        track: Tracker, leader_exits: Path, mode: str) -> None:
    """cgroup.kill passes over a process whose main thread exited (kernel 6.18),
    while kill(2) ends it: the cgroup backend used to count on cgroup.kill alone
    after the grace, and its teardown failed. Every member gets its own SIGKILL."""
    lin = track.spawn(["sh", "-c", '"$0" ignore-term & wait', str(leader_exits)], mode=mode,
                      stdout=subprocess.PIPE)
    pid = int(read_line(lin.process.stdout))
    assert lin.process.stdout is not None
    lin.process.stdout.close()
    _leader_exited(pid)
    ident = proctable.identity(pid)
    assert ident is not None
    assert wait_until(lambda: pid in pids(lin), timeout=10)
    report = lin.terminate(grace=0.3, kill_timeout=5.0)
    ends = [m for m in report.members if m.pid == pid]
    assert [m.ended for m in ends] == [Ended.KILL], report
    assert ends[0].exit is None or ends[0].exit.signal == 9
    assert not ident.alive() and not report.unresolved


# -- a supervisor's key whose process's main thread exited -----------------------------


@pytest.mark.parametrize("mode", MODES)
def test_adopt_of_a_process_whose_main_thread_exited(
        mode: str, leader_exits: Path, procs: Procs) -> None:
    """A key adopted on a process whose main thread exited (state Z, its threads running
    on) is a live member, and stop() ends it. Found by the hostile review of the rebuilt
    supervisor (issue 13 follow-up), against real processes (finding 2)."""
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=0.1, kill_timeout=3.0, mode=mode)
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
    ignoring SIGTERM: stop() ends them all, or raises.

    Found by the hostile review of the rebuilt supervisor (issue 13 follow-up), against
    real processes (finding 2)."""
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=0.1, kill_timeout=3.0, mode=mode)
    tag = tag_for(request)
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
