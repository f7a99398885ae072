"""How a lineage looks: in proportion to the lineage, one event socket for all,
the slow full look and its gap, and kernels without children files.

Costs are measured in benchmarks/bench_lineage.py; here only what must hold:
which reads a sample makes, and what each look finds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import deque
from typing import Any

import pytest

import proctable
from proctable import _lowlevel, _pidfd
from proctable.lineage import _hub, _members
from proctable.lineage.scan import FULL_SCAN_SECONDS

from ._lineage import (
    SETSID_NOHUP,
    Tracker,
    dead,
    needs_cgroup,
    no_idle_hub,
    pids,
    py_cmd,
    read_line,
)
from .conftest import PY, Procs, wait_until

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

FAN = "for i in 1 2 3 4; do sleep 300 & done; echo up; wait"


def _events_available() -> bool:
    sub = _hub.subscribe(lambda: None, False)
    if sub is None:
        return False
    sub.close()
    return True


class Counter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
        self.n = 0
        orig = getattr(owner, name)

        def counted(*a: Any, **kw: Any) -> Any:
            self.n += 1
            return orig(*a, **kw)

        monkeypatch.setattr(owner, name, counted)


def _whole_table_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: Any, **kw: Any) -> Any:
        raise AssertionError("a lineage sample read the whole process table")

    monkeypatch.setattr(_lowlevel, "snapshot_rows", refuse)


@pytest.mark.parametrize("connector", [True, False], ids=["events", "no-events"])
def test_attached_sampler_reads_only_the_lineage(
        track: Tracker, procs: Procs, monkeypatch: pytest.MonkeyPatch, connector: bool) -> None:
    if connector and not _events_available():
        pytest.skip("no proc connector here")
    if not connector:
        monkeypatch.setenv(_pidfd.DISABLE_ENV, "proc_connector")
    p = procs.popen(["sh", "-c", FAN], stdout=subprocess.PIPE)
    assert read_line(p.stdout) == "up"
    lin = track.attach(p, interval=0.02)
    wait_until(lambda: len(lin.members()) == 5, timeout=10)
    _whole_table_is_never_read(monkeypatch)
    listings = Counter(monkeypatch, _members.Listing, "refresh")
    walks = Counter(monkeypatch, _members, "children_of")
    monkeypatch.setattr(sys.modules["proctable.lineage.scan"], "children_of",
                        _members.children_of)
    t0, s0 = time.monotonic(), lin.samples
    wait_until(lambda: lin.samples >= s0 + 40, timeout=30)  # the sampler's own ticks
    elapsed = time.monotonic() - t0
    ticks = lin.samples - s0
    # The full look (a listing of /proc) only at its slow period, never per tick.
    assert listings.n <= elapsed / FULL_SCAN_SECONDS + 1, (listings.n, elapsed)
    if connector:
        # Forks are recorded as they are reported: a tick walks nothing.
        assert walks.n <= 6 * listings.n, (walks.n, listings.n, ticks)
    else:
        assert walks.n >= 5 * (ticks - listings.n - 1), (walks.n, ticks)  # 5 members a tick
    lin.terminate(grace=1.0, kill_timeout=2.0)
    assert p.stdout is not None
    p.stdout.close()


JOINER = """
    import os, sys, time
    sys.stdin.readline()
    os.setpgid(0, int(sys.argv[1]))  # into a group a member leads (same session)
    print("joined", flush=True)
    time.sleep(300)
"""

LEADS_A_GROUP = """
    import os, time
    if os.fork() == 0:
        os.setpgid(0, 0)
        print(os.getpid(), flush=True)
        time.sleep(300)
        os._exit(0)
    os.wait()
