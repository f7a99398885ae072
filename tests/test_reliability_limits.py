"""Limits that run out: RLIMIT_NOFILE of 32 and 64, RLIMIT_NPROC during restarts.

Each fd case runs tests/faults/limits.py in a fresh interpreter that lowered its
own RLIMIT_NOFILE before importing proctable; whatever it leaves running is found
by an environment marker and killed here, by pid, and fails the test.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import proctable

from ._faults import run_marked
from ._lineage import kill_identity
from ._reliability import linux_only
from .conftest import needs_root, run_as_nobody

pytestmark = linux_only

LIMITS = Path(__file__).resolve().parent / "faults" / "limits.py"



def run_limited(nofile: int, scenario: str) -> dict[str, Any]:
    mark = f"limits-{nofile}-{scenario}-{uuid.uuid4().hex[:8]}"
    rc, stdout, stderr, left = run_marked(
        [sys.executable, str(LIMITS), str(nofile), scenario], mark)
    assert rc == 0, stderr[-3000:]
    res = json.loads(stdout.splitlines()[-1])[scenario]
    assert left == [], f"left running: {left}; {res}"
    assert "error" not in res, res
    return res["result"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("nofile", [32, 64])
def test_table_and_scanner_with_few_fds(nofile: int) -> None:
    out = run_limited(nofile, "table")
    assert out["me"] and out["scanner_me"]
    assert out["scanner"] > 0 and out["snapshot"] > 0
    assert out["max_fds"] <= nofile // 2  # a Scanner never takes more than half
    assert out["fds_after"] == out["fds"]  # nothing kept after close()


@pytest.mark.parametrize("nofile", [32, 64])
def test_table_with_two_fds_free(nofile: int) -> None:
    # the README's promise: the table works at these limits, even nearly used up
    out = run_limited(nofile, "table_two_free")
    assert out["me"] and out["scanner_me"] and out["read_me"]
    assert out["me_rss"]  # memory read too, one file at a time
    assert out["snapshot"] > 1 and out["snapshot_nomem"] > 1 and out["scanner"] > 1
    assert out["snapshot_threads"] > 1 and out["scanner_threads"] > 1  # 4 threads asked
    assert out["kept"] == 0  # every fd it opened is closed again


@pytest.mark.parametrize("nofile", [32, 64])
def test_watcher_refuses_what_it_cannot_hold_and_resolves_the_rest(nofile: int) -> None:
    out = run_limited(nofile, "watcher")
    assert out["accepted"] >= nofile // 2 and out["refused"] >= 1
    assert out["first_refusal"].startswith("OutOfFds")
    assert f"RLIMIT_NOFILE {nofile}" in out["first_refusal"]
    assert out["statuses"] == [signal.SIGKILL]  # every accepted watch resolved, right


@pytest.mark.parametrize("mode", ["auto", "subreaper", "scan"])
@pytest.mark.parametrize("nofile", [32, 64])
def test_a_lineage_bigger_than_the_fds_is_torn_down(nofile: int, mode: str) -> None:
    out = run_limited(nofile, f"lineage_{mode}")
    assert out["members"] == 41, out
    # Every member ended (proven, so ok), or TeardownError naming who: never a
    # success that leaves one running (the marker scan above checks that too).
    if out["teardown"] != "ok":
        assert out["teardown"] == "TeardownError" and out["survivors"] > 0, out
    else:
        assert out["ended"] == 41, out


@needs_root
def test_rlimit_nproc_reached_while_restarting() -> None:
    """A supervisor restarts a crashing key while its uid has no process left to
    start: gave_up with a reason, or a restart within the policy; never a dead
    control thread, never a silent stop. Runs as a uid no other process runs as
    (RLIMIT_NPROC does not bind root, and counts every task of the uid: with uid
    65534 other test runs' tasks came and went between the count and the crash),
    in a fresh interpreter."""
    code = textwrap.dedent("""
        import json, os, resource, subprocess, sys, threading, time
        import proctable, proctable.supervise, proctable.lineage
        uid = int(sys.argv[1])
        # Everything imported first: this uid may not read this interpreter's files.
        os.setgroups([]); os.setgid(uid); os.setuid(uid)
        events = []
        sup = proctable.Supervisor(on_event=events.append, grace=0.5, kill_timeout=2.0,
                                   mode="subreaper")
        policy = proctable.RestartPolicy(max_restarts=20, delay=0.05)  # bounded either way
        sup.start("crash", ["sh", "-c", "sleep 0.3; exit 1"], restart=policy)
        time.sleep(0.5)
        # Now no new process (or thread) for this uid: count what runs, cap there.
        mine = sum(1 for p in proctable.snapshot(memory=False) if p.uid == uid)
        threads = sum(p.num_threads or 1 for p in proctable.snapshot(memory=False)
                      if p.uid == uid)
        soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        resource.setrlimit(resource.RLIMIT_NPROC, (threads, hard))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if any(e.kind == "gave_up" for e in events):
                break
            time.sleep(0.05)
        resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))
        kinds = [e.kind for e in events]
        reasons = [e.reason for e in events if e.kind == "gave_up"]
        alive = sup.running("crash")
        state = sup.state("crash")
        sup.close()
        print(json.dumps({"kinds": kinds, "reasons": reasons, "running": alive,
                          "state": str(state), "mine": mine}))
    """)
    r = subprocess.run([sys.executable, "-c", code, str(_unused_uid())], capture_output=True,
                       text=True, timeout=120, check=False, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    kinds = out["kinds"]
    assert kinds.count("created") >= 1
    # It gave up loudly, with a reason a person can read, and nothing after that.
    assert "gave_up" in kinds, out
    assert kinds[-1] == "gave_up" or kinds[kinds.index("gave_up") + 1:] == [], out
    assert out["reasons"] and all(out["reasons"]), out
    assert not out["running"], out


# A supervisor in a fresh interpreter, as a uid of its own, whose crash-looping key
# crashes (SIGKILL from here, by pidfd) only once RLIMIT_NPROC leaves `free` tasks
# to start after the crashed command is reaped: with 0 not even the teardown's
# worker thread can start; with 1 or 2 the teardown, the launch or the command's
# fork is the first to fail.
_NPROC_CODE = textwrap.dedent("""
    import json, os, resource, signal, sys, threading, time
    import proctable, proctable.supervise, proctable.lineage
    uid, free = int(sys.argv[1]), int(sys.argv[2])
    # Everything imported first: this uid may not read this interpreter's files.
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
    events, limited = [], threading.Event()

    def crash(ident):
        fd = os.pidfd_open(ident.pid)
        try:
            now = proctable.identity(ident.pid)
            if now is not None and now.start_time == ident.start_time:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        finally:
            os.close(fd)

    def on_event(ev):
        events.append(ev)
        if ev.kind == "created" and limited.is_set():
            crash(ev.identity)

    def tasks():
        return sum(p.num_threads or 1 for p in proctable.snapshot(memory=False)
                   if p.uid == uid)

    sup = proctable.Supervisor(on_event=on_event, grace=0.5, kill_timeout=2.0,
                               mode="subreaper")
    sup._workers.idle_seconds = 0.05  # (2 s by default: the start's worker ends soon)
    ident = sup.start("crash", ["sleep", "60"],
                      restart=proctable.RestartPolicy(max_restarts=2, delay=0.05))
    # Settled: the launch worker has ended (idle workers end idle_seconds after their
    # last job), so the count is what stays, and the teardown needs a new thread.
    deadline = time.monotonic() + 20
    while any(t.name.startswith(("proctable-supervisor-launch", "proctable-supervisor-idle"))
              for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the launch worker did not end"
        time.sleep(0.01)
    sup._workers.idle_seconds = 2.0  # the default again, for the crash loop
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    n = tasks()
    resource.setrlimit(resource.RLIMIT_NPROC, (n - 1 + free, hard))  # - the crashed one
    limited.set()
    crash(ident)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(e.kind == "gave_up" for e in events):
        time.sleep(0.02)
    time.sleep(0.3)  # anything after gave_up would come now
    state, running = sup.state("crash"), sup.running("crash")
    resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))
    try:
        sup.close()  # a failed teardown is retried here, with the limit lifted
        closed = "ok"
    except Exception as exc:
        closed = repr(exc)
    print(json.dumps({"kinds": [e.kind for e in events], "tasks": n, "state": state,
                      "running": running, "closed": closed,
                      "reasons": [e.reason for e in events if e.kind == "gave_up"]}))
