"""Reading the table while the machine churns.

A helper process starts and reaps hundreds of short processes a second (exits,
zombies for a moment, setsid double forks, SIGKILL, exec, threads, comm names
with ')' and spaces) while snapshot(), Scanner.refresh(), read(), exit_probe()
and identity() run in a loop. Every row must be well formed, no snapshot may
list a pid twice, and nothing may raise. The churn rate held is printed (-s).

PROCTABLE_SLOW_TESTS=1 runs it for 30 s instead of 3 s.
"""

from __future__ import annotations

import os
import time

import pytest

import proctable

from ._reliability import Churn, check_row, check_table, linux_only, scale

pytestmark = linux_only


@pytest.fixture
def churn():  # type: ignore[no-untyped-def]
    c = Churn(rate=800.0, live=64)
    try:
        yield c
    finally:
        c.kill()


def test_snapshots_while_processes_churn(churn: Churn) -> None:
    seconds = scale(3.0, 30.0)
    me = proctable.read(os.getpid())
    assert me is not None
    counts = {"snapshot": 0, "refresh": 0, "read": 0, "probe": 0, "identity": 0, "rows": 0}
    seen_churn_children = 0
    states: set[str] = set()
    with proctable.Scanner() as scanner:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            table = proctable.snapshot()
            counts["rows"] += check_table(table)
            counts["snapshot"] += 1
            mine = table.get(os.getpid())
            assert mine is not None and mine.start_time == me.start_time

            refreshed = scanner.refresh()
            counts["rows"] += check_table(refreshed)
            counts["refresh"] += 1
            assert refreshed.get(os.getpid()) is not None
            assert refreshed.get(churn.pid) is not None

            kids = [p for p in table if p.ppid == churn.pid]
            seen_churn_children += len(kids)
            for k in kids[:8]:
                states.add(k.state)
                row = proctable.read(k.pid)
                counts["read"] += 1
                if row is not None:
                    check_row(row)
                    assert row.pid == k.pid
                probe = proctable.exit_probe(k.pid, k.start_time)
                counts["probe"] += 1
                assert isinstance(probe.state, proctable.ProbeState)
                if probe.state is proctable.ProbeState.EXITED:
                    assert probe.status is not None and probe.proc is not None
                    assert probe.proc.start_time == k.start_time
                ident = proctable.identity(k.pid)
                counts["identity"] += 1
                assert ident is None or ident.pid == k.pid
    result = churn.stop()
    rate = result["started"] / result["seconds"]
    print(f"\nchurn: {result['started']} processes started in {result['seconds']:.1f} s "
          f"({rate:.0f}/s); {counts}; churn children seen in snapshots: "
          f"{seen_churn_children}; their states: {sorted(states)}")
    # That there was churn (its rate is the machine's: printed, never a pass mark).
    assert result["started"] >= 50, f"the churn helper started only {result['started']}"
    assert seen_churn_children > 0


def test_scanner_with_few_fds_while_processes_churn(churn: Churn) -> None:
    """A Scanner that may keep only a few fds: the rest is read open/read/close."""
    seconds = scale(1.5, 15.0)
    with proctable.Scanner(max_fds=8) as scanner:
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            check_table(scanner.refresh())
            assert scanner.open_fds <= 8
            n += 1
    churn.stop()
    assert n > 0


def test_threaded_snapshot_while_processes_churn(churn: Churn) -> None:
    """The C threads of the parallel scan, forced on a small table, under churn."""
    from proctable import _lowlevel

    seconds = scale(1.5, 15.0)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        # The /proc reader's threads (the BPF reader, where it runs, has none).
        rows = _lowlevel.snapshot_rows(proctable.Proc, 4,
                                       _lowlevel.WANT_MEM | _lowlevel.WANT_PROCFS)[0]
        check_table(rows)
    churn.stop()
