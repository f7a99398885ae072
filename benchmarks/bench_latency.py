"""start -> created and -> exited of ``true``, beside Node's and Python's own spawn
(not a test).

    python -m pytest benchmarks/bench_latency.py --benchmark-enable -s

Figures (proctable.bench.latency), medians and ranges of 50, rounds interleaved, with
the load average: over ``proctable serve`` from the Node client in clients/node
(``start`` to the ``created`` and ``exited`` notifications and to the response) beside
Node's own ``child_process.spawn("true")`` in the same Node process (goal: created
within 1 ms of Node's ``spawn`` event); in Python, ``Supervisor.start`` to ``created``
and ``exited`` beside a bare ``Popen(["true"])``. The same table:
``proctable bench --latency``.
"""

from __future__ import annotations

import os
from typing import Any

from proctable.bench.latency import latency_bench, render

CLIENT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "clients", "node", "index.js")


def test_start_latency(benchmark: Any) -> None:
    data = benchmark.pedantic(latency_bench, kwargs={"rounds": 50, "client": CLIENT},
                              rounds=1, iterations=1)
    benchmark.extra_info.update(data)
    print("\n" + render(data))
