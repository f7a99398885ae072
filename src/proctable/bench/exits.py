"""Measurements of the exit watcher, for benchmarks/ and ``proctable bench``.

Two figures: the latency from a lost exit (a child nobody waits on, killed) to
its resolved future, and the CPU the watcher's thread uses while many processes
are watched and none exits. Every process started here is killed and reaped here.
"""

from __future__ import annotations

import os
import resource
import signal
import statistics
import subprocess
import time
from typing import Any, Optional

from ..exits import ExitFuture, ExitWatcher

__all__ = ["exits_bench", "idle_cost", "lost_exit_latency", "thread_cpu_seconds"]


def thread_cpu_seconds(tid: int) -> float:
    """CPU time of one thread of this process: schedstat (ns) where there is one, else stat."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    with open(f"/proc/self/task/{tid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _switches(tid: int) -> Optional[int]:
    """Context switches of a thread: each wake-up of a sleeping thread is one."""
    try:
        with open(f"/proc/self/task/{tid}/status") as f:
            n = 0
            for line in f:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    n += int(line.split()[1])
            return n
    except OSError:
        return None


def _sleepers(n: int) -> list[subprocess.Popen[bytes]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = n + 256
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return [subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL) for _ in range(n)]


def _reap_all(ps: list[subprocess.Popen[bytes]]) -> None:
    for p in ps:
        if p.returncode is None:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in ps:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass


def lost_exit_latency(n_exits: int = 50, watcher: Optional[ExitWatcher] = None) -> dict[str, Any]:
    """Seconds from kill() of a child nobody waits on to its future resolving, n_exits times."""
    own = watcher is None
    w = ExitWatcher() if watcher is None else watcher
    lat: list[float] = []
    sources: dict[str, int] = {}
    ps: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n_exits):
            p = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
            ps.append(p)
            fut = w.watch(p)
            stamp: list[float] = []

            def seen(_f: object, stamp: list[float] = stamp) -> None:
                stamp.append(time.perf_counter())

            fut.add_done_callback(seen)
            t0 = time.perf_counter()
            os.kill(p.pid, signal.SIGKILL)
            fut.result(timeout=10)
            lat.append(stamp[0] - t0)
            src = str(fut.source)
            sources[src] = sources.get(src, 0) + 1
            p.wait(timeout=10)  # the runtime's own wait, after the watcher answered
    finally:
        _reap_all(ps)
        if own:
            w.close()
    return {
        "n": len(lat),
        "median_ms": statistics.median(lat) * 1e3,
        "max_ms": max(lat) * 1e3,
        "min_ms": min(lat) * 1e3,
        "sources": sources,
    }


def idle_cost(n_idle: int = 1000, seconds: float = 5.0) -> dict[str, Any]:
    """CPU of the watcher's thread while n_idle processes are watched and none exits."""
    ps = _sleepers(n_idle)
    try:
        with ExitWatcher() as w:
            futs: list[ExitFuture] = [w.watch(p) for p in ps]
            tid = w.thread_id
            assert tid is not None
            time.sleep(0.2)  # let the start-up settle
            cpu0, sw0, t0 = thread_cpu_seconds(tid), _switches(tid), time.monotonic()
            time.sleep(seconds)
            cpu1, sw1, t1 = thread_cpu_seconds(tid), _switches(tid), time.monotonic()
            resolved = sum(f.done() for f in futs)
            threads = len(os.listdir("/proc/self/task"))
    finally:
        _reap_all(ps)
    wall = t1 - t0
    return {
        "processes": n_idle,
        "seconds": wall,
        "cpu_seconds": cpu1 - cpu0,
        "cpu_percent_of_core": 100.0 * (cpu1 - cpu0) / wall,
        "wakeups": None if sw0 is None or sw1 is None else sw1 - sw0,
        "resolved_while_idle": resolved,
        "threads_in_process": threads,
    }


def exits_bench(n_exits: int = 50, n_idle: int = 1000, idle_seconds: float = 5.0) -> dict[str, Any]:
    """Both figures, as one dict (what ``proctable bench`` prints)."""
    w = ExitWatcher()
    try:
        features = w.features._asdict()
        latency = lost_exit_latency(n_exits, w)
    finally:
        w.close()
    return {"features": features, "latency": latency,
            "idle": idle_cost(n_idle, idle_seconds)}
