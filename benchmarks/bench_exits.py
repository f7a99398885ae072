"""Exit watcher benchmarks (pytest-benchmark; not part of the plain test run).

    python -m pytest benchmarks/bench_exits.py --benchmark-enable -s

Latency from a lost exit (a child nobody waits on, SIGKILLed) to the resolved
future, over 50 exits (target: median under 5 ms); and the watcher thread's CPU
while 1,000 processes are watched and none exits, over ~5 s (target: under 0.1%
of a core). Set PROCTABLE_DISABLE=pidfd to measure the /proc-polling fallback.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from proctable import ExitFuture, ExitWatcher
from proctable.bench.exits import idle_cost

N_EXITS = 50
N_IDLE = 1000
IDLE_SECONDS = 5.0


@pytest.fixture
def watcher() -> Iterator[ExitWatcher]:
    with ExitWatcher() as w:
        yield w


def test_lost_exit_latency(benchmark: Any, watcher: ExitWatcher) -> None:
    started: list[subprocess.Popen[bytes]] = []

    def setup() -> tuple[tuple[subprocess.Popen[bytes], ExitFuture], dict[str, Any]]:
        p = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
        started.append(p)
        return (p, watcher.watch(p)), {}

    def lost_exit(p: subprocess.Popen[bytes], fut: ExitFuture) -> None:
        os.kill(p.pid, signal.SIGKILL)  # nobody waits on p: only the watcher sees it
        fut.result(timeout=10)

    try:
        benchmark.pedantic(lost_exit, setup=setup, rounds=N_EXITS, iterations=1)
    finally:
        for p in started:
            if p.returncode is None:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(timeout=10)
    stats = getattr(benchmark, "stats", None)
    if stats is not None and getattr(stats, "stats", None) is not None:
        data = [x * 1e3 for x in stats.stats.data]
        median, worst = statistics.median(data), max(data)
        benchmark.extra_info.update(median_ms=median, max_ms=worst, n=len(data))
        print(f"\nlost exit -> resolved future over {len(data)} exits: "
              f"median {median:.3f} ms, max {worst:.3f} ms (target: median < 5 ms)")


def test_idle_cpu_with_a_thousand_watches(benchmark: Any) -> None:
    result: dict[str, Any] = benchmark.pedantic(
        idle_cost, args=(N_IDLE, IDLE_SECONDS), rounds=1, iterations=1)
    benchmark.extra_info.update(result)
    print(f"\nidle watcher, {result['processes']} processes watched for "
          f"{result['seconds']:.1f} s: {result['cpu_seconds'] * 1e3:.3f} ms CPU = "
          f"{result['cpu_percent_of_core']:.5f}% of a core, {result['wakeups']} wake-ups "
          "(target: < 0.1%)")
    assert result["resolved_while_idle"] == 0
