"""Scanner (kept stat fds) and the threaded scan: the same rows as snapshot()."""

from __future__ import annotations

import fcntl
import gc
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Optional

import pytest

import proctable
from proctable import _lowlevel as _ll
from proctable.scanner import default_max_fds
from proctable.table import Proc

from .conftest import PY, Procs, wait_until, wait_zombie

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="kept fds and threads are Linux-only"
)


def open_fds() -> set[int]:
    """fds open now (not the one that listed them, closed by then)."""
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            fcntl.fcntl(int(name), fcntl.F_GETFD)
        except OSError:
            continue
        out.add(int(name))
    return out


def sleepers(procs: Procs, n: int) -> list[int]:
    ps = [procs.popen(["sleep", "60"]) for _ in range(n)]
    pids = [p.pid for p in ps]
    # Wait until each has exec'd and sleeps: only then do its fields stand still.
    wait_until(lambda: all(
        (r := proctable.read(pid)) is not None and r.name == "sleep" and r.state == "S"
        for pid in pids))
    return pids


def stable(rows: proctable.Table, pids: list[int]) -> list[Optional[proctable.Proc]]:
    """The rows of pids (sleeping processes: nothing moves; rows compare by value)."""
    return [rows.get(pid) for pid in pids]


@pytest.fixture(params=["proc", "bpf"])
def scanner(request: pytest.FixtureRequest) -> Iterator[proctable.Scanner]:
    """A Scanner of each reader: kept /proc fds, and the BPF pass where it runs."""
    if request.param == "bpf" and proctable.reader().name != "bpf":
        pytest.skip(f"the BPF reader does not run here: {proctable.reader().why_not}")
    s = proctable.Scanner(reader=request.param)
    try:
        yield s
    finally:
        s.close()


def test_refresh_matches_snapshot_for_stable_processes(
    procs: Procs, scanner: proctable.Scanner
) -> None:
    pids = sleepers(procs, 5)
    first = scanner.refresh()  # opens the fds
    again = scanner.refresh()  # re-reads them with pread
    snap = proctable.snapshot()
    assert isinstance(again, proctable.Table)
    assert all(isinstance(p, Proc) for p in again)
    assert [p.pid for p in again] == sorted(p.pid for p in again)
    assert stable(first, pids) == stable(snap, pids) == stable(again, pids)
    me = again.get(os.getpid())
    assert me is not None and me.start_time == snap.get(os.getpid()).start_time  # type: ignore[union-attr]
    # Long-lived processes are in both (others may come and go meanwhile).
    common = {p.pid for p in again} & {p.pid for p in snap}
    assert {1, os.getpid(), *pids} <= common


def test_refresh_sees_new_and_drops_gone(procs: Procs, scanner: proctable.Scanner) -> None:
    scanner.refresh()
    new = procs.popen(["sleep", "60"])
    seen = {p.pid for p in scanner.refresh()}
    assert new.pid in seen
    kept = scanner.open_fds
    new.kill()
    new.wait(timeout=10)
    rows = scanner.refresh()
    assert new.pid not in rows
    # Its fds were closed; processes that came meanwhile may hold up to 3 each.
    arrived = {p.pid for p in rows} - seen
    assert scanner.open_fds <= kept + 3 * len(arrived)


def test_zombie_rows_match_snapshot(procs: Procs, scanner: proctable.Scanner) -> None:
    child = procs.py("import sys, time; sys.stdin.read(); raise SystemExit(7)",
                     stdin=subprocess.PIPE)
    scanner.refresh()  # the fd is opened while the child runs
    assert child.stdin is not None
    child.stdin.close()
    wait_zombie(child.pid)
    row = scanner.refresh().get(child.pid)
    assert row is not None and row.state == "Z"
    assert row.exit is not None and row.exit.code == 7
    assert row == proctable.read(child.pid)


