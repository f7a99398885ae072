"""The wire (issue 31): one key's output through ``proctable serve`` to the Node
client, lossless, beside Node's own ``child_process`` reading the same command in the
same Node process (not a test).

    python -m pytest benchmarks/bench_wire.py --benchmark-enable -s

Figures (proctable.bench.wire), rounds interleaved with the order rotated: ``head -c
200M /dev/zero`` and 100 MiB of ``seq`` to the client in clients/node over stdio and
over a Unix socket with binary output frames (what ``hello`` asks for by default) and
over stdio in base64 (the path before them): MB/s delivered, bytes lost (must be 0),
the sidecar's and the client's CPU per 200 MiB, and the rate's ratio to Node's
``child_process`` (goal: at least half of it); then 50 keys writing 1,000 numbered
lines a second each for 5 s, every line of every key checked. ``PROCTABLE_BENCH_ROUNDS``
sets the rounds (default 3). The same table: ``proctable bench --wire``; start ->
created / exited beside Node's spawn is ``bench_latency.py``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from proctable.bench.wire import render, wire_bench

CLIENT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "clients", "node", "index.js")
ROUNDS = int(os.environ.get("PROCTABLE_BENCH_ROUNDS", "3"))


def test_the_wire(benchmark: Any) -> None:
    data = benchmark.pedantic(wire_bench, kwargs={"rounds": ROUNDS, "client": CLIENT},
                              rounds=1, iterations=1)
    if "skipped" in data:
        pytest.skip(data["skipped"])
    benchmark.extra_info.update(data)
    print("\n" + render(data))
    assert all(r["whole"] for r in data["rows"]), "output lost on the wire"
    m = data["many_keys"]
    assert m["sidecar"]["keys_whole"] == m["keys"], "a key's lines were not delivered whole"
