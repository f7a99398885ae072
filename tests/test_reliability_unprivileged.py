"""The key paths as uid 65534 (nobody), in a forked child that dropped privileges.

Each test runs its body through conftest.run_as_nobody: the child drops to
uid/gid 65534 and can read nothing under /root, where this interpreter may live,
so everything is imported here first. Answers come back as plain literals and
are checked in the parent, which (as root) also sets up the root-owned
processes the child looks at, and reaps them afterwards.

What needs root (a cgroup to write to, signalling other users' processes,
reading their zombies' status) must be refused or reported as unknown, never
answered wrongly.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from typing import Any

import pytest

import proctable
from proctable import ProbeState, lineage

from ._reliability import check_table, linux_only
from .conftest import Procs, needs_root, run_as_nobody, wait_zombie

pytestmark = [linux_only, needs_root]

NOBODY = 65534


def _ok(result: Any) -> Any:
    """The child's answer, or the test fails with the child's exception."""
    kind, value = result
    if kind == "error":
        pytest.fail(f"the unprivileged child raised {value}")
    if isinstance(value, tuple) and value and value[0] == "skip":
        pytest.skip(value[1])
    return value


def _wait_zombie_local(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = proctable.read(pid)
        if p is not None and p.state == "Z":
            return
        time.sleep(0.005)
    raise TimeoutError(f"pid {pid} did not become a zombie")


@pytest.fixture
def root_sleeper(procs: Procs) -> subprocess.Popen[bytes]:
    return procs.popen(["sleep", "300"])  # killed and reaped by procs


def test_snapshot_scanner_and_read(root_sleeper: subprocess.Popen[bytes]) -> None:
    def body() -> Any:
        table = proctable.snapshot()
        n = check_table(table)
        with proctable.Scanner() as s:
            m = check_table(s.refresh())
        me = table.get(os.getpid())
        other = proctable.read(root_sleeper.pid)
        own = subprocess.Popen(["sleep", "30"])
        try:
            # Until it has exec'd. The kernel sets the new comm a moment before the
            # new mm's dumpable flag, so give the owner a bounded moment to follow.
            deadline = time.monotonic() + 5
            mine = proctable.read(own.pid)
            while mine is not None and (mine.name != "sleep" or mine.uid != NOBODY):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.005)
                mine = proctable.read(own.pid)
        finally:
            own.kill()
            own.wait(timeout=10)
        return (n, m, me.uid if me else None, mine.uid if mine else None,
                other.uid if other else None, table.get(1) is not None,
                table.get(root_sleeper.pid) is not None)

    n, m, my_uid, child_uid, other_uid, has_init, has_sleeper = _ok(run_as_nobody(body))
    assert n > 0 and m > 0 and has_init and has_sleeper
    # setuid() made the child itself non-dumpable: /proc shows it as root's. What it
    # execs is dumpable again, and shown as ours.
    assert my_uid in (0, NOBODY) and child_uid == NOBODY and other_uid == 0


def test_probes_masked_for_root_zombies_exact_for_own(procs: Procs) -> None:
    root_zombie = procs.popen(["sh", "-c", "exit 7"])
    wait_zombie(root_zombie.pid)

    def body() -> Any:
        theirs = proctable.exit_probe(root_zombie.pid)
        row = proctable.read(root_zombie.pid)
        # Exec'd, so dumpable (a fork of this setuid()-ed child would not be: its
        # status is hidden even from us, and MASKED says so).
        child = subprocess.Popen(["sh", "-c", "exit 9"])
        try:
            _wait_zombie_local(child.pid)
            own = proctable.exit_probe(child.pid)
        finally:
            child.wait(timeout=10)
        return (theirs.state.value, theirs.status is None, row is not None and row.exit is None,
                row is not None and row.exit_masked,
                proctable.zombie_exit(root_zombie.pid) is None,
                own.state.value, own.status.code if own.status else None)

    (theirs, no_status, no_exit, masked, no_zombie_exit, own, own_code) = _ok(run_as_nobody(body))
    # Field 52 reads 0 for us; that must be MASKED, never "exited 0".
    assert theirs == ProbeState.MASKED.value and no_status and no_exit and masked
    assert no_zombie_exit
    assert own == ProbeState.EXITED.value and own_code == 9
    assert root_zombie.wait(timeout=10) == 7  # the status was 7 all along


def test_exit_watcher_on_own_child_and_on_a_root_process(procs: Procs) -> None:
    # A root-owned process (the subshell) that exits 5 and is reaped by its root parent.
    holder = procs.popen(["sh", "-c", "(sleep 0.5; exit 5) & echo $!; wait $!; exec sleep 30"],
                         stdout=subprocess.PIPE)
    assert holder.stdout is not None
    ready, _, _ = select.select([holder.stdout], [], [], 10)
    assert ready
    target = int(holder.stdout.readline())

    def body() -> Any:
        out: list[tuple[Any, ...]] = []
        with proctable.ExitWatcher() as w:
            own = subprocess.Popen(["sh", "-c", "exit 3"])
            fut = w.watch(own)
            st = fut.result(timeout=10)
            out.append((st.code, fut.source, own.wait(timeout=10)))
            fut = w.watch(target)
            try:
                st = fut.result(timeout=10)
                out.append(("status", st.code, st.signal, fut.source))
            except proctable.ExitUnknown as e:
                out.append(("unknown", str(e)))
        return tuple(out)

    own, theirs = _ok(run_as_nobody(body))
    assert own == (3, "waitid", 3)
    # The kernel may give the status (pidfd exit info) or not: never a wrong one.
    assert theirs[0] == "unknown" or theirs[1:3] == (5, None), theirs
    print(f"\nnobody watching a root process that exited 5: {theirs}")


def test_terminate_and_identity_of_a_root_process(root_sleeper: subprocess.Popen[bytes]) -> None:
    def body() -> Any:
        ident = proctable.identity(root_sleeper.pid)
        assert ident is not None
        # By identity: in this forked child the Popen is a copy of the parent's, and
        # its process is not our child (terminate(popen) would not signal it at all).
        try:
            proctable.terminate(ident, grace=0.2, kill_timeout=0.2)
            denied = None
        except proctable.AccessDenied as e:
            denied = str(e)
        return (ident is not None and ident.alive(), denied)

    alive, denied = _ok(run_as_nobody(body))
    assert alive and denied is not None
    assert root_sleeper.poll() is None  # untouched


def test_lineage_scan_of_own_processes() -> None:
    def body() -> Any:
        p = subprocess.Popen(["sh", "-c", "sleep 300 & setsid sleep 300 & wait"])
        try:
            with proctable.Lineage(p, interval=0.02) as lin:
                deadline = time.monotonic() + 10
                while len(lin.members()) < 3 and time.monotonic() < deadline:
                    time.sleep(0.02)
                members = [m.identity for m in lin.members()]
                report = lin.terminate(grace=2.0, kill_timeout=5.0)
            return (lin.mode, len(members), len(report.unresolved),
                    sum(1 for i in members if i.alive()))
        finally:
            if p.returncode is None:
                p.kill()
            p.wait(timeout=10)

    mode, n, unresolved, alive = _ok(run_as_nobody(body))
    assert mode == "scan" and n >= 3 and unresolved == 0 and alive == 0


def test_lineage_scan_never_claims_what_it_may_not_signal(
        root_sleeper: subprocess.Popen[bytes]) -> None:
    """Attaching to a root process: its teardown is unresolved (TeardownError), never
    reported gone, and the process is untouched."""
    def body() -> Any:
        lin = proctable.Lineage(root_sleeper.pid, interval=0.02)
        try:
            lin.terminate(grace=0.2, kill_timeout=0.5)
        except proctable.TeardownError as e:
            return ("teardown_error", [getattr(s, "pid", s) for s in e.survivors])
        return ("no error",)

    result = _ok(run_as_nobody(body))
    assert result[0] == "teardown_error" and root_sleeper.pid in result[1], result
    assert root_sleeper.poll() is None


def test_lineage_subreaper_and_auto() -> None:
    def body() -> Any:
        py = lineage._helper.HELPER
        # It runs by path, or through the fd kept since import where uid 65534 cannot
        # reach the package's directory (a venv in a 0700 directory).
        if not os.access(py, os.X_OK) and lineage._helper._HELPER_FD is None:
            return ("skip", f"uid {NOBODY} may not run the lineage helper ({py})")
        out: list[tuple[Any, ...]] = []
        for mode in ("subreaper", "auto"):
            with proctable.Lineage.spawn(["sh", "-c", "sleep 300 & setsid sleep 300 & wait"],
                                         mode=mode, interval=0.02) as lin:
                deadline = time.monotonic() + 15
                while len(lin.members()) < 3 and time.monotonic() < deadline:
                    time.sleep(0.02)
                members = [m.identity for m in lin.members()]
                report = lin.terminate(grace=2.0, kill_timeout=5.0)
            rc = lin.process.wait(timeout=10)
            out.append((lin.mode, len(members), len(report.unresolved),
                        sum(1 for i in members if i.alive()), rc))
        try:
            proctable.Lineage.spawn(["true"], mode="cgroup")
            out.append(("cgroup", "allowed"))
        except proctable.ProctableError as e:
            out.append(("cgroup", str(e)))
        return (py, *out)

    py, sub, auto, cgroup = _ok(run_as_nobody(body, timeout=60))
    print(f"\nlineage helper for uid {NOBODY}: {py}")
    for mode, n, unresolved, alive, rc in (sub, auto):
        assert mode == "subreaper" and n >= 3 and unresolved == 0 and alive == 0
        assert rc == -signal.SIGTERM
    # No cgroup is delegated to nobody here: cgroup mode says it needs one.
    assert cgroup[1] != "allowed" and "cgroup" in cgroup[1]
