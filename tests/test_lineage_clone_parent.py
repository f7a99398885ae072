"""A member that calls clone(CLONE_PARENT) (issue 24 item 4), and the health of a
torn-down scan lineage (item 5).

A CLONE_PARENT child's parent is the member's parent, outside the lineage, and
the proc connector's fork event names that parent too (the kernel reports the new
task's real_parent, checked here): no rule of scan mode over /proc can see it. A
spawned scan lineage finds it by its environment marker (issue 30, item 3), unless
its environment was replaced. The reaper modes keep it (it stays below the reaper,
in the cgroup), and ``auto`` spawns with one of them; scan mode says what it cannot
see in ``health`` and the docs.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

import pytest

import proctable
from proctable.lineage import _procconn

from ._lineage import MODES, Tracker, kill_identity, read_line
from ._reliability import linux_only
from .conftest import build_c, wait_until

pytestmark = linux_only

CLONE_PARENT_C = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Prints the pid of a child made with clone(CLONE_PARENT): a sibling of this
   process, not its child. Both then wait for a signal. */
int main(void) {
    long pid = syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0);
    if (pid < 0) {
        perror("clone");
        return 1;
    }
    if (pid == 0)
        for (;;)
            pause();
    printf("%ld\n", pid);
    fflush(stdout);
    for (;;)
        pause();
}
"""


@pytest.fixture(scope="module")
def clone_parent(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_c(tmp_path_factory.mktemp("clone_parent"), "clone_parent", CLONE_PARENT_C)


def _sibling(track: Tracker, stdout: Any) -> proctable.Identity:
    """The CLONE_PARENT child the program names, remembered for the cleanup."""
    return track.pid(int(read_line(stdout)))


def _end_our_child(ident: proctable.Identity) -> None:
    """Kill (by identity) and reap a process whose parent is this test process."""
    kill_identity(ident)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(ident.pid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            return
        time.sleep(0.01)
    pytest.fail(f"{ident.pid} did not end within 10 s of its SIGKILL")


def _running(ident: proctable.Identity) -> bool:
    row = proctable.read(ident.pid)
    return row is not None and row.start_time == ident.start_time and row.state != "Z"


def test_the_fork_event_names_the_new_parent_not_the_member(clone_parent: str) -> None:
    """What the proc connector says about a CLONE_PARENT fork, on this kernel: the
    parent in the event is the member's parent, so no event ties it to the member."""
    try:
        conn = _procconn.ProcConnector()
    except OSError as exc:
        pytest.skip(f"no proc connector here: {exc}")
    p = subprocess.Popen([clone_parent], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None
        child = proctable.identity(int(read_line(p.stdout)))
        assert child is not None
        events: list[Any] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                e[0] == _procconn.FORK and e[4] == child.pid for e in events):
            events += conn.read()
            time.sleep(0.01)
        forks = [e for e in events if e[0] == _procconn.FORK and e[4] == child.pid]
        assert forks, "no fork event for the CLONE_PARENT child"
        _what, _ppid, parent_tgid, _pid, _tgid = forks[0]
        assert parent_tgid == os.getpid() != p.pid  # the new parent: us, not the member
        row = proctable.read(child.pid)
        assert row is not None and row.ppid == os.getpid()
        _end_our_child(child)
    finally:
        conn.close()
        p.kill()
        p.wait(timeout=10)


@pytest.mark.parametrize("mode", [m for m in MODES if m != "scan"] + ["auto"])
def test_the_reaper_modes_keep_a_clone_parent_child(track: Tracker, clone_parent: str,
                                                   mode: str) -> None:
    lin = track.spawn([clone_parent], mode=mode, stdout=subprocess.PIPE)
    assert lin.mode != "scan"  # auto spawns with a reaper mode where one exists
    sib = _sibling(track, lin.process.stdout)
    wait_until(lambda: sib.pid in {m.pid for m in lin.members()}, timeout=10)
    assert not any("CLONE_PARENT" in h for h in lin.health)
    report = lin.terminate(grace=0.5, kill_timeout=5.0)
    assert sib.pid in {m.pid for m in report.members}
    assert not _running(sib)


def test_a_spawned_scan_lineage_finds_a_clone_parent_child_by_its_marker(
        track: Tracker, clone_parent: str) -> None:
    """No rule over /proc ties the child to the member, but it carries the
    environment marker of the spawn (issue 30, item 3): a member, ended by the
    teardown. Health names what is left of the limit (a child that replaced its
    environment) and spawn's way out."""
    lin = track.spawn([clone_parent], mode="scan", stdout=subprocess.PIPE)
    sib = _sibling(track, lin.process.stdout)
    try:
        assert sorted(m.pid for m in lin.members()) == sorted([lin.process.pid, sib.pid])
        limit = [h for h in lin.health if "CLONE_PARENT" in h]
        assert limit and "environment" in limit[0] and "subreaper" in limit[0], lin.health
        report = lin.terminate(grace=0.5, kill_timeout=5.0)
        assert sib.pid in {m.pid for m in report.members}
        wait_until(lambda: not _running(sib), timeout=10)
        assert any("CLONE_PARENT" in h for h in report.health)
    finally:
        _end_our_child(sib)


def test_scan_mode_cannot_see_a_clone_parent_child_without_the_marker(
        track: Tracker, clone_parent: str) -> None:
    """What is seen, and the written limit: a child that does not carry the marker
    (here the command was started with an environment of its own, after the spawn
    set it) is no member and outlives the teardown; health names the limit."""
    lin = track.spawn(["env", "-u", "PROCTABLE_LINEAGE", clone_parent], mode="scan",
                      stdout=subprocess.PIPE)
    sib = _sibling(track, lin.process.stdout)
    try:
        assert [m.pid for m in lin.members()] == [lin.process.pid]
        report = lin.terminate(grace=0.5, kill_timeout=5.0)
        assert sib.pid not in {m.pid for m in report.members}
        assert _running(sib)  # what scan mode cannot see survives: the limit is real
        assert any("CLONE_PARENT" in h for h in report.health)
    finally:
        _end_our_child(sib)


def test_an_attached_lineage_says_so_too(track: Tracker, clone_parent: str) -> None:
    p = subprocess.Popen([clone_parent], stdout=subprocess.PIPE)
    assert p.stdout is not None
    sib = _sibling(track, p.stdout)
    try:
        lin = track.attach(p)  # auto: attaching always scans
        assert lin.mode == "scan"
        assert sib.pid not in {m.pid for m in lin.members()}
        assert any("CLONE_PARENT" in h for h in lin.health), lin.health
        lin.terminate(grace=0.5, kill_timeout=5.0)
    finally:
        _end_our_child(sib)
        p.kill()
        p.wait(timeout=10)


@pytest.mark.parametrize("how", ["spawn", "attach"])
def test_a_torn_down_scan_lineage_reports_no_fault_that_never_happened(
        track: Tracker, how: str) -> None:
    """Item 5: after teardown the lineage's event subscription is closed, and health
    used to read that as "the proc connector is refused"."""
    if how == "spawn":
        lin = track.spawn(["sleep", "60"], mode="scan")
    else:
        p = subprocess.Popen(["sleep", "60"])
        lin = track.attach(p, mode="scan")
    if lin._engine.sub is None:
        pytest.skip("no proc connector here: that line would be true")
    before = lin.health
    assert not any("no fork events" in h for h in before), before
    report = lin.terminate(grace=0.5, kill_timeout=5.0)
    assert lin.closed
    assert lin.health == before, lin.health
    assert list(report.health) == before
    if how == "attach":
        p.wait(timeout=10)