@linux_only
def test_fds_are_cloexec_and_closed_on_close(procs: Procs) -> None:
    sleepers(procs, 3)
    before = open_fds()
    s = proctable.Scanner(reader="proc")
    s.refresh()
    held = open_fds() - before
    assert len(held) == s.open_fds >= 4  # /proc and a stat fd per process
    for fd in held:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            flags = int(next(line for line in f if line.startswith("flags:")).split()[1], 8)
        assert flags & 0o2000000, f"fd {fd} is not O_CLOEXEC"
    s.close()
    assert open_fds() - before == set()
    assert s.open_fds == 0
    s.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        s.refresh()


@linux_only
def test_context_manager_and_garbage_collection_close_fds(procs: Procs) -> None:
    sleepers(procs, 3)
    before = open_fds()
    with proctable.Scanner(reader="proc") as s:
        s.refresh()
        assert len(open_fds() - before) == s.open_fds > 0
    assert open_fds() - before == set()

    s = proctable.Scanner(reader="proc")
    s.refresh()
    assert open_fds() - before
    del s
    gc.collect()
    assert open_fds() - before == set()


@linux_only
@pytest.mark.parametrize("max_fds", [0, 1, 5])
def test_max_fds_is_respected_and_rows_stay_complete(procs: Procs, max_fds: int) -> None:
    pids = sleepers(procs, 12)
    before = open_fds()
    with proctable.Scanner(max_fds=max_fds, reader="proc") as s:
        assert s.max_fds == max_fds
        for _ in range(3):
            rows = s.refresh()
            assert len(open_fds() - before) == s.open_fds <= max_fds
            assert all(pid in rows for pid in pids)
        assert stable(rows, pids) == stable(proctable.snapshot(), pids)
    assert open_fds() - before == set()


def test_default_max_fds_is_half_the_soft_limit_at_most() -> None:
    code = textwrap.dedent("""
        import resource, proctable
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        print(proctable.Scanner().max_fds, proctable.Scanner(max_fds=100000).max_fds)
    """)
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["512", "512"]
    assert default_max_fds() <= 32768


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        proctable.Scanner(max_fds=-1)
    with pytest.raises(TypeError):
        proctable.Scanner(max_fds="10")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        proctable.Scanner(threads=0)


@linux_only
def test_buffers_grow_when_the_table_outgrows_them(procs: Procs) -> None:
    pids = sleepers(procs, 4)
    before = open_fds()
    fds = _ll.FdScanner(max_fds=10, cap=2, want=_ll.WANT_MEM | _ll.WANT_PROCFS)
    try:
        rows = fds.refresh(Proc)
        assert len(rows) > 2 and all(any(r.pid == pid for r in rows) for pid in pids)
        assert fds.open_fds <= 10
        rows = fds.refresh(Proc)
        assert all(any(r.pid == pid for r in rows) for pid in pids)
    finally:
        fds.close()
    assert open_fds() - before == set()


@linux_only
def test_refresh_from_several_threads(procs: Procs) -> None:
    pids = sleepers(procs, 3)
    errors: list[BaseException] = []
    with proctable.Scanner(threads=2) as s:
        def work() -> None:
            try:
                for _ in range(20):
                    assert all(pid in s.refresh() for pid in pids)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
    assert errors == []


# --- the threaded pass ---------------------------------------------------------


