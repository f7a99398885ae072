"""Durable sessions: Supervisor(state_dir=...) keeps each session under its native
helper when the supervisor ends in any way, and a new supervisor re-adopts it.

Real processes throughout: a supervisor in a child process is SIGKILLed, helpers
are SIGKILLed while no supervisor is there, and what runs is checked by looking at
the table (by pid and start time, and by the sessions' environment markers), never
by asking the code under test.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import proctable
from proctable import RestartPolicy, StateDirError, Supervisor

from ._durable import (
    ChildSupervisor,
    Stitch,
    helpers_of,
    kill_pinned,
    marked,
    qualified,
    session_names,
)
from ._supervise import Recorder
from .conftest import wait_until


def _records(state: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for f in (state / "keys").iterdir():
        if f.suffix == ".json":
            rec = json.loads(f.read_bytes())
            out[rec["key"]] = rec
    return out


def _alive(ident: proctable.Identity) -> bool:
    row = proctable.read(ident.pid)
    return row is not None and row.start_time == ident.start_time and row.state not in "ZX"


def _numbers(data: bytes) -> list[int]:
    return [int(x) for x in data.decode().split("\n") if x.strip()]


COUNTER = "i=0; while :; do echo $i; i=$((i+1)); sleep 0.01; done"


def exits_once(flag: Path, code: int) -> list[str]:
    """A command that exits with code once flag exists (not before: a supervisor that
    must not see it end is killed first, however slow the machine)."""
    return ["sh", "-c", f"while [ ! -e '{flag}' ]; do sleep 0.02; done; exit {code}"]


WAIT = 60.0  # the bound of each wait here: room for a loaded machine, never a timing claim


# -- the life of a session -----------------------------------------------------------


def test_detach_leaves_every_session_running_and_a_new_supervisor_adopts_it(
        state: Path) -> None:
    """detach() returns at once and leaves the pty shell (with its nohup and setsid
    jobs) and the pipe running; the next supervisor adopts both with their
    generations, writes and resizes the terminal again, replays by offset, and its
    close() proves every member gone."""
    rec = Recorder()
    sup = Supervisor(on_event=rec, state_dir=str(state))
    shell = sup.start("shell", ["sh"], pty=(24, 80), env={**os.environ, "PS1": "$ "})
    sup.write("shell", b"nohup sleep 300 >/dev/null 2>&1 & setsid sleep 301 & echo J$((1+1))\n")
    rec.wait_for(lambda r: b"J2" in b"".join(e.data or b"" for e in r.of("shell")))
    sup.start("pipe", ["sh", "-c", COUNTER], output="events")
    rec.wait_for(lambda r: r.count("output", "pipe") >= 3)
    members = {p.pid: p.start_time for p in sup.lineage("shell").members()}
    assert len(members) == 3  # the shell and its two jobs
    t0 = time.monotonic()
    sup.detach()
    assert time.monotonic() - t0 < 2.0
    with pytest.raises(proctable.SupervisorClosed):
        sup.start("other", ["true"])
    assert all(_alive(proctable.Identity(p, s)) for p, s in members.items())
    seen_before = Stitch()
    for e in rec.of("pipe"):
        if e.kind == "output":
            seen_before.add(e.offset, e.data, e.dropped)
    time.sleep(0.3)  # the pipe writes on while nobody is there

    rec2 = Recorder()
    # (an interactive shell ignores SIGTERM: its close() waits out the grace)
    sup2 = Supervisor(on_event=rec2, state_dir=str(state), grace=0.3)
    try:
        assert sorted(sup2.keys()) == ["pipe", "shell"]
        kinds = rec2.kinds("shell")
        assert kinds[0] == ("adopted", 1, None)
        assert rec2.of("shell")[0].identity == shell
        assert sup2.generation("shell") == 1
        sup2.resize("shell", 40, 120)
        sup2.write("shell", b"echo size $(stty size)\n")
        rec2.wait_for(lambda r: b"size 40 120" in b"".join(
            e.data or b"" for e in r.of("shell")))
        # Output since the last acknowledged byte, then on: nothing missing, none twice.
        def stitched(r: Recorder) -> Stitch:
            after = Stitch()
            after.data += seen_before.data
            for e in r.of("pipe"):
                if e.kind == "output":
                    after.add(e.offset, e.data, e.dropped)
            return after

        def whole_lines(after: Stitch) -> list[int]:
            return _numbers(bytes(after.data[:after.data.rfind(b"\n") + 1]))

        # Until more than 10 lines are there (a loaded machine wrote only 5 by the
        # time two output events had come, and the count was taken for a loss).
        rec2.wait_for(lambda r: r.count("output", "pipe") >= 2
                      and len(whole_lines(stitched(r))) > 10)
        after = stitched(rec2)
        nums = whole_lines(after)
        assert nums == list(range(len(nums))) and len(nums) > 10
        assert after.dropped == 0
        replay = sup2.tail("pipe", since=0)
        assert replay.offset == 0 and replay.dropped == 0
        assert bytes(replay.data).startswith(bytes(seen_before.data))
        members2 = {p.pid: p.start_time for p in sup2.lineage("shell").members()}
        assert members2 == members
    finally:
        sup2.close()
    assert not [p for p, s in members.items() if _alive(proctable.Identity(p, s))]
    assert not marked(session_names(state))
    kinds = rec2.kinds("shell")
    assert ("exited", 1, "killed") in kinds
    recs = _records(state)
    assert recs["shell"]["session"] is None and recs["shell"]["generation"] == 1
    assert not list((state / "sessions").iterdir())


def test_a_start_after_adoption_is_the_next_generation(state: Path) -> None:
    with Supervisor(state_dir=str(state)) as sup:
        sup.start("k", ["sleep", "60"])
        sup.start("k", ["sleep", "60"])  # generation 2
        sup.detach()
    rec = Recorder()
    with Supervisor(on_event=rec, state_dir=str(state)) as sup2:
        assert sup2.generation("k") == 2
        sup2.start("k", ["sleep", "60"])
        assert sup2.generation("k") == 3
    assert rec.kinds("k")[:3] == [("adopted", 2, None), ("exited", 2, "killed"),
                                   ("created", 3, None)]


def test_the_supervisor_killed_leaves_its_sessions_to_the_next_one(
        state: Path, tmp_path: Path) -> None:
    """A durable supervisor SIGKILLed (in a child process): every session runs on;
    one that exits with code 7 meanwhile is reported exactly, with the restart
    policy's decision after it; one whose helper is killed meanwhile ends with
    nothing left and is reported once; numbered lines are all there, once."""
    plan = {"starts": [
        {"key": "count", "args": ["sh", "-c", COUNTER], "kw": {"output": "events"}},
        {"key": "seven", "args": exits_once(tmp_path / "go", 7)},
        {"key": "crashy", "args": exits_once(tmp_path / "go", 3),
         "kw": {"restart": {"max_restarts": 1}}},
        {"key": "victim", "args": ["sh", "-c", "setsid sleep 305 & exec sleep 304"]},
    ]}
    child = ChildSupervisor(state, plan, tmp_path / "events.log")
    wait_until(lambda: sum(1 for e in child.events() if e["key"] == "count"
                           and e["kind"] == "output") >= 3, timeout=WAIT)
    child.kill()
    before = child.events()
    victim = _records(state)["victim"]["session"]
    victim_names = qualified(state, {victim["name"]})
    wait_until(lambda: len(marked(victim_names)) == 2, timeout=WAIT)
    os.kill(victim["keeper"][0], signal.SIGKILL)  # (the child is gone: nobody reaps it but
    wait_until(lambda: not marked(victim_names), timeout=WAIT)  # its guard, which ends the rest)
    # "seven" and "crashy" exit while no supervisor is there. (They slept 0.6 s from
    # their start: a loaded machine took longer to get here, and the killed
    # supervisor saw them end.)
    (tmp_path / "go").touch()
    time.sleep(0.8)

    rec = Recorder()
    sup = Supervisor(on_event=rec, state_dir=str(state))
    try:
        rec.wait_for(lambda r: r.count("exited", "seven") == 1
                     and r.count("created", "crashy") == 1)
        seven = next(e for e in rec.of("seven") if e.kind == "exited")
        assert rec.kinds("seven")[0] == ("adopted", 1, None)
        assert seven.status == "exited" and seven.exit is not None and seven.exit.code == 7
        assert [k for k, _, _ in rec.kinds("crashy")][:4] == [
            "adopted", "exited", "restarting", "created"]
        assert rec.kinds("victim") == [("exited", 1, "killed"), ("deleted", 1, None)]
        assert "helper was killed" in (rec.of("victim")[0].reason or "")
        assert "victim" not in sup.keys()  # noqa: SIM118 - a method, not a dict
        stitched = Stitch()
        last = 0
        for e in before:
            if e["key"] == "count" and e["kind"] == "output":
                stitched.add(e["offset"], e["data"], e["dropped"])
                last = stitched.end
        # As docs/supervisor.md tells an app that stores its last offset: what came
        # after it, from the ring, then the events (their overlap trimmed by offset).
        # The new supervisor's output starts after the last byte the killed one
        # delivered, which is not always the last one it wrote down: the kill can
        # cut the line on_event was writing (under 4 CPU burners a line went
        # missing once, when the replay was read but not put in).
        replay = sup.tail("count", since=last)
        assert replay.dropped == 0
        stitched.add(replay.offset, replay.data)
        rec.wait_for(lambda r: r.count("output", "count") >= 2)
        for e in rec.of("count"):
            if e.kind == "output":
                stitched.add(e.offset, e.data, e.dropped)
        text = bytes(stitched.data)
        nums = _numbers(text[:text.rfind(b"\n") + 1])
        assert nums == list(range(len(nums))) and stitched.dropped == 0
        assert text.find(bytes(replay.data[:200])) == last  # the replay is what came after
    finally:
        sup.close()
    assert not marked(session_names(state))


def test_on_adopt_stop_tears_every_surviving_session_down(state: Path) -> None:
    """on_adopt="stop": a restarted run must not leave the previous run's jobs behind
    (the escaped-jobs seed): each is adopted, killed with proof, deleted."""
    sup = Supervisor(state_dir=str(state))
    sup.start("a", ["sh", "-c", "setsid sleep 310 & nohup sleep 311 >/dev/null 2>&1 & "
                    "exec sleep 312"])
    sup.start("b", ["sleep", "313"])
    names = session_names(state)
    wait_until(lambda: len(marked(names)) == 4, timeout=WAIT)
    sup.detach()
    rec = Recorder()
    sup2 = Supervisor(on_event=rec, state_dir=str(state), on_adopt="stop")
    try:
        assert not marked(names)  # before the constructor returned
        for key in ("a", "b"):
            assert rec.kinds(key) == [("adopted", 1, None), ("exited", 1, "killed"),
                                      ("deleted", 1, None)]
        assert sup2.keys() == []
    finally:
        sup2.close()


def test_a_session_without_a_supervisor_past_its_orphan_timeout_is_ended_by_its_helper(
        state: Path) -> None:
    sup = Supervisor(state_dir=str(state), orphan_timeout=0.3)
    sup.start("job", ["sh", "-c", "setsid sleep 320 & trap '' TERM; sleep 321"])
    names = session_names(state)
    wait_until(lambda: len(marked(names)) == 3, timeout=WAIT)
    sup.detach()
    wait_until(lambda: not marked(names), timeout=15)  # TERM ignored: SIGKILL after grace
    rec = Recorder()
    with Supervisor(on_event=rec, state_dir=str(state)) as sup2:
        assert rec.kinds("job") == [("exited", 1, "killed"), ("deleted", 1, None)]
        assert "orphan_timeout" in (rec.of("job")[0].reason or "")
        assert sup2.keys() == []


def test_a_natural_exit_meanwhile_with_escapes_is_torn_down_before_its_exited(
        state: Path) -> None:
    """The command exits while no supervisor is there and leaves a setsid job: the
    next supervisor reports its exit and tears the job down before that exited."""
    sup = Supervisor(state_dir=str(state))
    sup.start("leaver", ["sh", "-c", "setsid sleep 330 & sleep 0.3; exit 0"])
    names = session_names(state)
    command = proctable.Identity(*_records(state)["leaver"]["session"]["command"][:2])
    sup.detach()
    wait_until(lambda: not _alive(command), timeout=WAIT)
    assert len(marked(names)) == 1  # the job outlived its command
    seen: list[tuple[str, int]] = []

    def on_event(ev: Any) -> None:
        seen.append((ev.kind, len(marked(names))))

    with Supervisor(on_event=on_event, state_dir=str(state)):
        wait_until(lambda: len(seen) >= 2, timeout=WAIT)
    # (delivered after its teardown: at the exited, the job is gone)
    assert [k for k, _ in seen[:2]] == ["adopted", "exited"] and seen[1] == ("exited", 0)


# -- the state directory --------------------------------------------------------------


def test_one_supervisor_at_a_time_holds_a_state_directory(state: Path) -> None:
    with Supervisor(state_dir=str(state)), \
            pytest.raises(StateDirError, match="held by another supervisor"):
        Supervisor(state_dir=str(state))
    with Supervisor(state_dir=str(state)):  # released by close()
        pass


def test_two_supervisors_started_at_once_on_one_directory(state: Path) -> None:
    results: list[object] = []
    go = threading.Barrier(4)

    def one() -> None:
        go.wait()
        try:
            results.append(Supervisor(state_dir=str(state)))
        except StateDirError as exc:
            results.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    sups = [r for r in results if isinstance(r, Supervisor)]
    assert len(sups) == 1 and len(results) == 4
    sups[0].close()


@pytest.mark.parametrize("how", ["mode", "symlink", "not_a_dir", "world_writable"])
def test_a_state_directory_that_is_not_the_users_alone_is_refused(
        tmp_path: Path, how: str) -> None:
    path = tmp_path / "s"
    if how == "mode":
        os.mkdir(path, 0o750)
        os.chmod(path, 0o750)
        match = "mode 0750"
    elif how == "world_writable":
        os.mkdir(path)
        os.chmod(path, 0o777)
        match = "mode 0777"
    elif how == "symlink":
        real = tmp_path / "real"
        os.mkdir(real, 0o700)
        os.symlink(real, path)
        match = "symbolic link"
    else:
        path.write_text("x")
        match = "not a directory"
    with pytest.raises(StateDirError, match=match):
        Supervisor(state_dir=str(path))


def test_a_state_directory_of_another_uid_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory of another uid")
    path = tmp_path / "s"
    os.mkdir(path, 0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(StateDirError, match="belongs to uid 65534"):
        Supervisor(state_dir=str(path))


def test_a_missing_state_directory_is_made_0700(tmp_path: Path) -> None:
    path = tmp_path / "new"
    with Supervisor(state_dir=str(path)):
        assert (path.stat().st_mode & 0o777) == 0o700


def test_keys_of_a_durable_supervisor_are_strings(state: Path) -> None:
    with Supervisor(state_dir=str(state)) as sup:
        with pytest.raises(TypeError, match="strings"):
            sup.start(1, ["true"])
        with pytest.raises(ValueError, match="empty"):
            sup.start("", ["true"])
        with pytest.raises(ValueError, match="cannot be recorded"):
            sup.start("k", ["true"], preexec_fn=lambda: None)
        with pytest.raises(proctable.ProctableError, match="cannot be durable"):
            sup.adopt("k", proctable.identity(os.getpid()))


def test_a_durable_supervisor_refuses_scan_mode_and_strays(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="scan"):
        Supervisor(state_dir=str(tmp_path / "s"), mode="scan")
    with pytest.raises(ValueError, match="state_dir"):
        Supervisor(on_adopt="stop")
    with pytest.raises(ValueError, match="on_adopt"):
        Supervisor(state_dir=str(tmp_path / "s"), on_adopt="maybe")
    with pytest.raises(ValueError, match="ring_size"):
        Supervisor(state_dir=str(tmp_path / "s"), ring_size=10)
    with pytest.raises(proctable.ProctableError, match="detach"):
        Supervisor().detach()


# -- records that do not check out ----------------------------------------------------


def test_a_corrupted_record_is_set_aside_and_the_others_are_adopted(state: Path) -> None:
    sup = Supervisor(state_dir=str(state))
    sup.start("good", ["sleep", "60"])
    sup.detach()
    (state / "keys" / "garbage.json").write_bytes(b"{not json")
    good = next((state / "keys").glob("*.json"))
    truncated = state / "keys" / ("0" * 24 + ".json")
    truncated.write_bytes(good.read_bytes()[:40])
    with Supervisor(state_dir=str(state)) as sup2:
        assert sup2.keys() == ["good"]
        assert len(sup2.adoption_problems) == 2
    assert (state / "keys" / "garbage.json.bad").exists()


def test_a_record_naming_another_users_process_never_signals_it(
        state: Path, tmp_path: Path) -> None:
    """A forged record whose keeper and command are a process of another uid: not
    adopted (no keeper answers as that process), never signalled, reported once."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process of another uid")
    import subprocess

    other = subprocess.Popen(["sleep", "60"], user=65534, group=65534)
    try:
        row = proctable.read(other.pid)
        assert row is not None
        ident = [other.pid, row.start_time, None]
        from proctable.supervise._durable import key_hash

        os.mkdir(state / "keys", 0o700)
        rec = {"v": 1, "key": "forged", "generation": 4, "session": {
            "name": "forged-4", "generation": 4, "args": ["sleep", "60"],
            "keeper": ident, "session": ident, "command": ident, "cgroup": None}}
        (state / "keys" / (key_hash("forged") + ".json")).write_text(json.dumps(rec))
        events = Recorder()
        with Supervisor(on_event=events, state_dir=str(state)) as sup:
            assert sup.keys() == []
        assert events.kinds("forged") == [("exited", 4, "killed"), ("deleted", 4, None)]
        assert other.poll() is None  # never signalled
    finally:
        other.kill()
        other.wait()


