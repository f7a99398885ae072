"""Many threads using one proctable at once.

16 threads start together (a barrier) and each, in a loop, calls snapshot(),
read(), exit_probe(), identity(), refreshes one Scanner that all share, watches
its own children on one shared ExitWatcher, waits with wait_exit() in its own
asyncio loop, terminates a child, and (every other thread) runs a Lineage through
a teardown. Every answer is checked against what the thread knows about its own
processes. PROCTABLE_SLOW_TESTS=1 makes the loops ten times longer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import traceback
from typing import Any

import pytest

import proctable
from proctable import table
from proctable.lineage import _cgroup

from ._reliability import SLOW, check_table, linux_only

pytestmark = linux_only

THREADS = 16
ROUNDS = 40 if SLOW else 5
LINEAGE_MODES = [*(["cgroup"] if _cgroup.usable_parent() is not None else []), "subreaper", "scan"]


class Started:
    """Every Popen the threads started: killed by pid and reaped at the end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.popens: list[subprocess.Popen[bytes]] = []

    def popen(self, args: list[str]) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(args)
        with self.lock:
            self.popens.append(p)
        return p

    def cleanup(self) -> None:
        for p in self.popens:
            if p.returncode is None:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)


def _worker(i: int, barrier: threading.Barrier, scanner: proctable.Scanner,
            watcher: proctable.ExitWatcher, started: Started, counts: dict[str, int]) -> None:
    me = os.getpid()
    live = started.popen(["sleep", "120"])
    ident = proctable.identity(live.pid)
    assert ident is not None
    barrier.wait(timeout=60)
    for k in range(ROUNDS):
        table = proctable.snapshot()
        check_table(table)
        row = table.get(live.pid)
        assert table.get(me) is not None
        assert row is not None and row.start_time == ident.start_time

        row = proctable.read(live.pid)
        assert row is not None and row.start_time == ident.start_time and row.ppid == me
        probe = proctable.exit_probe(live.pid, ident.start_time)
        assert probe.state in (proctable.ProbeState.RUNNING,), probe
        assert proctable.identity(live.pid) == ident
        assert ident.alive()

        refreshed = scanner.refresh()
        kept = refreshed.get(live.pid)
        assert kept is not None and kept.start_time == ident.start_time

        # An exit code only this thread and round use, through the shared watcher.
        code = (i * 16 + k) % 250 + 1
        p = started.popen(["sh", "-c", f"exit {code}"])
        fut = watcher.watch(p)
        status = fut.result(timeout=30)
        assert status.code == code and status.signal is None, (status, code)
        assert p.wait(timeout=10) == code  # the watcher did not reap it

        q = started.popen(["sleep", "120"])
        qid = proctable.identity(q.pid)
        assert qid is not None
        fut = watcher.watch(qid)
        os.kill(q.pid, signal.SIGKILL)
        status = fut.result(timeout=30)
        assert status.signal == signal.SIGKILL, status
        assert q.wait(timeout=10) == -signal.SIGKILL

        # wait_exit in this thread's own event loop (the shared default watcher).
        r = started.popen(["sh", "-c", f"exit {code}"])
        status = asyncio.run(proctable.wait_exit(r, timeout=30))
        assert status.code == code
        r.wait(timeout=10)

    if i % 2 == 0:
        mode = LINEAGE_MODES[(i // 2) % len(LINEAGE_MODES)]
        lin = proctable.Lineage.spawn(["sh", "-c", "sleep 120 & setsid sleep 120 & wait"],
                                      mode=mode, interval=0.02)
        try:
            deadline = 30.0
            members: list[proctable.Proc] = []
            while deadline > 0 and len(members) < 3:
                members = lin.members()
                threading.Event().wait(0.02)
                deadline -= 0.02
            assert len(members) >= 3, (mode, members)
            idents = [m.identity for m in members]
            report = lin.terminate(grace=2.0, kill_timeout=5.0)
        finally:
            if not lin.closed:
                lin.terminate(grace=0.1, kill_timeout=5.0)
        assert not report.unresolved, report
        assert not [x for x in idents if x.alive()], idents
        with started.lock:
            counts[f"lineage_{mode}"] = counts.get(f"lineage_{mode}", 0) + 1
    elif i % 4 == 1:
        # Attach (scan) to this thread's own child, then tear it down.
        lin = proctable.Lineage(live, interval=0.02)
        report = lin.terminate(grace=2.0, kill_timeout=5.0)
        assert [m.pid for m in report.members] == [live.pid], report
        assert live.wait(timeout=10) == -signal.SIGTERM
        with started.lock:
            counts["lineage_attach"] = counts.get("lineage_attach", 0) + 1

    if live.returncode is None:
        last = proctable.terminate(live, grace=5.0, kill_timeout=5.0)
        assert last is not None and last.signal == signal.SIGTERM, last
        assert live.wait(timeout=10) == -signal.SIGTERM


def test_sixteen_threads_at_once() -> None:
    started = Started()
    errors: list[str] = []
    counts: dict[str, int] = {}
    barrier = threading.Barrier(THREADS)

    def run(i: int, scanner: Any, watcher: Any) -> None:
        try:
            _worker(i, barrier, scanner, watcher, started, counts)
        except BaseException:
            errors.append(f"thread {i}: {traceback.format_exc()}")
            barrier.abort()

    try:
        with proctable.Scanner() as scanner, proctable.ExitWatcher() as watcher:
            threads = [threading.Thread(target=run, args=(i, scanner, watcher), daemon=True)
                       for i in range(THREADS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)
            stuck = [t.name for t in threads if t.is_alive()]
            assert not stuck, f"threads still running after 300 s: {stuck}"
            assert watcher.pending == 0
    finally:
        started.cleanup()
    assert not errors, "\n".join(errors)
    print(f"\n{THREADS} threads x {ROUNDS} rounds; {len(started.popens)} processes; "
          f"lineages torn down: {counts}")


def test_first_identities_from_many_threads_all_carry_the_handle(monkeypatch: Any) -> None:
    """Regression: table._has_pidfs() published a provisional False while it probed
    the kernel, so threads whose first identity() raced with the probe got
    handle=None (found by test_sixteen_threads_at_once)."""
    monkeypatch.setattr(table, "_pidfs", None)
    if not table._has_pidfs():
        pytest.skip("pidfds do not live on pidfs here (Linux < 6.9): no handle to lose")
    def probe(barrier: threading.Barrier, seen: list[object]) -> None:
        barrier.wait(timeout=30)
        seen.append(table._has_pidfs())

    for _round in range(30):
        monkeypatch.setattr(table, "_pidfs", None)
        barrier = threading.Barrier(8)
        seen: list[object] = []
        threads = [threading.Thread(target=probe, args=(barrier, seen)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert seen == [True] * 8
