"""The sidecar's costs: start -> created over the wire beside Supervisor.start in
process, list and probe requests a second, and output throughput (where the output
engine is in this build).

Run: python -m pytest benchmarks/bench_serve.py --benchmark-enable -s

Every start runs ``sleep 60`` under a new key (no replacement, so no teardown is
timed); the keys are closed after the group. Requests a second are measured
pipelined (N requests written at once, every response read) and one by one.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from proctable import Supervisor
from proctable.supervise import KINDS

PIPELINED = 5000


class _Wire:
    """A bare client of `proctable serve` on its stdio."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "proctable", "serve", "--grace", "1"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.w = self.proc.stdin.fileno()
        self.r = self.proc.stdout.fileno()
        self.buf = b""
        self.ids = itertools.count(1)

    def lines(self) -> Iterator[dict[str, Any]]:
        while True:
            while b"\n" not in self.buf:
                select.select([self.r], [], [], 60)
                chunk = os.read(self.r, 1 << 20)
                assert chunk, "the sidecar closed its stdout"
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            yield json.loads(line)

    def send(self, method: str, params: dict[str, Any]) -> int:
        i = next(self.ids)
        os.write(self.w, json.dumps({"jsonrpc": "2.0", "id": i, "method": method,
                                     "params": params}).encode() + b"\n")
        return i

    def call(self, method: str, **params: Any) -> Any:
        i = self.send(method, params)
        for msg in self.lines():
            if msg.get("id") == i:
                assert "error" not in msg, msg
                return msg["result"]
        return None

    def pipelined(self, method: str, n: int, **params: Any) -> None:
        first = next(self.ids)
        blob = b"".join(json.dumps({"jsonrpc": "2.0", "id": first + k, "method": method,
                                    "params": params}).encode() + b"\n" for k in range(n))
        self.ids = itertools.count(first + n)
        view = memoryview(blob)
        got = 0
        it = self.lines()
        while view or got < n:
            r, w, _ = select.select([self.r], [self.w] if view else [], [], 60)
            if w:
                k = os.write(self.w, view[: 1 << 16])
                view = view[k:]
            if r:
                chunk = os.read(self.r, 1 << 20)
                assert chunk
                self.buf += chunk
                got += self.buf.count(b"\n")
                # keep only the unfinished line: every finished one is an answer
                self.buf = self.buf[self.buf.rfind(b"\n") + 1:]
        del it

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def wire() -> Iterator[_Wire]:
    w = _Wire()
    w.call("hello")
    yield w
    w.close()


def test_start_to_created_over_the_sidecar(benchmark: Any, wire: _Wire) -> None:
    benchmark.group = "start -> created"
    keys = (f"s{n}" for n in itertools.count())
    benchmark.pedantic(lambda: wire.call("start", key=next(keys), args=["sleep", "60"]),
                       rounds=40, iterations=1, warmup_rounds=2)
    wire.call("close", grace=1)


def test_start_to_created_in_process(benchmark: Any) -> None:
    benchmark.group = "start -> created"
    sup = Supervisor(grace=1)
    keys = (f"s{n}" for n in itertools.count())
    try:
        benchmark.pedantic(lambda: sup.start(next(keys), ["sleep", "60"]),
                           rounds=40, iterations=1, warmup_rounds=2)
    finally:
        sup.close()


@pytest.mark.parametrize("method", ["list", "probe", "hello"])
def test_requests_one_by_one(benchmark: Any, method: str) -> None:
    w = _Wire()
    try:
        params = {"pid": os.getpid()} if method == "probe" else {}
        w.call(method, **params)
        benchmark.group = "one request, round trip"
        benchmark.pedantic(lambda: w.call(method, **params), rounds=500, iterations=1)
        print(f"\n{method}: {1 / benchmark.stats.stats.median:,.0f} round trips a second")
    finally:
        w.close()