def test_a_record_whose_pids_were_reused_never_signals_their_new_owners() -> None:
    """In a private pid namespace, the session's helpers and command are killed, and
    their pids are then taken by unrelated processes (ns_last_pid): the record's
    pids are alive but name other processes; the next supervisor adopts nothing,
    signals nothing, and reports the session once."""
    from .conftest import run_in_pid_namespace

    code = r"""
import json, os, signal, subprocess, sys, tempfile, time
import proctable
from proctable import Supervisor
state = tempfile.mkdtemp()
sup = Supervisor(state_dir=state, mode="subreaper")
sup.start("k", ["sleep", "60"])
rec = json.load(open(os.path.join(state, "keys", os.listdir(os.path.join(state, "keys"))[0])))
s = rec["session"]
pids = [s["keeper"][0], s["session"][0], s["command"][0]]
sup.detach()
for p in (s["session"][0], s["keeper"][0], s["command"][0]):
    try:
        os.kill(p, signal.SIGKILL)
    except ProcessLookupError:
        pass
time.sleep(0.5)
while True:  # we are pid 1 here: the orphans are ours to reap (their pids are held till then)
    try:
        if os.waitpid(-1, os.WNOHANG)[0] == 0:
            break
    except ChildProcessError:
        break
for f in os.listdir(os.path.join(state, "sessions")):
    os.unlink(os.path.join(state, "sessions", f))  # as if its guard never wrote
squatters = []
for p in sorted(pids):
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(p - 1))
    q = subprocess.Popen(["sleep", "60"])
    squatters.append((p, q))
assert [q.pid for _, q in squatters] == sorted(pids), ([q.pid for _, q in squatters], pids)
events = []
with Supervisor(on_event=events.append, state_dir=state) as sup2:
    assert sup2.keys() == []
assert [(e.kind, e.status) for e in events] == [("exited", "killed"), ("deleted", None)], events
assert all(q.poll() is None for _, q in squatters), "a squatter was signalled"
for _, q in squatters:
    q.kill(); q.wait()
print("ok")
"""
    if os.geteuid() != 0:
        pytest.skip("needs root to write ns_last_pid")
    r = run_in_pid_namespace(code)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_the_disk_full_while_writing_a_record_starts_nothing(tmp_path: Path) -> None:
    """A state directory on a full file system: start() raises a clear error before
    anything runs (the record comes first). A tmpfs of 64 KiB in a private mount
    namespace, filled."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    code = r"""