"""


def test_slow_full_look_finds_a_process_that_joined_a_member_led_group(
        track: Tracker, procs: Procs, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without events (and no event reports a setpgid anyway): only a full look can see
    # that a process the lineage had looked at already is in a member's group now.
    monkeypatch.setenv(_pidfd.DISABLE_ENV, "proc_connector")
    root = procs.popen(py_cmd(LEADS_A_GROUP), stdout=subprocess.PIPE)
    leader = int(read_line(root.stdout))
    lin = track.attach(root, interval=0.02)
    assert wait_until(lambda: leader in pids(lin), timeout=10)
    q = procs.popen([*py_cmd(JOINER), str(leader)], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE)
    lin.sample()  # a full look: q is seen (and left alone) before it joins
    assert q.pid not in pids(lin)
    assert q.stdin is not None
    q.stdin.write(b"go\n")
    q.stdin.close()
    assert read_line(q.stdout) == "joined"
    # No call of ours looks from here: the sampler's slow full look must find it.
    assert wait_until(lambda: q.pid in lin._engine.reg.live,
                      timeout=3 * FULL_SCAN_SECONDS + 10)
    ident = track.pid(q.pid)
    report = lin.terminate(grace=1.0, kill_timeout=2.0)
    assert q.pid in {m.pid for m in report.members} and dead(ident)
    for stream in (root.stdout, q.stdout):
        assert stream is not None
        stream.close()


# --- no /proc/<pid>/task/<tid>/children ---------------------------------------------------


def test_subreaper_without_children_files_lists_proc(
        track: Tracker, monkeypatch: pytest.MonkeyPatch) -> None:
    # The switch: as on a kernel without CONFIG_PROC_CHILDREN (the reaper follows it too).
    monkeypatch.setenv(_pidfd.DISABLE_ENV, "proc_children")
    lin = track.spawn(["sh", "-c", SETSID_NOHUP + "; sleep 300"], mode="subreaper",
                      stdout=subprocess.PIPE)
    job = int(read_line(lin.process.stdout))
    ident = track.pid(job)
    assert wait_until(lambda: job in pids(lin), timeout=10)
    assert lin._engine.backend.no_children  # type: ignore[attr-defined]
    report = lin.terminate(grace=1.0, kill_timeout=2.0)
    assert dead(ident) and not report.unresolved
    assert {m.pid for m in report.members} >= {job, lin.root.pid}  # type: ignore[union-attr]
    assert lin.process.stdout is not None
    lin.process.stdout.close()


def test_a_missing_children_file_is_detected_never_read_as_no_members(
        track: Tracker, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real detection: the file is missing while the member's task directory is
    # there (a monkeypatched opener stands in for the kernel without it).
    def missing(pid: int) -> int:
        raise FileNotFoundError(f"/proc/{pid}/task/{pid}/children")

    monkeypatch.setattr(_members, "_open_children", missing)
    lin = track.spawn(["sh", "-c", "sleep 300 & sleep 300 & wait"], mode="subreaper")
    assert wait_until(lambda: len(lin.members()) == 3, timeout=10)
    backend: Any = lin._engine.backend
    assert backend.no_children
    report = lin.terminate(grace=1.0, kill_timeout=2.0)
    assert len(report.members) == 3 and not report.unresolved


CALLER = r"""
import json, subprocess, sys, time
sys.path[:0] = json.loads(sys.argv[1])
from proctable.lineage import Lineage
JOB = "setsid sh -c 'nohup sleep 300 >/dev/null 2>&1 & echo $!'; sleep 300"
lin = Lineage.spawn(["sh", "-c", JOB], mode="subreaper", stdout=subprocess.PIPE)
job = lin.process.stdout.readline().decode().strip()
print(job, lin.root.pid, flush=True)
time.sleep(300)
"""


def test_reaper_without_children_files_still_kills_all_when_the_caller_dies(
        procs: Procs, tmp_path: Any) -> None:
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    env = {**os.environ, _pidfd.DISABLE_ENV: "proc_children"}
    caller = procs.popen([PY, str(script), json.dumps([p for p in sys.path if p])],
                         stdout=subprocess.PIPE, env=env)
    job_s, cmd_s = read_line(caller.stdout).split()
    job, cmd = proctable.identity(int(job_s)), proctable.identity(int(cmd_s))
    assert job is not None and cmd is not None
    try:
        caller.kill()
        caller.wait(timeout=5)
        # The orphaned job is found by the reaper's scan of /proc, and killed.
        wait_until(lambda: not job.alive() and not cmd.alive(), timeout=15)
    finally:
        for ident in (job, cmd):
            if ident.alive():
                os.kill(ident.pid, 9)
        assert caller.stdout is not None
        caller.stdout.close()


# --- the shared event hub ------------------------------------------------------------------


def _netlink_fds() -> int:
    inodes = set()
    with open("/proc/self/net/netlink") as f:
        next(f)
        for line in f:
            inodes.add(line.split()[-1])
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            n += 1
    return n


@needs_cgroup
def test_a_cgroup_lineage_samples_only_when_asked(track: Tracker) -> None:
    """The cgroup holds every member until teardown reads it: a spawned cgroup-mode
    lineage starts no sampler thread and takes no events (nothing to drain, nothing
    woken 20 times a second), yet finds an escaped job at every look and tears it
    down; changes() starts both, for the record of short-lived members."""
    lin = track.spawn(["sh", "-c", SETSID_NOHUP + "; sleep 300"], mode="cgroup",
                      stdout=subprocess.PIPE)
    job = track.pid(int(read_line(lin.process.stdout)))
    e = lin._engine
    assert lin.sampler_thread is None and e.sub is None
    samples = lin.samples
    time.sleep(0.2)  # ten intervals of 20 ms: nobody looked
    assert lin.samples == samples
    assert job.pid in pids(lin)  # a look of the caller's finds the escape
    first = lin.changes()
    assert job.pid in {c.pid for c in first if c.kind == "joined"}
    thread = lin.sampler_thread
    assert thread is not None and thread.is_alive()
    if _events_available():
        assert e.sub is not None
    wait_until(lambda: lin.samples >= samples + 5, timeout=10)  # it samples on its own now
    report = lin.terminate(grace=1.0)
    assert job.pid in {m.pid for m in report.members}
    assert dead(job)
    assert not thread.is_alive()
    assert lin.process.stdout is not None
    lin.process.stdout.close()


def test_one_event_socket_for_every_lineage(track: Tracker, procs: Procs) -> None:
    if not _events_available():
        pytest.skip("no proc connector here")
    no_idle_hub()  # one an earlier test left lingering
    before = _netlink_fds()
    a = track.attach(procs.popen(["sleep", "300"]))
    b = track.spawn(["sh", "-c", "sleep 300 & wait"], mode="subreaper")
    c = track.spawn(["sleep", "300"], mode="scan")
    subs = [x._engine.sub for x in (a, b, c)]
    assert all(s is not None for s in subs)
    assert len({id(s._hub) for s in subs if s is not None}) == 1
    assert _netlink_fds() == before + 1
    for x in (a, b, c):
        x.terminate(grace=0.5)
    # Unused, the hub lingers a moment: a lineage started then shares it...
    hub = _hub._hub
    assert hub is not None and _netlink_fds() == before + 1
    d = track.spawn(["true"], mode="subreaper")
    assert d._engine.sub is not None and d._engine.sub._hub is hub
    d.terminate(grace=0.5)
    # ...and it ends on its own: its socket closed, its thread gone.
    wait_until(lambda: _hub._hub is None, timeout=_hub.LINGER_SECONDS + 10)
    wait_until(lambda: _netlink_fds() == before, timeout=10)
    hub.thread.join(timeout=10)
    assert not hub.thread.is_alive()


class Recorder(deque):  # type: ignore[type-arg]
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def append(self, ev: Any) -> None:
        self.seen.append(ev)
        super().append(ev)


def test_events_reach_only_the_lineage_they_concern(track: Tracker, procs: Procs) -> None:
    if not _events_available():
        pytest.skip("no proc connector here")
    a_root = procs.popen(["sleep", "300"])
    a = track.attach(a_root)
    sub = a._engine.sub
    assert sub is not None
    rec = Recorder()
    sub._queue = rec
    b_root = procs.popen(["sh", "-c", "read x; sleep 300 & echo up; wait"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    b = track.attach(b_root)
    assert b_root.stdin is not None
    b_root.stdin.write(b"go\n")
    b_root.stdin.close()
    assert read_line(b_root.stdout) == "up"
    assert wait_until(lambda: len(b.members()) == 2, timeout=10)
    sub.sync()
    assert not [e for e in rec.seen if b_root.pid in e[1:3]], rec.seen
    a.terminate(grace=0.5)
    b.terminate(grace=0.5)
    assert b_root.stdout is not None
    b_root.stdout.close()


_FORK_IN_LINGER = r"""
import json, os, proctable
from proctable.lineage import _hub as H

