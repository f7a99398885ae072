"""What `proctable top` costs (pytest-benchmark; not part of the plain test run).

    python -m pytest benchmarks/bench_top.py --benchmark-enable -s

With 2,000 extra sleeping processes, `proctable top` at 1 Hz, on a pseudo-terminal
(redrawing in place, as a person sees it) and in batch mode: its process CPU
time over 30 s, in % of one core.
"""

from __future__ import annotations

from typing import Any

import pytest

from proctable.bench.top import top_cost

HOST_PROCS = 2000
SECONDS = 30.0


@pytest.mark.parametrize("batch", [False, True], ids=["terminal", "batch"])
def test_top_cpu_at_1hz(benchmark: Any, batch: bool) -> None:
    r: dict[str, Any] = benchmark.pedantic(
        top_cost, kwargs={"procs": HOST_PROCS, "seconds": SECONDS, "interval": 1.0,
                          "batch": batch}, rounds=1, iterations=1)
    benchmark.extra_info.update(r)
    print(f"\nproctable top ({r['mode']}), {r['host_processes']:,} processes, every "
          f"{r['interval']:g} s: {r['cpu_seconds'] * 1e3:.0f} ms CPU in {r['seconds']:.1f} s = "
          f"{r['cpu_percent_of_core']:.2f}% of a core (load {r['load'][0]:.2f})")
    assert r["cpu_percent_of_core"] < 10.0