@pytest.mark.parametrize("method", ["list", "probe"])
def test_requests_pipelined(benchmark: Any, method: str) -> None:
    w = _Wire()
    try:
        params = {"pid": os.getpid()} if method == "probe" else {}
        w.call(method, **params)
        benchmark.group = f"{PIPELINED} pipelined requests"
        benchmark.pedantic(lambda: w.pipelined(method, PIPELINED, **params), rounds=5,
                           iterations=1)
        print(f"\n{method} pipelined: {PIPELINED / benchmark.stats.stats.median:,.0f} "
              "requests a second")
    finally:
        w.close()


@pytest.mark.skipif("output" not in KINDS, reason="no output engine in this build")
def test_output_throughput_one_key() -> None:
    w = _Wire()
    try:
        total = 256 << 20
        t0 = time.perf_counter()
        w.send("start", {"key": "out", "args": ["head", "-c", str(total), "/dev/zero"]})
        got = dropped = lost = 0
        buf = b""
        done = False
        while not done:  # a lean reader: output lines are only measured, not parsed
            select.select([w.r], [], [], 60)
            chunk = os.read(w.r, 1 << 20)
            assert chunk
            buf += chunk
            lines = buf.split(b"\n")
            buf = lines.pop()
            for line in lines:
                if line.startswith(b'{"jsonrpc":"2.0","method":"output"'):
                    a = line.index(b'"data_b64":"') + 12
                    b64 = line[a:line.index(b'"', a)]
                    got += len(b64) * 3 // 4 - b64[-2:].count(b"=")
                    dropped += int(line[line.rindex(b":") + 1:-2])
                    continue
                msg = json.loads(line)
                if msg.get("method") == "lost":
                    lost += msg["params"]["bytes"]
                if msg.get("method") == "event" and msg["params"]["kind"] == "exited":
                    done = True
        dt = time.perf_counter() - t0
        print(f"\noutput through the sidecar, one key: {got / dt / 1e6:,.0f} MB/s delivered "
              f"({got} of {total} bytes; dropped by the supervisor {dropped}, by the "
              f"sidecar for this reader {lost})")
    finally:
        w.close()


_PACED = """
import sys, time
n, seconds = int(sys.argv[1]), float(sys.argv[2])
t0 = time.monotonic()
for i in range(int(n * seconds)):
    while time.monotonic() < t0 + i / n:
        time.sleep(0.002)
    sys.stdout.write(f"line {i} of a paced writer, about eighty bytes long, padded .......\\n")
    sys.stdout.flush()
"""


@pytest.mark.skipif("output" not in KINDS, reason="no output engine in this build")
def test_output_50_keys_at_1000_lines_a_second() -> None:
    w = _Wire()
    keys, rate, seconds = 50, 1000, 5.0
    try:
        t0 = time.perf_counter()
        for k in range(keys):
            w.send("start", {"key": f"p{k}", "args": [sys.executable, "-S", "-c", _PACED,
                                                     str(rate), str(seconds)]})
        lines = dict.fromkeys(range(keys), 0)
        dropped = lost = 0
        exited = 0
        for msg in w.lines():
            m = msg.get("method")
            if m == "output":
                k = int(msg["params"]["key"][1:])
                lines[k] += base64.b64decode(msg["params"]["data_b64"]).count(b"\n")
                dropped += msg["params"]["dropped"]
            elif m == "lost":
                lost += msg["params"]["bytes"]
            elif m == "event" and msg["params"]["kind"] == "exited":
                exited += 1
                if exited == keys:
                    break
        dt = time.perf_counter() - t0
        want = int(rate * seconds)
        short = {k: n for k, n in lines.items() if n != want}
        print(f"\n{keys} keys at {rate} lines/s for {seconds:g}s: {sum(lines.values())} lines "
              f"in {dt:.1f}s, dropped {dropped} bytes, lost {lost} bytes, "
              f"keys short of {want} lines: {len(short)}")
    finally:
        w.close()
