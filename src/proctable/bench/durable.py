"""What durable sessions cost: re-adoption, an idle detached session, a replay.

- re-adoption of N sessions (half pty shells with a job running, half pipes
  writing lines the whole time): the time from ``Supervisor(state_dir=...)`` to
  the last ``adopted`` event, beside the floor of the same run (connecting to each
  keeper's socket and reading its hello, nothing else);
- a detached session over some idle seconds: the RSS and PSS of its two helpers
  and the CPU they used, beside today's per-run helper (mirror and reaper) of a
  plain lineage in the same run;
- ``tail(since=0)`` of a full ring: the replay rate, beside reading the same
  number of bytes from a pipe in this process.

Every process started here is ended here.

    python -m proctable.bench.durable [--sessions 100] [--idle 60]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Optional

from ..lineage._session import connect
from ..supervise import Supervisor
from ..supervise._durable import StateDir
from ..table import read
from .spawn import helper_memory

__all__ = ["durable_bench", "idle_bench", "readopt_bench", "render", "replay_bench"]


# A line every 10 ms in one process: a shell loop forks a sleep for each line, and
# 50 of them (5,000 forks a second) slowed this 2-CPU machine to a crawl.
_WRITER = """import sys, time
while True:
    sys.stdout.write("line\\n")
    sys.stdout.flush()
    time.sleep(0.01)
"""


def _state() -> str:
    d = tempfile.mkdtemp(prefix="proctable-bench-")
    return os.path.join(d, "state")


def _cleanup(state: str, sup: Optional[Supervisor]) -> None:
    """End every session the bench left (the live supervisor's, then any that a
    detach or a failure left in the directory), and only then remove the directory:
    a session whose directory is gone has nobody left to end it."""
    try:
        if sup is not None:
            sup.close()
        Supervisor(state_dir=state, on_adopt="stop").close()
    finally:
        shutil.rmtree(os.path.dirname(state), ignore_errors=True)


def readopt_bench(sessions: int = 100, rounds: int = 3) -> dict[str, Any]:
    """Re-adopt ``sessions`` sessions, ``rounds`` times; medians in ms."""
    state = _state()
    half = sessions // 2
    adopt: list[float] = []
    floor: list[float] = []
    sup: Optional[Supervisor] = None
    try:
        sup = Supervisor(state_dir=state)
        for i in range(half):
            sup.start(f"shell{i}", ["sh"], pty=(24, 80))
            sup.write(f"shell{i}", b"sleep 600 &\n")
        for i in range(sessions - half):
            sup.start(f"pipe{i}", [sys.executable, "-S", "-c", _WRITER], output="events")
        for _ in range(rounds):
            sup.detach()
            # The floor: a connection and a hello per keeper, nothing else.
            st = StateDir(state)
            names = [n[:-5] for n in os.listdir(st.sessions_fd) if n.endswith(".sock")]
            t0 = time.perf_counter()
            conns = [connect(st.sessions_fd, n, None) for n in names]
            floor.append(time.perf_counter() - t0)
            for c in conns:
                if c.input_fd is not None:
                    os.close(c.input_fd)
                c.detach()
                c.close()
            st.close()
            seen = threading.Event()
            count = [0]

            def on_event(ev: Any, count: list[int] = count, seen: threading.Event = seen
                         ) -> None:
                if ev.kind == "adopted":
                    count[0] += 1
                    if count[0] == sessions:
                        seen.set()

            t0 = time.perf_counter()
            sup = Supervisor(on_event=on_event, state_dir=state)
            seen.wait(60)
            adopt.append(time.perf_counter() - t0)
    finally:
        _cleanup(state, sup)
    return {"sessions": sessions, "adopt_ms": round(statistics.median(adopt) * 1000, 1),
            "floor_ms": round(statistics.median(floor) * 1000, 1),
            "per_session_ms": round(statistics.median(adopt) * 1000 / sessions, 3)}


def _kib(pid: int, key: str, path: str = "status") -> Optional[int]:
    try:
        with open(f"/proc/{pid}/{path}") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_bench(seconds: float = 60.0) -> dict[str, Any]:
    """A detached session (a pty shell, idle) over ``seconds``: its helpers' memory
    and CPU; and a plain lineage's helpers' memory in the same run."""
    state = _state()
    sup: Optional[Supervisor] = None
    try:
        sup = Supervisor(state_dir=state)
        sup.start("idle", ["sh"], pty=(24, 80))
        lin = sup.lineage("idle")
        assert lin is not None and lin.root is not None
        row = read(lin.root.pid)
        keeper = row.ppid if row is not None else 0
        krow = read(keeper)
        session = krow.ppid if krow is not None else 0
        sup.detach()
        pids = [keeper, session]
        cpu0 = sum(_cpu_seconds(p) for p in pids)
        time.sleep(seconds)
        cpu = sum(_cpu_seconds(p) for p in pids) - cpu0
        rss = sum(_kib(p, "VmRSS") or 0 for p in pids)
        pss = sum(_kib(p, "Pss", "smaps_rollup") or 0 for p in pids)
        sup = Supervisor(state_dir=state)
        per_run = helper_memory("auto")
    finally:
        _cleanup(state, sup)
    return {"idle_seconds": seconds, "helpers_cpu_s": round(cpu, 3),
            "helpers_rss_mib": round(rss / 1024, 2), "helpers_pss_mib": round(pss / 1024, 2),
            "plain_lineage_helpers": per_run}


def replay_bench(ring: int = 8 << 20, rounds: int = 5) -> dict[str, Any]:
    """tail(since=0) of a full ring of ``ring`` bytes: MB/s, beside a pipe's read."""
    state = _state()
    rates: list[float] = []
    pipe_rates: list[float] = []
    try:
        with Supervisor(state_dir=state, ring_size=ring) as sup:
            sup.start("w", ["sh", "-c", f"head -c {ring} /dev/zero; sleep 600"],
                      output="events")
            deadline = time.monotonic() + 30
            while sup.tail("w", since=0).end < ring and time.monotonic() < deadline:
                time.sleep(0.05)
            for _ in range(rounds):
                t0 = time.perf_counter()
                got = sup.tail("w", ring, since=0)
                rates.append(len(got.data) / (time.perf_counter() - t0) / 1e6)
                r, w = os.pipe()
                done = threading.Thread(target=_write_all, args=(w, ring))
                t0 = time.perf_counter()
                done.start()
                n = 0
                while True:
                    b = os.read(r, 1 << 16)
                    if not b:
                        break
                    n += len(b)
                pipe_rates.append(n / (time.perf_counter() - t0) / 1e6)
                done.join()
                os.close(r)
    finally:
        _cleanup(state, None)
    return {"ring_bytes": ring, "replay_mb_s": round(statistics.median(rates)),
            "pipe_mb_s": round(statistics.median(pipe_rates))}