""")


def _unused_uid() -> int:
    """A uid no process runs as: RLIMIT_NPROC counts every task of the uid, and
    other test runs on this host may run as nobody."""
    used = {p.uid for p in proctable.snapshot(memory=False)}
    return next(u for u in range(61000 + os.getpid() % 2000, 64000) if u not in used)


@needs_root
@pytest.mark.parametrize("free", [0, 1, 2])
def test_rlimit_nproc_just_above_the_tasks_ends_a_crash_loop_loudly(free: int) -> None:
    """Issue 24 item 3: with RLIMIT_NPROC a little above what the uid runs, a
    crash-looping key ended with teardown_failed and then neither restarted nor
    gave up. Whatever fails first (the teardown's worker, the launch's, the
    command's fork), the key ends with gave_up and a reason, and nothing after."""
    r = subprocess.run([sys.executable, "-c", _NPROC_CODE, str(_unused_uid()), str(free)],
                       capture_output=True, text=True, timeout=120, check=False, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    kinds = out["kinds"]
    assert "gave_up" in kinds, out
    assert kinds[-1] == "gave_up", out  # loud, and the last word
    assert out["reasons"] and all(out["reasons"]), out
    assert not out["running"], out
    assert out["state"] in ("gave_up", "failed_exited"), out
    assert out["closed"] == "ok", out


def _crash_loop_under_nproc(uid: int, free: int) -> dict[str, Any]:
    """In a forked child running as uid: a key that crashes (SIGKILL by pidfd) once
    RLIMIT_NPROC leaves ``free`` tasks above what the uid runs, with a budget of one
    restart; the limit restored, then close(). What of the uid is left after it."""
    events: list[Any] = []
    limited = threading.Event()

    def crash(ident: proctable.Identity) -> None:
        fd = os.pidfd_open(ident.pid)
        try:
            if proctable.identity(ident.pid) == ident:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        finally:
            os.close(fd)

    def on_event(ev: Any) -> None:
        events.append(ev)
        if ev.kind == "created" and limited.is_set():
            crash(ev.identity)

    def tasks() -> int:
        return sum(p.num_threads or 1 for p in proctable.snapshot(memory=False)
                   if p.uid == uid)

    sup = proctable.Supervisor(on_event=on_event, grace=0.5, kill_timeout=2.0)
    ident = sup.start("crash", ["sleep", "60"],
                      restart=proctable.RestartPolicy(max_restarts=1, delay=0.05))
    deadline = time.monotonic() + 20
    while any(t.name.startswith("proctable-supervisor-launch") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the launch worker did not end"
        time.sleep(0.01)
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    resource.setrlimit(resource.RLIMIT_NPROC, (tasks() - 1 + free, hard))  # - the crashed one
    try:
        limited.set()
        crash(ident)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(e.kind == "gave_up" for e in events):
            time.sleep(0.02)
        time.sleep(0.3)  # anything after gave_up would come now
    finally:
        resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))
    sup.close()
    rows = [p for p in proctable.snapshot(memory=False) if p.uid == uid and p.pid != os.getpid()]
    return {"kinds": [e.kind for e in events],
            "running": [(p.pid, p.name, p.state) for p in rows if p.state not in ("Z", "X")],
            "ended": [(p.pid, p.name, p.ppid) for p in rows if p.state in ("Z", "X")]}


@needs_root
@pytest.mark.parametrize("free", [4, 5])
def test_nothing_of_a_crash_loop_under_rlimit_nproc_runs_after_close(free: int) -> None:
    """Issue 30, item 5: with RLIMIT_NPROC 4 and 5 above the uid's tasks, a crashing
    key with one restart gives up loudly, but a reviewer found a pt-reaper after
    close() (the limit restored before it). Nothing of the run may run after
    close(): no command, no helper. (A helper that ended after its mirror is init's
    to reap: it may still show as a zombie of pid 1 for a moment, never running.)
    In a forked child, as a uid no other process runs as: RLIMIT_NPROC counts every
    task of the uid, and other runs on this host come and go as 65534."""
    uid = _unused_uid()
    res = run_as_nobody(lambda: _crash_loop_under_nproc(uid, free), timeout=90, uid=uid)
    try:
        assert res[0] == "ok", res  # type: ignore[index]
        out = res[1]  # type: ignore[index]
        assert out["kinds"][-1] == "gave_up", out
        assert out["running"] == [], out
        assert all(ppid != os.getpid() for _, _, ppid in out["ended"]), out
    finally:
        for p in proctable.snapshot(memory=False):  # a failed run leaves nothing of that uid
            if p.uid == uid and p.state not in ("Z", "X"):
                kill_identity(p.identity)


@needs_root
def test_a_scan_spawn_off_the_main_thread_says_no_thread_could_start() -> None:
    """A scan spawn from a worker thread (a supervisor's launch) forks on a spawner
    thread of its own; where RLIMIT_NPROC leaves none to start, that is NoThread
    naming the limit, not a bare RuntimeError("can't start new thread")."""
    code = textwrap.dedent("""
        import json, os, resource, sys, threading
        import proctable
        from proctable.lineage import _pdeath
        uid = int(sys.argv[1])
        os.setgroups([]); os.setgid(uid); os.setuid(uid)
        out = {}

        def worker():
            n = sum(p.num_threads or 1 for p in proctable.snapshot(memory=False)
                    if p.uid == uid)
            soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
            resource.setrlimit(resource.RLIMIT_NPROC, (n, hard))  # none left free
            try:
                _pdeath.on_lasting_thread(lambda: 1)
                out["error"] = None
            except Exception as exc:
                out["error"] = type(exc).__name__
                out["message"] = str(exc)
            resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))
            out["after"] = _pdeath.on_lasting_thread(lambda: 2)  # the next one starts

        t = threading.Thread(target=worker)
        t.start()
        t.join(60)
        print(json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", code, str(_unused_uid())], capture_output=True,
                       text=True, timeout=120, check=False, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["error"] == "NoThread", out
    assert "RLIMIT_NPROC" in out["message"], out
    assert out["after"] == 2, out
