"""Measurements of lineages, for benchmarks/ and ``proctable bench``.

Two figures, with ``procs`` unrelated sleeping processes on the host:

- the sampler thread's CPU while a lineage of ``members`` processes is tracked at
  ``interval`` (default 50 ms), over ``seconds`` (targets: < 0.6% of a core for
  cgroup and subreaper, < 1% attached (scan), whatever the host's process count),
  and the shared event hub thread's beside it;
- the wall time of ``Lineage.terminate()`` for ``teardown_members`` processes that
  exit on SIGTERM, beside the time those processes take to exit when signalled
  directly (target: < 100 ms beyond it).

Every process started here is ended here (lineages are torn down; the baseline's
processes are signalled by pidfd and reaped).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from typing import Any, Optional

from .._fdwait import readable
from ..lineage import Lineage, _hub
from ..table import snapshot

__all__ = ["lineage_bench", "own_exit_seconds", "sampler_cost", "teardown_cost"]


def _fan(n: int) -> list[str]:
    """A shell and n - 1 sleeping children: n processes."""
    return ["sh", "-c", f"i=1; while [ $i -lt {n} ]; do sleep 600 & i=$((i+1)); done; "
            "echo up; wait"]


def _ready(lin: Lineage, out: Any, n: int, timeout: float = 30.0) -> None:
    fd = out.fileno()
    r = readable([fd], timeout)
    if not r or not os.read(fd, 64).startswith(b"up"):
        raise RuntimeError("the lineage's shell did not start its children")
    deadline = time.monotonic() + timeout
    while True:
        names = [p.name for p in lin.members()]
        if len(names) == n and names.count("sleep") == n - 1:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"expected {n} members, found {len(names)}")
        time.sleep(0.01)


def _thread_cpu(ident: Optional[int]) -> float:
    if ident is None:
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except OSError:  # the thread ended meanwhile
        return 0.0


def _hub_ident() -> Optional[int]:
    hub = _hub._hub
    return None if hub is None else hub.thread.ident


def sampler_cost(members: int = 20, seconds: float = 5.0, interval: float = 0.05,
                 mode: str = "auto", attach: bool = False) -> dict[str, Any]:
    """The sampler thread's CPU over ``seconds`` with a lineage of ``members``
    (spawned in ``mode``, or, with ``attach``, a running process tree attached to,
    which is scan mode), and beside it the event hub thread's CPU (shared by every
    lineage of the process; here there is one)."""
    held: Optional[subprocess.Popen[bytes]] = None
    if attach:
        held = subprocess.Popen(_fan(members), stdout=subprocess.PIPE)
        lin = Lineage(held, interval=interval)
        out = held.stdout
    else:
        lin = Lineage.spawn(_fan(members), interval=interval, mode=mode, stdout=subprocess.PIPE)
        out = lin.process.stdout
    try:
        _ready(lin, out, members)
        thread = lin.sampler_thread
        ident = thread.ident if thread is not None else None
        hub = _hub_ident()
        n0, c0, h0, t0 = lin.samples, _thread_cpu(ident), _thread_cpu(hub), time.monotonic()
        time.sleep(seconds)
        n1, c1, h1, t1 = lin.samples, _thread_cpu(ident), _thread_cpu(hub), time.monotonic()
    finally:
        lin.terminate(grace=2.0, kill_timeout=2.0)
        if out is not None:
            out.close()
        if held is not None:
            held.wait(timeout=10)
    cpu, wall, samples = c1 - c0, t1 - t0, n1 - n0
    return {
        "mode": "attach (scan)" if attach else lin.mode,
        "members": members,
        "interval": interval,
        "seconds": wall,
        "samples": samples,
        "cpu_seconds": cpu,
        "cpu_percent_of_core": 100.0 * cpu / wall,
        "us_per_sample": 1e6 * cpu / samples if samples else None,
        "events_cpu_percent_of_core": 100.0 * (h1 - h0) / wall,
        "events": hub is not None,
    }


def teardown_cost(members: int = 100, mode: str = "auto", grace: float = 5.0) -> dict[str, Any]:
    """Wall time of terminate() for ``members`` processes that exit on SIGTERM."""
    lin = Lineage.spawn(_fan(members), mode=mode, stdout=subprocess.PIPE)
    try:
        _ready(lin, lin.process.stdout, members)
        t0 = time.monotonic()
        report = lin.terminate(grace=grace, kill_timeout=5.0)
        wall = time.monotonic() - t0
    finally:
        if not lin.closed:
            with contextlib.suppress(Exception):
                lin.terminate(grace=0.5, kill_timeout=2.0)
        if lin.process.stdout is not None:
            lin.process.stdout.close()
    last = max((m.seconds or 0.0) for m in report.members)
    return {
        "mode": report.mode,
        "members": len(report.members),
        "ends": {e.value: len(report.by_end(e)) for e in type(report.members[0].ended)}
        if report.members else {},
        "teardown_seconds": wall,
        "last_end_seen_seconds": last,
    }


def own_exit_seconds(n: int = 100) -> float:
    """How long n sleeping processes take to exit when signalled directly (no lineage):
    SIGTERM through a pidfd each, until every pidfd polls readable."""
    sh = subprocess.Popen(_fan(n), stdout=subprocess.PIPE)
    fds: list[int] = []
    try:
        assert sh.stdout is not None
        r = readable([sh.stdout.fileno()], 30)
        if not r:
            raise RuntimeError("baseline shell did not start")
        deadline = time.monotonic() + 30
        while len(snapshot().descendants(sh.pid)) < n - 1:
            if time.monotonic() > deadline:
                raise RuntimeError("baseline children did not start")
            time.sleep(0.01)
        pids = [sh.pid] + [p.pid for p in snapshot().descendants(sh.pid)]
        fds = [os.pidfd_open(p) for p in pids]
        poll = select.poll()
        for fd in fds:
            poll.register(fd, select.POLLIN)
        t0 = time.monotonic()
        for fd in fds:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGTERM)
        left = set(fds)
        while left and time.monotonic() - t0 < 10:
            for fd, _ in poll.poll(100):
                if fd in left:
                    left.discard(fd)
                    poll.unregister(fd)
        took = time.monotonic() - t0
        for fd in left:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        return took
    finally:
        for fd in fds:
            os.close(fd)
        if sh.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                sh.kill()
        sh.wait(timeout=10)
        sh.stdout.close()  # type: ignore[union-attr]


def lineage_bench(procs: int = 1000, members: int = 20, teardown_members: int = 100,
                  seconds: float = 5.0, interval: float = 0.05, mode: str = "auto",
                  compare_scan: bool = True) -> dict[str, Any]:
    """Both figures with ``procs`` unrelated sleeping processes on the host; with
    ``compare_scan``, the sampler cost of the scan backend too (what auto avoids)."""
    from ._sleepers import Sleepers  # noqa: PLC0415 - the bench helpers load only here

    ctx: Any = Sleepers(procs) if procs else contextlib.nullcontext()
    with ctx:
        host = len(snapshot())
        out: dict[str, Any] = {"host_processes": host}
        out["sampler"] = sampler_cost(members, seconds, interval, mode)
        if compare_scan:
            out["sampler_scan"] = sampler_cost(members, min(seconds, 2.0), interval, "scan")
            out["sampler_attach"] = sampler_cost(members, min(seconds, 2.0), interval,
                                                 attach=True)
        own = own_exit_seconds(teardown_members)
        td = teardown_cost(teardown_members, mode)
        td["own_exit_seconds"] = own
        td["beyond_own_exit_seconds"] = td["teardown_seconds"] - own
        out["teardown"] = td
    return out


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    print(json.dumps(lineage_bench(procs=n), indent=2))
