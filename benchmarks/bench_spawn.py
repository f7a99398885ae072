"""What a lineage costs per command, side by side with a plain Popen (not a test).

    python -m pytest benchmarks/bench_spawn.py --benchmark-enable -s

Figures (proctable.bench.spawn): spawn + wait + teardown of ``true`` per mode against
``Popen(["true"]).wait()`` interleaved in the same run (goal: 2 ms added or less);
RSS and PSS of the helper processes beside a command (goal: 1 MiB or less);
``Supervisor.start`` -> ``exited`` of ``true`` (goal: 3 ms or less); ``import
proctable`` and a one-shot ``proctable ps`` against psutil and ``ps -e``.
The same table: ``proctable bench --spawn``.
"""

from __future__ import annotations

from typing import Any

from proctable.bench.spawn import render, spawn_bench


def test_spawn_costs(benchmark: Any) -> None:
    data = benchmark.pedantic(spawn_bench, kwargs={"rounds": 30}, rounds=1, iterations=1)
    benchmark.extra_info.update(data)
    print("\n" + render(data))