def inode(fd):
    return os.readlink(f"/proc/self/fd/{fd}")

with proctable.Lineage.spawn(["true"], mode="subreaper") as lin:  # cgroup mode: no hub
    lin.process.wait(30)
hub = H._hub
if hub is None or hub._closed:
    print(json.dumps({"lingering": False})); raise SystemExit(0)
held = {inode(hub._conn.fileno()), inode(hub._wake_r)}
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            mine.add(inode(fd))
        except OSError:
            pass
    os.write(w, json.dumps(sorted(mine & held)).encode())
    os._exit(0)
os.close(w)
child = json.loads(os.read(r, 65536).decode())
os.close(r)
os.waitpid(pid, 0)
print(json.dumps({"lingering": True, "child_holds": child}))
"""


@linux_only
def test_a_child_forked_while_the_hub_lingers_does_not_keep_its_socket_and_pipe() -> None:
    """A forked child starts without the hub (its thread stays in the parent); it must
    not hold the parent's netlink socket and wake-up pipe for its whole life, which the
    2 s linger now leaves behind every lineage.

    Found by an outside review of issue 21's changes."""
    r = subprocess.run([PY, "-c", _FORK_IN_LINGER], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    if not out["lingering"]:
        pytest.skip("no proc-connector hub here")
    assert out["child_holds"] == []


# The kernel counts proc-connector listeners and lowers the count only on an
# explicit PROC_CN_MCAST_IGNORE (lineage/_procconn.py); while it is above zero every
# fork, exec and exit of the host builds an event. A one-shot program (proctable
# run, a script with one lineage) used to unsubscribe as its lineage ended; with the
# 2 s linger it exits first, and nothing unsubscribed.
_EXIT_WHILE_LINGERING = r"""
import atexit, json, sys
ops = []
atexit.register(lambda: sys.stdout.write(json.dumps(ops) + "\n"))  # runs last
from proctable.lineage import _procconn
real = _procconn.ProcConnector._send
def send(self, op):
    ops.append(op)
    return real(self, op)
_procconn.ProcConnector._send = send
import proctable
from proctable.lineage import _hub
with proctable.Lineage.spawn(["true"], mode="subreaper") as lin:  # cgroup mode: no hub
    lin.process.wait(30)
if _hub._hub is None:
    ops.append("no hub")
"""


@linux_only
def test_a_program_that_exits_while_the_hub_lingers_unsubscribes() -> None:
    """A program that exits while its hub lingers (a one-shot ``proctable run``) never
    sent PROC_CN_MCAST_IGNORE, so the kernel's listener count stayed raised. Found by an
    outside review of issue 21's changes."""
    r = subprocess.run([PY, "-c", _EXIT_WHILE_LINGERING], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    ops = json.loads(r.stdout.splitlines()[-1])
    if "no hub" in ops or 1 not in ops:
        pytest.skip("no proc-connector hub here")
    assert ops.count(2) == ops.count(1), f"listens and unsubscribes: {ops}"