def _write_all(fd: int, n: int) -> None:
    chunk = b"\0" * (1 << 16)
    while n > 0:
        n -= os.write(fd, chunk[:min(n, len(chunk))])
    os.close(fd)


def durable_bench(sessions: int = 100, idle: float = 60.0) -> dict[str, Any]:
    return {"readopt": readopt_bench(sessions), "idle": idle_bench(idle),
            "replay": replay_bench(), "load": os.getloadavg()[0]}


def render(data: dict[str, Any]) -> str:
    r, i, p = data["readopt"], data["idle"], data["replay"]
    pr = i["plain_lineage_helpers"]
    return "\n".join([
        f"durable sessions (load {data['load']:.1f})",
        f"  re-adoption of {r['sessions']} sessions: {r['adopt_ms']} ms to the last adopted "
        f"({r['per_session_ms']} ms each); connect + hello alone: {r['floor_ms']} ms",
        f"  a detached idle session over {i['idle_seconds']:g} s: helpers' CPU "
        f"{i['helpers_cpu_s']} s, RSS {i['helpers_rss_mib']} MiB, PSS "
        f"{i['helpers_pss_mib']} MiB (a plain lineage's {pr['processes']} helpers: RSS "
        f"{pr['rss_kib'] / 1024:.2f} MiB, PSS {pr['pss_kib'] / 1024:.2f} MiB)",
        f"  tail(since=0) of {p['ring_bytes'] >> 20} MiB: {p['replay_mb_s']} MB/s "
        f"(a pipe in this process: {p['pipe_mb_s']} MB/s)"])


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m proctable.bench.durable")
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--idle", type=float, default=60.0)
    a = ap.parse_args(argv)
    # SIGTERM (timeout(1), a CI's stop) ends the bench through its cleanup: the
    # default action would leave every durable session it started running.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(1))
    print(render(durable_bench(a.sessions, a.idle)))


if __name__ == "__main__":
    main()
