"""Owned output: throughput of one key through output events, beside a plain
``Popen`` + ``read()`` loop in the same run; and 50 keys writing 1,000 lines a
second each under ``AsyncSupervisor`` (dropped bytes, lines lost, loop lag).

Run: python -m pytest benchmarks/bench_output.py --benchmark-enable -s -q
(``PROCTABLE_BENCH_MB`` sets the megabytes of the throughput run, default 512;
``PROCTABLE_BENCH_SECONDS`` the length of the 50-key run, default 5).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from typing import Any

from proctable import AsyncSupervisor, Supervisor
from proctable.supervise import Event

MB = int(os.environ.get("PROCTABLE_BENCH_MB", "512"))
SECONDS = float(os.environ.get("PROCTABLE_BENCH_SECONDS", "5"))
KEYS = 50
RATE = 1000  # lines per second per key

_WRITER = f"head -c {MB << 20} /dev/zero"


def _plain_popen() -> float:
    """Seconds for a plain Popen + read() loop to take all the bytes."""
    t = time.perf_counter()
    with subprocess.Popen(["sh", "-c", _WRITER], stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        got = 0
        while True:
            chunk = p.stdout.read1(1 << 20)
            if not chunk:
                break
            got += len(chunk)
    assert got == MB << 20
    return time.perf_counter() - t


def _through_events() -> tuple[float, int, int]:
    """Seconds for the same bytes through output events; events, bytes dropped."""
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
        sup.start("bulk", ["sh", "-c", _WRITER], output="events")
        assert done.wait(600)
        took = time.perf_counter() - t
    assert count["bytes"] + count["dropped"] == MB << 20
    return took, count["events"], count["dropped"]


def test_throughput_of_one_key_beside_a_plain_popen(benchmark: Any) -> None:
    plain = _plain_popen()
    took, events, dropped = _through_events()
    benchmark.pedantic(lambda: None, rounds=1)  # the figures are printed, not timed here
    print(f"\n{MB} MiB: plain Popen+read() {MB / plain:.0f} MiB/s; "
          f"output events {MB / took:.0f} MiB/s ({events} events, {dropped} bytes dropped; "
          "spawn and teardown of the lineage included)")


_LINES = ("import sys, time\n"
          "rate, seconds = int(sys.argv[1]), float(sys.argv[2])\n"
          "w = sys.stdout\n"
          "n, t0 = 0, time.monotonic()\n"
          "while True:\n"
          "    due = int((time.monotonic() - t0) * rate)\n"
          "    if due >= rate * seconds: break\n"
          "    while n < due:\n"
          "        w.write('line %08d of a chatty child, about sixty bytes long....\\n' % n)\n"
          "        n += 1\n"
          "    w.flush()\n"
          "    time.sleep(0.01)\n"
          "total = int(rate * seconds)\n"
          "while n < total:\n"
          "    w.write('line %08d of a chatty child, about sixty bytes long....\\n' % n)\n"
          "    n += 1\n"
          "w.flush()\n")


def test_fifty_keys_a_thousand_lines_a_second(benchmark: Any) -> None:
    async def main() -> tuple[float, float, int, int, float, float]:
        loop = asyncio.get_running_loop()
        lines = {f"k{i}": 0 for i in range(KEYS)}
        dropped = 0
        worst = steady_worst = 0.0
        steady = stop = False

        async def lag() -> None:
            nonlocal worst, steady_worst
            while not stop:
                t = loop.time()
                await asyncio.sleep(0.01)
                late = loop.time() - t - 0.01
                worst = max(worst, late)
                if steady:  # every key started, none ended: only the output flows
                    steady_worst = max(steady_worst, late)

        cpu = -1.0  # (never measured: a key ended before every key was heard from)

        lagger = asyncio.create_task(lag())
        t0 = time.perf_counter()
        async with AsyncSupervisor() as sup:
            await asyncio.gather(*(sup.start(k, [sys.executable, "-c", _LINES, str(RATE),
                                                 str(SECONDS)], output="events")
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
                        if not silent:  # every key writes: the steady state begins
                            steady = True
                            t_steady, c_steady = time.perf_counter(), time.process_time()
                elif ev.kind == "exited":
                    if steady:  # this process's CPU per second while they all write
                        cpu = (time.process_time() - c_steady) / (time.perf_counter() - t_steady)
                    steady = False
                    exited += 1
                    if exited == KEYS:
                        break
        took = time.perf_counter() - t0
        stop = True
        await lagger
        return steady_worst, worst, sum(lines.values()), dropped, took, cpu

    steady_worst, worst, total, dropped, took, cpu = asyncio.run(main())
    benchmark.pedantic(lambda: None, rounds=1)
    want = KEYS * int(RATE * SECONDS)
    steady_part = ("no steady state (a key ended before every key wrote: a loaded host)"
                   if cpu < 0 else
                   f"loop lag at most {steady_worst * 1000:.1f} ms while they all write, "
                   f"the supervising process at {cpu * 100:.0f}% of a core")
    print(f"\n{KEYS} keys x {RATE} lines/s for {SECONDS:g} s: {total}/{want} lines, "
          f"{dropped} bytes dropped; {steady_part}; loop lag at most {worst * 1000:.1f} ms "
          f"with the 50 starts and teardowns (run {took:.1f} s)")
    assert total == want and dropped == 0
