"""What owned output costs, beside a plain ``Popen`` + ``read()`` loop in one run.

- throughput of one key through ``output`` events (``head -c N /dev/zero``),
  and of the same command read by a plain ``Popen`` + ``read()`` loop;
- 50 keys writing 1,000 lines a second each under ``AsyncSupervisor``: lines
  lost, bytes dropped, the loop's lag and this process's CPU while they all
  write (and the lag with the 50 starts and teardowns).

Every process started here is ended here (the supervisors are closed).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from typing import Any

from ..supervise import AsyncSupervisor, Event, Supervisor

__all__ = ["many_keys", "output_bench", "render", "throughput"]

_LINES = ("import sys, time\n"
          "rate, seconds = int(sys.argv[1]), float(sys.argv[2])\n"
          "line = 'line %08d of a chatty child, about sixty bytes long....\\n'\n"
          "w = sys.stdout\n"
          "n, t0, total = 0, time.monotonic(), int(rate * seconds)\n"
          "while n < total:\n"
          "    due = min(total, int((time.monotonic() - t0) * rate))\n"
          "    while n < due:\n"
          "        w.write(line % n)\n"
          "        n += 1\n"
          "    w.flush()\n"
          "    time.sleep(0.01)\n")


def _plain(mb: int) -> float:
    t = time.perf_counter()
    with subprocess.Popen(["head", "-c", str(mb << 20), "/dev/zero"],
                          stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        fd = p.stdout.fileno()
        got = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            got += len(chunk)
    if got != mb << 20:
        raise RuntimeError(f"the plain reader got {got} bytes of {mb << 20}")
    return time.perf_counter() - t


def _events(mb: int) -> tuple[float, int, int]:
    done = threading.Event()
    count = {"bytes": 0, "events": 0, "dropped": 0}

    def on_event(ev: Event) -> None:
        if ev.kind == "output":
            count["bytes"] += len(ev.data or b"")
            count["events"] += 1
            count["dropped"] += ev.dropped
        elif ev.kind == "exited":
            done.set()

    with Supervisor(on_event=on_event) as sup:
        t = time.perf_counter()
        sup.start("bulk", ["head", "-c", str(mb << 20), "/dev/zero"], output="events")
        if not done.wait(600):
            raise RuntimeError("the writer did not end within 600 s")
        took = time.perf_counter() - t
    if count["bytes"] + count["dropped"] != mb << 20:
        raise RuntimeError(f"{count} of {mb << 20} bytes")
    return took, count["events"], count["dropped"]


def throughput(mb: int = 256) -> dict[str, Any]:
    """MiB/s of one key through output events (bytes delivered: the dropped ones are
    counted apart) and of a plain Popen + read() loop."""
    plain = _plain(mb)
    took, events, dropped = _events(mb)
    delivered = (mb << 20) - dropped
    return {"mib": mb, "plain_mib_s": round(mb / plain, 1),
            "events_mib_s": round(delivered / (1 << 20) / took, 1),
            "events": events, "dropped": dropped}


def many_keys(keys: int = 50, rate: int = 1000, seconds: float = 3.0) -> dict[str, Any]:
    """keys chatty children at rate lines/s each for seconds, through AsyncSupervisor."""

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        lines = {f"k{i}": 0 for i in range(keys)}
        dropped = 0
        worst = steady_worst = 0.0
        steady = stop = False
        cpu = None

        async def lag() -> None:
            nonlocal worst, steady_worst
            while not stop:
                t = loop.time()
                await asyncio.sleep(0.01)
                late = loop.time() - t - 0.01
                worst = max(worst, late)
                if steady:  # every key writes, none ended: only the output flows
                    steady_worst = max(steady_worst, late)

        lagger = asyncio.create_task(lag())
        t0 = time.perf_counter()
        async with AsyncSupervisor() as sup:
            await asyncio.gather(*(sup.start(k, [sys.executable, "-c", _LINES, str(rate),
                                                 str(seconds)], output="events")
                                   for k in lines))
            silent = set(lines)  # keys not heard from yet (their interpreters start)
            t_steady = c_steady = 0.0
            exited = 0
            async for ev in sup.events():
                if ev.kind == "output":
                    lines[str(ev.key)] += (ev.data or b"").count(b"\n")
                    dropped += ev.dropped
                    if silent and not exited:
                        silent.discard(str(ev.key))
                        if not silent:
                            steady = True
                            t_steady, c_steady = time.perf_counter(), time.process_time()
                elif ev.kind == "exited":
                    if steady:
                        cpu = (time.process_time() - c_steady) / (time.perf_counter() - t_steady)
                    steady = False
                    exited += 1
                    if exited == keys:
                        break
        took = time.perf_counter() - t0
        stop = True
        await lagger
        return {"keys": keys, "rate": rate, "seconds": seconds,
                "lines": sum(lines.values()), "want": keys * int(rate * seconds),
                "dropped": dropped,
                "steady_lag_ms": None if cpu is None else round(steady_worst * 1000, 1),
                "steady_cpu_percent": None if cpu is None else round(cpu * 100, 1),
                "worst_lag_ms": round(worst * 1000, 1), "run_s": round(took, 2)}

    return asyncio.run(main())


def output_bench(mb: int = 256, seconds: float = 3.0) -> dict[str, Any]:
    return {"throughput": throughput(mb), "many_keys": many_keys(seconds=seconds)}


def render(data: dict[str, Any]) -> str:
    t, m = data["throughput"], data["many_keys"]
    steady = ("no steady state (a key ended before every key wrote: a loaded host)"
              if m["steady_lag_ms"] is None else
              f"loop lag at most {m['steady_lag_ms']:.1f} ms while they all write, "
              f"this process at {m['steady_cpu_percent']:.0f}% of a core")
    return (
        "owned output (output=\"events\")\n"
        f"  one key, {t['mib']} MiB                 {t['events_mib_s']:.0f} MiB/s delivered "
        f"as events ({t['events']} events, {t['dropped']} bytes dropped); plain Popen+read() "
        f"{t['plain_mib_s']:.0f} MiB/s\n"
        f"  {m['keys']} keys x {m['rate']} lines/s, {m['seconds']:g} s     "
        f"{m['lines']}/{m['want']} lines, {m['dropped']} bytes dropped; {steady}; "
        f"lag at most {m['worst_lag_ms']:.0f} ms with the starts and teardowns")
