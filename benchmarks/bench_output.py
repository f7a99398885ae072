"""Owned output: throughput of one key through output events, beside a plain
``Popen`` + ``read()`` loop in the same run; and 50 keys writing 1,000 lines a
second each under ``AsyncSupervisor`` (dropped bytes, lines lost, loop lag, CPU).
The measurements are ``proctable.bench.output``'s (``proctable bench --output``).

Run: python -m pytest benchmarks/bench_output.py --benchmark-enable -s -q
(``PROCTABLE_BENCH_MB`` sets the megabytes of the throughput run, default 512;
``PROCTABLE_BENCH_SECONDS`` the length of the 50-key run, default 5).
"""

from __future__ import annotations

import os
from typing import Any

from proctable.bench.output import many_keys, render, throughput

MB = int(os.environ.get("PROCTABLE_BENCH_MB", "512"))
SECONDS = float(os.environ.get("PROCTABLE_BENCH_SECONDS", "5"))


def test_owned_output(benchmark: Any) -> None:
    data: dict[str, Any] = {}

    def run() -> None:
        data["throughput"] = throughput(MB)
        data["many_keys"] = many_keys(50, 1000, SECONDS)

    benchmark.pedantic(run, rounds=1)
    print("\n" + render(data))
    m = data["many_keys"]
    assert m["lines"] == m["want"] and m["dropped"] == 0
