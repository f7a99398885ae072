"""Lineage benchmarks (pytest-benchmark; not part of the plain test run).

    python -m pytest benchmarks/bench_lineage.py --benchmark-enable -s

With 1,000 unrelated sleeping processes on the host:

- the sampler thread's CPU with a 20-member lineage at the default 50 ms interval,
  over ~5 s, in ``auto`` mode (target: < 1% of a core); the ``scan`` backend beside
  it, for what the structural backends save;
- ``terminate()`` of 100 members that exit on SIGTERM (target: < 100 ms beyond the
  time they take to exit when signalled directly).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from proctable.bench import Sleepers
from proctable.bench.lineage import own_exit_seconds, sampler_cost, teardown_cost

HOST_PROCS = 1000
MEMBERS = 20
SECONDS = 5.0
TEARDOWN_MEMBERS = 100


@pytest.fixture(scope="module")
def host() -> Iterator[Sleepers]:
    """1,000 unrelated sleeping processes, stopped by pid afterwards."""
    with Sleepers(HOST_PROCS) as s:
        yield s


def _report(benchmark: Any, name: str, r: dict[str, Any]) -> None:
    benchmark.extra_info.update(r)
    print(f"\n{name}: {r['mode']}, {r['members']} members, {r['samples']} samples in "
          f"{r['seconds']:.1f} s: {r['cpu_seconds'] * 1e3:.1f} ms CPU = "
          f"{r['cpu_percent_of_core']:.3f}% of a core ({r['us_per_sample']:.0f} us a sample)")


def test_sampler_cpu_auto(benchmark: Any, host: Sleepers) -> None:
    r: dict[str, Any] = benchmark.pedantic(
        sampler_cost, args=(MEMBERS, SECONDS, 0.05, "auto"), rounds=1, iterations=1)
    _report(benchmark, "sampler (auto)", r)
    assert r["cpu_percent_of_core"] < 1.0


def test_sampler_cpu_subreaper(benchmark: Any, host: Sleepers) -> None:
    r: dict[str, Any] = benchmark.pedantic(
        sampler_cost, args=(MEMBERS, SECONDS, 0.05, "subreaper"), rounds=1, iterations=1)
    _report(benchmark, "sampler (subreaper, what a user without root gets)", r)
    assert r["cpu_percent_of_core"] < 1.0


def test_sampler_cpu_scan_for_comparison(benchmark: Any, host: Sleepers) -> None:
    r: dict[str, Any] = benchmark.pedantic(
        sampler_cost, args=(MEMBERS, 2.0, 0.05, "scan"), rounds=1, iterations=1)
    _report(benchmark, "sampler (scan: a full table every tick)", r)


def test_teardown_of_100_members(benchmark: Any, host: Sleepers) -> None:
    own = own_exit_seconds(TEARDOWN_MEMBERS)
    r: dict[str, Any] = benchmark.pedantic(
        teardown_cost, args=(TEARDOWN_MEMBERS, "auto"), rounds=1, iterations=1)
    r["own_exit_seconds"] = own
    r["beyond_own_exit_seconds"] = r["teardown_seconds"] - own
    benchmark.extra_info.update(r)
    print(f"\nteardown ({r['mode']}) of {r['members']} members: "
          f"{r['teardown_seconds'] * 1e3:.1f} ms; signalled directly they take "
          f"{own * 1e3:.1f} ms to exit: {r['beyond_own_exit_seconds'] * 1e3:.1f} ms beyond "
          f"(target: < 100 ms); ends {r['ends']}")
    assert r["ends"]["term"] == TEARDOWN_MEMBERS
    assert r["beyond_own_exit_seconds"] < 0.1
