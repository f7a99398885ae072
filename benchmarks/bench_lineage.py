"""Lineage benchmarks (pytest-benchmark; not part of the plain test run).

    python -m pytest benchmarks/bench_lineage.py --benchmark-enable -s [--bench-procs 1000,3000]

With 1,000 and 3,000 unrelated sleeping processes on the host (``--bench-procs``):

- the sampler thread's CPU with a 24-member lineage at the default 50 ms interval,
  over ~5 s, per backend: ``auto`` (cgroup where writable), ``subreaper``, ``scan``
  (spawned) and attached (``Lineage(popen)``: scan; also without the proc
  connector, when every tick walks the members' children files). Targets: cgroup and subreaper
  < 0.6% of a core, attached < 1%, and none growing with the host. The shared event
  hub thread's CPU is printed beside it (it reads every process fork on the host
  while a scan-mode lineage follows forks, so it grows with the host's fork rate,
  not its process count);
- ``terminate()`` of 100 members that exit on SIGTERM (target: < 100 ms beyond the
  time they take to exit when signalled directly).

CPU is thread CPU time (``pthread_getcpuclockid``), which load on the host does not
inflate much; these are figures, never pass/fail timings of the test suite.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest

from proctable import _pidfd
from proctable.bench import Sleepers
from proctable.bench.lineage import own_exit_seconds, sampler_cost, teardown_cost

MEMBERS = 24
SECONDS = 5.0
TEARDOWN_MEMBERS = 100


def _report(benchmark: Any, sleepers: Optional[Sleepers], r: dict[str, Any]) -> None:
    benchmark.extra_info.update(r)
    host = sleepers.n if sleepers is not None else 0
    print(f"\nsampler, {host:,} extra processes: {r['mode']}, {r['members']} members, "
          f"{r['samples']} samples in {r['seconds']:.1f} s: {r['cpu_seconds'] * 1e3:.1f} ms CPU"
          f" = {r['cpu_percent_of_core']:.3f}% of a core ({r['us_per_sample']:.0f} us a "
          f"sample); event hub thread {r['events_cpu_percent_of_core']:.3f}%"
          + ("" if r["events"] else " (no events here)"))


@pytest.mark.parametrize("mode", ["auto", "subreaper", "scan", "attach", "attach-no-events"])
def test_sampler_cpu(benchmark: Any, sleepers: Optional[Sleepers], mode: str,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    attach = mode.startswith("attach")
    if mode.endswith("no-events"):  # as without the proc connector: a walk every tick
        monkeypatch.setenv(_pidfd.DISABLE_ENV, "proc_connector")
    r: dict[str, Any] = benchmark.pedantic(
        sampler_cost, args=(MEMBERS, SECONDS, 0.05, "scan" if attach else mode, attach),
        rounds=1, iterations=1)
    _report(benchmark, sleepers, r)


def test_teardown_of_100_members(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
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
