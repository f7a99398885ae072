"""The supervisor's timings: close() of many keys, a timeout under another key's
slow teardown, and the asyncio loop's lag during a teardown.

Run: python -m pytest benchmarks/bench_supervise.py --benchmark-enable -s

Every key here runs a shell that ignores SIGTERM, so each teardown needs its whole
grace (1 s) and then SIGKILL: close() of N keys takes about one grace when the
keys are torn down side by side, N graces when they wait on each other.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from typing import Any

import pytest

from proctable import AsyncSupervisor, Supervisor

GRACE = 1.0


def _ignoring(marker: str) -> list[str]:
    return ["sh", "-c", f"trap '' TERM; : > '{marker}'; sleep 60"]


def _wait(pred: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s")
        time.sleep(0.01)


def _supervisor_with(n: int, tmp: str) -> Supervisor:
    sup = Supervisor(grace=GRACE, kill_timeout=3.0)
    markers = [os.path.join(tmp, f"k{i}-{time.monotonic_ns()}") for i in range(n)]
    for i, m in enumerate(markers):
        sup.start(f"k{i}", _ignoring(m))
    _wait(lambda: all(os.path.exists(m) for m in markers))
    return sup


@pytest.mark.parametrize("keys", [4, 50])
def test_close_of_keys_that_need_their_grace(benchmark: Any, keys: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        def setup() -> tuple[tuple[Supervisor], dict[str, Any]]:
            return (_supervisor_with(keys, tmp),), {}

        def close(sup: Supervisor) -> None:
            sup.close()

        benchmark.pedantic(close, setup=setup, rounds=3, iterations=1)
    stats = benchmark.stats.stats
    print(f"\nclose() of {keys} keys, each needing its {GRACE:g}s grace: "
          f"median {stats.median:.2f}s, max {stats.max:.2f}s (the sum would be {keys * GRACE:g}s)")


def test_timeout_lateness_under_a_slow_teardown(benchmark: Any) -> None:
    """Key A's teardown takes 3 s (SIGTERM ignored); key B's 0.5 s timeouts meanwhile."""
    late: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        arrived: dict[int, float] = {}
        cond = threading.Condition()

        def on_event(ev: Any) -> None:
            if ev.kind == "exited" and ev.key == "b":
                with cond:
                    arrived[ev.generation] = time.monotonic()
                    cond.notify_all()

        sup = Supervisor(on_event=on_event, grace=3.0, kill_timeout=3.0)
        try:
            def one() -> None:
                marker = os.path.join(tmp, f"a-{time.monotonic_ns()}")
                sup.start("a", _ignoring(marker))
                _wait(lambda: os.path.exists(marker))
                stopper = threading.Thread(target=sup.stop, args=("a",))
                stopper.start()
                _wait(lambda: sup.state("a") == "stopping")
                for _ in range(4):  # four timeouts of B while A's teardown runs
                    t0 = time.monotonic()
                    sup.start("b", ["sleep", "60"], timeout=0.5)
                    gen = sup.generation("b")
                    with cond:
                        cond.wait_for(lambda g=gen: g in arrived, 30)
                    late.append(arrived[gen] - t0 - 0.5)
                stopper.join(30)

            benchmark.pedantic(one, rounds=3, iterations=1)
        finally:
            sup.close()
    print(f"\ntimeout lateness while another key's teardown runs: max {max(late) * 1000:.0f} ms, "
          f"median {sorted(late)[len(late) // 2] * 1000:.0f} ms over {len(late)} timeouts "
          "(start() returning to the exited event, less the 0.5 s timeout)")


def test_loop_lag_during_a_one_second_teardown(benchmark: Any) -> None:
    worst: list[float] = []

    async def one() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            marker = os.path.join(tmp, "ready")
            async with AsyncSupervisor(grace=1.0, kill_timeout=3.0) as sup:
                await sup.start("slow", _ignoring(marker))
                while not os.path.exists(marker):
                    await asyncio.sleep(0.01)
                loop = asyncio.get_running_loop()
                done = False
                lag = 0.0

                async def tick() -> None:
                    nonlocal lag
                    while not done:
                        t = loop.time()
                        await asyncio.sleep(0.01)
                        lag = max(lag, loop.time() - t - 0.01)

                ticker = asyncio.ensure_future(tick())
                await sup.stop("slow")
                done = True
                await ticker
                worst.append(lag)

    benchmark.pedantic(lambda: asyncio.run(one()), rounds=5, iterations=1)
    print(f"\nasyncio loop lag during a 1 s teardown: worst {max(worst) * 1000:.1f} ms "
          f"over {len(worst)} teardowns")