@linux_only
@pytest.mark.parametrize("threads", [2, 3, 8])
def test_parallel_scan_gives_the_single_thread_rows(procs: Procs, threads: int) -> None:
    pids = sleepers(procs, 40)
    procfs = _ll.WANT_MEM | _ll.WANT_PROCFS  # threads are a /proc reader's matter
    one = proctable.Table(_ll.snapshot_rows(Proc, 1, procfs)[0])
    many = proctable.Table(_ll.snapshot_rows(Proc, threads, procfs)[0])
    after = proctable.Table(_ll.snapshot_rows(Proc, 1, procfs)[0])
    assert stable(many, pids) == stable(one, pids)
    assert [p.pid for p in many] == sorted(p.pid for p in many)
    assert len({p.pid for p in many}) == len(many)
    # Others start and stop processes meanwhile (a neighbour's suite starts and
    # ends a hundred at once: the two reads once shared only 127 of 148 pids), so
    # no share of the table is a fact. A process in the reads before and after the
    # threaded one, the same (pid, start time), lived throughout it: it must be
    # there, once.
    throughout = [p for p in one
                  if (q := after.get(p.pid)) is not None and q.start_time == p.start_time]
    assert set(pids) <= {p.pid for p in throughout}  # the sleepers at least
    missed = [p.pid for p in throughout
              if (m := many.get(p.pid)) is None or m.start_time != p.start_time]
    assert not missed, f"the {threads}-thread read missed {missed} of {len(throughout)}"
    with proctable.Scanner(threads=threads) as s:
        s.refresh()
        assert stable(s.refresh(), pids) == stable(one, pids)


def test_scan_threads_rule() -> None:
    assert _ll.scan_threads(0) == 1
    assert _ll.scan_threads(_ll.PARALLEL_MIN - 1) == 1
    assert _ll.scan_threads(10**6, 1) == 1
    assert 1 <= _ll.scan_threads(10**6) <= 8
    assert _ll.scan_threads(10, 4) == 4
    assert _ll.scan_threads(2, 4) == 2


def test_floor_scans_count_the_table() -> None:
    n = len(proctable.snapshot())
    for threads in (0, 1, 2):
        for want in (0, _ll.WANT_MEM):
            assert abs(_ll.floor_scan(threads, want) - n) <= max(50, n // 10)
    assert _ll.floor_read(os.getpid()) > _ll.floor_read(os.getpid(), 0) > 0
    with pytest.raises(proctable.NoSuchProcess):
        _ll.floor_read(2**31 - 1)


# --- pid reuse -----------------------------------------------------------------

_REUSE = r"""
import json, os, subprocess, time, proctable
s = proctable.Scanner(threads=1, reader="proc")   # the kept fds are the point here
a = subprocess.Popen(["sleep", "60"])
before = s.refresh().get(a.pid)
fds = s.open_fds
a.kill(); a.wait()
time.sleep(0.05)                      # another clock tick: another start time
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(a.pid - 1))
b = subprocess.Popen(["cat"], stdin=subprocess.PIPE)
after = s.refresh().get(b.pid)
out = {"a": a.pid, "b": b.pid, "before": [before.name, before.start_time],
       "after": None if after is None else [after.name, after.start_time],
       "fds": [fds, s.open_fds]}
b.stdin.close(); b.wait(timeout=10)
s.close()
print(json.dumps(out))
"""


@linux_only
def test_pid_reuse_is_seen_as_a_new_process() -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare(1) to make a private pid namespace")
    cmd = [unshare, "-p", "-f", "--mount-proc", PY, "-c", _REUSE]
    if os.geteuid() != 0:
        cmd[1:1] = ["-U", "-r"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False,
                           start_new_session=True)
    except subprocess.TimeoutExpired:  # pragma: no cover - the namespace dies with its init
        pytest.fail("the pid namespace run did not finish in time")
    if r.returncode != 0:
        if "Operation not permitted" in r.stderr or "Permission denied" in r.stderr:
            pytest.skip(f"no private pid namespace here: {r.stderr.strip()[-200:]}")
        pytest.fail(r.stderr)
    out = json.loads(r.stdout)
    if out["a"] != out["b"]:
        pytest.skip("the kernel did not hand out the same pid again")
    assert out["before"][0] == "sleep"
    assert out["after"] is not None and out["after"][0] == "cat"
    assert out["after"][1] > out["before"][1]
    assert out["fds"][1] == out["fds"][0]  # the old fd was closed, the new one kept