import os, subprocess, sys
import proctable
from proctable import Supervisor
from proctable import StateDirError
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
os.makedirs("/tmp/full", exist_ok=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", "/tmp/full"], check=True)
state = "/tmp/full/state"
sup = Supervisor(state_dir=state)
fd = os.open("/tmp/full/filler", os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"x" * 4096)
except OSError:
    pass
os.close(fd)
try:
    sup.start("k", ["sleep", "77"])
except StateDirError as exc:
    assert "No space left" in str(exc), exc
else:
    raise AssertionError("start() on a full disk did not fail")
assert not [p for p in proctable.snapshot() if p.name == "sleep"], "something runs"
assert sup.keys() == []
sup.close()
print("ok")
"""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1)")
    import subprocess
    import sys

    r = subprocess.run(["unshare", "-m", "-p", "-f", "--mount-proc", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=120, check=False)
    if r.returncode != 0 and "Operation not permitted" in r.stderr:
        pytest.skip("no private mount namespace here")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_a_ghost_in_one_state_directory_ends_nothing_of_another_directorys_sessions(
        state: Path, tmp_path: Path) -> None:
    """Two apps, two state directories, the same key: the session of one whose
    helpers were killed is ended by its marker, and the other app's session of the
    same key and generation (the same session name) runs on: markers carry the
    directory's own id."""
    other = tmp_path / "other"
    os.mkdir(other, 0o700)
    a = Supervisor(state_dir=str(state))
    a.start("shell", ["sleep", "340"])
    b = Supervisor(state_dir=str(other))
    try:
        b_ident = b.start("shell", ["sleep", "341"])
        a.detach()
        rec = _records(state)["shell"]["session"]
        assert qualified(other, {rec["name"]}) <= session_names(other)  # the same name
        os.kill(rec["session"][0], signal.SIGKILL)  # both helpers: nothing ends the
        os.kill(rec["keeper"][0], signal.SIGKILL)   # command but the next supervisor
        wait_until(lambda: not _alive(proctable.Identity(*rec["keeper"][:2])), timeout=WAIT)
        events = Recorder()
        with Supervisor(on_event=events, state_dir=str(state)):
            assert events.kinds("shell") == [("exited", 1, "killed"), ("deleted", 1, None)]
        assert not _alive(proctable.Identity(*rec["command"][:2]))
        assert _alive(b_ident)
    finally:
        b.close()


def test_a_supervisor_killed_during_readoption_leaves_the_sessions_to_the_next(
        state: Path, tmp_path: Path) -> None:
    plan = {"starts": [{"key": f"k{i}", "args": ["sleep", "60"]} for i in range(6)]}
    first = ChildSupervisor(state, plan, tmp_path / "a.log")
    first.kill()
    names = session_names(state)
    assert len(marked(names)) == 6
    second = ChildSupervisor(state, {"starts": []}, tmp_path / "b.log")
    second.kill()  # (killed right after its constructor: re-adopted, then gone)
    rec = Recorder()
    with Supervisor(on_event=rec, state_dir=str(state)) as sup:
        assert sorted(sup.keys()) == [f"k{i}" for i in range(6)]
        assert all(rec.kinds(f"k{i}")[0] == ("adopted", 1, None) for i in range(6))
    assert not marked(names)


def test_policy_for_readopted_keys(state: Path) -> None:
    """restart_for gives a re-adopted key its fresh factory back (code is not
    recorded): a clean exit reruns with fresh args."""
    sup = Supervisor(state_dir=str(state))
    sup.start("agent", ["sh", "-c", "sleep 0.4"],
              restart=RestartPolicy(fresh=lambda k: ["sleep", "60"]))
    sup.detach()
    asked: list[Any] = []

    def restart_for(key: str, recorded: Any) -> RestartPolicy:
        asked.append((key, recorded))
        return RestartPolicy(fresh=lambda k: ["sh", "-c", "echo fresh; sleep 60"],
                             max_restarts=recorded.max_restarts)

    rec = Recorder()
    with Supervisor(on_event=rec, state_dir=str(state), restart_for=restart_for) as sup2:
        rec.wait_for(lambda r: r.count("created", "agent") == 1)
        lin = sup2.lineage("agent")
        assert lin is not None
        wait_until(lambda: any(p.name == "sh" for p in lin.members()), timeout=WAIT)
    assert asked and asked[0][0] == "agent" and asked[0][1].max_restarts == 50
    assert [k for k, _, _ in rec.kinds("agent")][:4] == ["adopted", "exited", "restarting",
                                                         "created"]


def test_fifty_sessions_outlive_a_killed_supervisor_and_every_line_comes_once(
        state: Path, tmp_path: Path) -> None:
    """The whole promise at once (issue 29's acceptance): a durable supervisor in a
    child process holds 50 sessions (24 pty shells with nohup and setsid jobs, 24
    pipes writing numbered lines the whole time, one that exits with code 7 while
    no supervisor is there, one whose helper is killed then) and is SIGKILLed. A
    new supervisor adopts every live session with its generation; every numbered
    line is there exactly once across the events before the kill, tail(since=)
    and the events after, stitched by offset; the exit 7 is exact; the killed
    helper's session ended with nothing left; close() proves every member gone."""
    shells = [f"shell{i}" for i in range(24)]
    pipes = [f"pipe{i}" for i in range(24)]
    starts: list[dict[str, Any]] = [
        {"key": k, "args": ["sh"], "kw": {"pty": [24, 80], "env": {**os.environ, "PS1": "$ "}}}
        for k in shells]
    starts += [{"key": k, "args": ["sh", "-c", COUNTER], "kw": {"output": "events"}}
               for k in pipes]
    starts += [{"key": "seven", "args": exits_once(tmp_path / "go", 7)},
               {"key": "victim", "args": ["sh", "-c", "setsid sleep 361 & exec sleep 360"]}]
    writes = [{"key": k, "data": "nohup sleep 350 >/dev/null 2>&1 & setsid sleep 351 & "
               "echo re$((1+1))dy\n"} for k in shells]
    child = ChildSupervisor(state, {"starts": starts, "writes": writes},
                            tmp_path / "events.log")

    def ready() -> bool:
        evs = child.events()
        shown = {e["key"] for e in evs if e["kind"] == "output" and b"re2dy" in e["data"]}
        flowing = {e["key"] for e in evs if e["kind"] == "output" and e["key"] in pipes}
        return shown >= set(shells) and flowing >= set(pipes)

    wait_until(ready, timeout=60)
    child.kill()
    before = child.events()
    recs = _records(state)
    victim = recs["victim"]["session"]
    os.kill(victim["keeper"][0], signal.SIGKILL)
    wait_until(lambda: not marked(qualified(state, {victim["name"]})), timeout=WAIT)
    # "seven" exits meanwhile (it slept 1.5 s from its start: under load the 50 starts
    # took longer, the killed supervisor saw it end, and the next had no "seven" to
    # adopt); the pipes write on.
    (tmp_path / "go").touch()
    seven = proctable.Identity(*recs["seven"]["session"]["command"][:2])
    wait_until(lambda: not _alive(seven), timeout=WAIT)
    time.sleep(0.3)  # (and the pipes write on while no supervisor is there)
    live = marked(session_names(state))
    jobs = {k: {p for p, _s, n in live if n == recs[k]["session"]["name"]} for k in shells}
    assert all(len(v) == 3 for v in jobs.values()), jobs  # the shell, its two jobs

    rec = Recorder()
    t0 = time.monotonic()
    # (interactive shells ignore SIGTERM: its close() waits out the grace)
    sup = Supervisor(on_event=rec, state_dir=str(state), grace=0.3)
    adopt_seconds = time.monotonic() - t0
    try:
        assert sorted(sup.keys()) == sorted([*shells, *pipes, "seven"]), sup.adoption_problems
        for k in [*shells, *pipes, "seven"]:
            assert rec.kinds(k)[0] == ("adopted", 1, None)
        assert rec.kinds("victim") == [("exited", 1, "killed"), ("deleted", 1, None)]
        rec.wait_for(lambda r: r.count("exited", "seven") == 1)
        seven = next(e for e in rec.of("seven") if e.kind == "exited")
        assert seven.status == "exited" and seven.exit is not None and seven.exit.raw == 7 << 8
        for k in shells:
            sup.write(k, b"echo al$((1+1))ve\n")
        rec.wait_for(lambda r: all(b"al2ve" in b"".join(e.data or b"" for e in r.of(k))
                                   for k in shells))
        for k in shells:
            lin = sup.lineage(k)
            assert lin is not None and {p.pid for p in lin.members()} == jobs[k]
        for k in pipes:  # each numbered line once: the events before, the replay, after
            stitched = Stitch()
            for e in before:
                if e["key"] == k and e["kind"] == "output":
                    stitched.add(e["offset"], e["data"], e["dropped"])
            replay = sup.tail(k, since=stitched.end)
            assert replay.dropped == 0
            stitched.add(replay.offset, replay.data)
            end = replay.end
            rec.wait_for(lambda r, k=k, end=end: any(
                e.kind == "output" and e.offset is not None
                and e.offset + len(e.data or b"") > end for e in r.of(k)))
            for e in rec.of(k):
                if e.kind == "output":
                    stitched.add(e.offset, e.data, e.dropped)
            text = bytes(stitched.data)
            nums = _numbers(text[:text.rfind(b"\n") + 1])
            assert nums == list(range(len(nums))), k
            assert stitched.dropped == 0 and len(nums) > 50
        all_members = [proctable.Identity(p.pid, p.start_time)
                       for k in sup.keys()  # noqa: SIM118 - a method, not a dict
                       if (lin := sup.lineage(k)) is not None
                       for p in lin.members()]
    finally:
        sup.close()
    assert not [i for i in all_members if _alive(i)]
    assert not marked(session_names(state))
    print(f"re-adopted 49 sessions in {adopt_seconds * 1000:.0f} ms")


def test_sessions_in_their_own_cgroup_outlive_a_kill_of_the_supervisors(
        state: Path, tmp_path: Path) -> None:
    """What a service manager's stop does (systemd kills the service's whole cgroup),
    without systemd: the supervisor runs in a cgroup the test made, its sessions are
    placed in another (session_cgroup); cgroup.kill of the first ends the
    supervisor, and the sessions, helpers included, survive to be re-adopted."""
    import subprocess

    from proctable.lineage._cgroup import usable_parent

    from ._durable import CHILD, PY

    parent = usable_parent(None)
    if parent is None:
        pytest.skip("no writable cgroup v2 here")
    service = os.path.join(parent, f"pt-test-service-{os.getpid()}")
    sessions = os.path.join(parent, f"pt-test-sessions-{os.getpid()}")
    os.mkdir(service)
    os.mkdir(sessions)
    try:
        plan = {"options": {"session_cgroup": sessions},
                "starts": [{"key": "job", "args": ["sh", "-c", "setsid sleep 370 & "
                                                   "exec sleep 371"]}]}
        proc = subprocess.Popen(
            ["sh", "-c", f"echo $$ > {service}/cgroup.procs && exec \"$0\" \"$@\"", PY, "-c",
             CHILD, str(state), json.dumps(plan), str(tmp_path / "log")],
            stdout=subprocess.PIPE, start_new_session=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        names = session_names(state)
        wait_until(lambda: len(marked(names)) == 2, timeout=WAIT)
        with open(os.path.join(service, "cgroup.kill"), "w") as f:
            f.write("1")
        proc.wait(timeout=30)
        proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        time.sleep(0.3)
        assert len(marked(names)) == 2  # the sessions and their helpers live on
        rec = Recorder()
        with Supervisor(on_event=rec, state_dir=str(state), session_cgroup=sessions) as sup:
            assert rec.kinds("job") == [("adopted", 1, None)]
            lin = sup.lineage("job")
            assert lin is not None and len(lin.members()) == 2
        assert not marked(names)
        # The session's own cgroup (its helpers') is gone with it.
        wait_until(lambda: not [d for d in os.listdir(sessions)
                                if os.path.isdir(os.path.join(sessions, d))], timeout=WAIT)
    finally:
        for path in (service, sessions):
            for _ in range(100):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)


def test_async_supervisor_detaches_and_a_new_one_adopts(state: Path) -> None:
    import asyncio

    async def main() -> list[tuple[str, int]]:
        sup = await proctable.AsyncSupervisor.open(state_dir=str(state))
        await sup.start("shell", ["sh"], pty=(24, 80))
        await sup.write("shell", b"echo one $((1+1))\n")
        seen: list[tuple[str, int]] = []
        async for ev in sup.events():
            if ev.kind == "output" and b"one 2" in sup.tail("shell"):
                break
        sup.detach()
        async for ev in sup.events():  # ends: nothing comes after detach()
            seen.append((ev.kind, ev.generation))
        # (an interactive shell ignores SIGTERM: its close() waits out the grace)
        sup2 = await proctable.AsyncSupervisor.open(state_dir=str(state), grace=0.3)
        async with sup2:
            await sup2.write("shell", b"echo two $((1+1))\n")
            async for ev in sup2.events():
                seen.append((ev.kind, ev.generation))
                if ev.kind == "output" and ev.data and b"two 2" in ev.data:
                    break
            replay = sup2.tail("shell", since=0)
            assert b"one 2" in replay.data and b"two 2" in replay.data
        return seen

    seen = asyncio.run(main())
    assert ("adopted", 1) in seen


def test_an_unprivileged_user_keeps_and_readopts_durable_sessions(tmp_path: Path) -> None:
    """As uid 65534 (no cgroup to write, subreaper mode): a session outlives its
    detached supervisor and is re-adopted, then ended; a state directory of root's
    is refused to that user."""
    import shutil
    import tempfile

    from .conftest import is_root, run_as_nobody

    if not is_root():
        pytest.skip("needs root to drop to uid 65534")
    base = Path(tempfile.mkdtemp(prefix="proctable-nobody-"))  # (pytest's is root's, 0700)
    os.chmod(base, 0o711)
    state = base / "nobody-state"
    os.mkdir(state, 0o700)
    os.chown(state, 65534, 65534)
    rootstate = base / "root-state"
    os.mkdir(rootstate, 0o700)

    def body() -> object:
        try:
            Supervisor(state_dir=str(rootstate))
        except StateDirError as exc:
            refused = "not to this user" in str(exc) or "cannot be opened" in str(exc)
        else:
            refused = False
        sup = Supervisor(state_dir=str(state))
        sup.start("job", ["sh", "-c", "setsid sleep 380 & exec sleep 381"])
        lin = sup.lineage("job")
        assert lin is not None
        members = [proctable.Identity(p.pid, p.start_time) for p in lin.members()]
        mode = lin.mode
        sup.detach()
        events: list[tuple[str, int]] = []
        with Supervisor(on_event=lambda e: events.append((e.kind, e.generation)),
                        state_dir=str(state)) as sup2:
            again = sup2.lineage("job")
            assert again is not None
            same = sorted(p.pid for p in again.members()) == sorted(m.pid for m in members)
        gone = not [m for m in members if _alive(m)]
        return refused, mode, same, events[:1], gone

    try:
        result = run_as_nobody(body, timeout=60)
    finally:
        left = helpers_of(state)
        for ident in left:
            kill_pinned(ident)
        shutil.rmtree(base, ignore_errors=True)
    assert not left, f"helpers left running: {left}"
    assert isinstance(result, tuple) and result[0] == "ok", result
    refused, mode, same, first, gone = result[1]
    assert refused
    assert mode == "subreaper"
    assert same and first == [("adopted", 1)] and gone
