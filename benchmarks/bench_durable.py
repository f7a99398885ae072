"""What durable sessions cost (not a test).

    python -m pytest benchmarks/bench_durable.py --benchmark-enable -s

Figures (proctable.bench.durable): the time from ``Supervisor(state_dir=...)`` to
the last ``adopted`` of 100 sessions (50 pty shells with a job, 50 pipes writing
all the time; goal: under 200 ms), beside connecting to each keeper and reading
its hello alone; a detached idle session's helpers over 60 s (CPU, RSS, PSS), beside
a plain lineage's helpers (goal: at most 0.5 MiB more); the replay rate of
``tail(since=0)`` of an 8 MiB ring, beside a pipe. The same table:
``python -m proctable.bench.durable``.
"""

from __future__ import annotations

from typing import Any

from proctable.bench.durable import durable_bench, render


def test_durable_costs(benchmark: Any) -> None:
    data = benchmark.pedantic(durable_bench, kwargs={"sessions": 100, "idle": 60.0},
                              rounds=1, iterations=1)
    benchmark.extra_info.update(data)
    print("\n" + render(data))
