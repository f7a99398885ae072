"""Memory and fds: thousands of calls leave RSS flat and no fd behind.

Each test warms up (buffers, the shared watcher's thread, imports), counts
/proc/self/fd and RSS, runs thousands of operations, and counts again: the fd
list must be the same, and RSS may grow by at most a generous bound (Python's
allocator keeps freed arenas; a leak of one row per call would blow well past
it). The figures are printed (-s). PROCTABLE_SLOW_TESTS=1 runs ten times more.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Callable

import pytest

import proctable
from proctable.exits._watcher import _default_watcher
from proctable.lineage import _cgroup

from ._reliability import SLOW, fd_list, linux_only, rss_bytes, wait_for

pytestmark = linux_only

MiB = 1024 * 1024
RSS_BOUND = 32 * MiB
# Under scripts/asan_tests.sh, ASan holds freed memory in quarantine (up to 256 MiB):
# RSS grows by design there, so only the fds are checked.
UNDER_ASAN = "asan" in os.environ.get("LD_PRELOAD", "")
CGROUP = _cgroup.usable_parent() is not None


def measured(name: str, work: Callable[[], int], warmup: Callable[[], object]) -> None:
    """Warm up, then run work() (returns how many operations it did); check fds and RSS."""
    warmup()
    gc.collect()
    fds0, rss0 = fd_list(), rss_bytes()
    t0 = time.monotonic()
    ops = work()
    seconds = time.monotonic() - t0
    gc.collect()
    fds1, rss1 = fd_list(), rss_bytes()
    print(f"\n{name}: {ops} operations in {seconds:.1f} s; RSS {rss0 / MiB:.1f} -> "
          f"{rss1 / MiB:.1f} MiB ({(rss1 - rss0) / MiB:+.1f}); fds {len(fds0)} -> {len(fds1)}")
    # Nothing the work opened is still open. (An fd of an earlier test's that a
    # thread of its own closes meanwhile, a pipe, is no leak: only new ones count.)
    opened = [f for f in fds1 if f not in fds0]
    assert not opened, f"left open: {opened}\nfds before {fds0}\nafter {fds1}"
    if not UNDER_ASAN:
        assert rss1 - rss0 < RSS_BOUND, f"RSS grew by {(rss1 - rss0) / MiB:.1f} MiB"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen(["sleep", "300"])
    try:
        yield p
    finally:
        if p.returncode is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def test_snapshots_reads_and_probes(sleeper: subprocess.Popen[bytes]) -> None:
    n = 30_000 if SLOW else 3_000

    def warmup() -> None:
        for _ in range(50):
            proctable.snapshot()
            proctable.read(sleeper.pid)
            proctable.exit_probe(sleeper.pid)
            proctable.identity(sleeper.pid)

    def work() -> int:
        ops = 0
        for _ in range(n):
            table = proctable.snapshot()
            assert table.get(sleeper.pid) is not None
            ops += 1
        for _ in range(n * 3):
            assert proctable.read(sleeper.pid) is not None
            assert proctable.exit_probe(sleeper.pid).state is proctable.ProbeState.RUNNING
            ident = proctable.identity(sleeper.pid)
            assert ident is not None and ident.alive()
            assert proctable.read(2**22 + 7) is None  # beyond pid_max: never a process
            ops += 4
        return ops

    measured("snapshot/read/exit_probe/identity", work, warmup)


def test_scanners(sleeper: subprocess.Popen[bytes]) -> None:
    n = 3_000 if SLOW else 300

    def warmup() -> None:
        with proctable.Scanner() as s:
            s.refresh()

    def work() -> int:
        ops = 0
        with proctable.Scanner() as shared:
            for _ in range(n * 5):
                assert shared.refresh().get(sleeper.pid) is not None
                ops += 1
        for _ in range(n):
            s = proctable.Scanner(max_fds=16)
            s.refresh()
            s.refresh()
            s.close()
            ops += 3
        for _ in range(n // 10):
            # Dropped without close(): garbage collection closes its fds.
            proctable.Scanner().refresh()
            ops += 1
        gc.collect()
        return ops

    measured("Scanner refresh / open-close", work, warmup)


def test_watches(sleeper: subprocess.Popen[bytes]) -> None:
    n = 20_000 if SLOW else 2_000
    exits = 1_000 if SLOW else 200

    def warmup() -> None:
        with proctable.ExitWatcher() as w:
            w.watch(sleeper).cancel()
            p = subprocess.Popen(["true"])
            w.watch(p).result(timeout=10)
            p.wait(timeout=10)
        p = subprocess.Popen(["sleep", "5"])
        proctable.terminate(p, grace=5)  # starts the shared watcher's thread
        p.wait(timeout=10)

    def work() -> int:
        ops = 0
        with proctable.ExitWatcher() as w:
            for _ in range(n):
                # A watch, cancelled: its pidfd is closed by the watcher's thread.
                w.watch(sleeper).cancel()
                ops += 1
            for i in range(exits):
                p = subprocess.Popen(["sh", "-c", f"exit {i % 200}"])
                done = w.watch(p, reap=True).result(timeout=10)
                assert done.code == i % 200 and p.returncode == i % 200
                ops += 1
            wait_for(lambda: w.pending == 0)
        for _ in range(n // 20):
            # Whole watchers: a thread, an epoll fd and a wake-up pipe each.
            with proctable.ExitWatcher() as w:
                w.watch(sleeper)
            ops += 1
        for _ in range(exits // 4):
            p = subprocess.Popen(["sleep", "5"])
            st = proctable.terminate(p, grace=5)
            assert st is not None and st.signal == signal.SIGTERM
            p.wait(timeout=10)
            ops += 1
        wait_for(lambda: _default_watcher().pending == 0)
        return ops

    measured("ExitWatcher watches / watchers / terminate", work, warmup)


def test_lineages() -> None:
    n = 1_000 if SLOW else 100
    modes = ["scan", "subreaper", *(["cgroup"] if CGROUP else [])]
    done: dict[str, int] = {}

    def one(mode: str) -> None:
        if mode == "scan":
            p = subprocess.Popen(["sh", "-c", "sleep 300 & wait"])
            try:
                wait_for(lambda: len(proctable.snapshot().children(p.pid)) == 1)
                with proctable.Lineage(p, interval=0.02) as lin:
                    assert len(lin.members()) == 2
            finally:
                if p.returncode is None:
                    p.kill()
                p.wait(timeout=10)
        else:
            with proctable.Lineage.spawn(["sh", "-c", "sleep 300 & wait"], mode=mode,
                                         interval=0.02) as lin:
                wait_for(lambda: len(lin.members()) == 2)
            assert lin.process.wait(timeout=10) is not None
        done[mode] = done.get(mode, 0) + 1

    def warmup() -> None:
        for mode in modes:
            one(mode)

    def work() -> int:
        for i in range(n):
            one(modes[i % len(modes)])
        return n

    measured(f"Lineage ({', '.join(modes)})", work, warmup)
    print(f"lineages per mode: {done}")
    mine = [p for p in proctable.snapshot() if p.ppid == os.getpid()]
    assert not mine, f"children left behind: {mine}"
