"""Helpers shared by the tests/test_reliability_*.py files.

Row sanity checks, fd and RSS counters, the slow-test switch, and the churn
generator (a helper process that starts and reaps short processes).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterable
from typing import Any, Optional

import pytest

import proctable
from proctable import _lowlevel

from .conftest import wait_until

SLOW = os.environ.get("PROCTABLE_SLOW_TESTS") == "1"
"""PROCTABLE_SLOW_TESTS=1 runs the long variants (minutes instead of seconds): the
slow set, listed in docs/development.md."""

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def scale(default: float, slow: float) -> float:
    return slow if SLOW else default


def fd_list() -> list[str]:
    """The fds of this process now, each as "fd -> target"."""
    out = []
    for name in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            out.append(f"{name} -> {os.readlink(f'/proc/self/fd/{name}')}")
        except OSError:  # the fd of the listing itself, closed already
            pass
    return out


def fd_count() -> int:
    return len(fd_list())


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _lowlevel.PAGE_SIZE


def check_row(p: proctable.Proc) -> None:
    """Every field of one row is well formed; AssertionError naming the row if not."""
    where = repr(p._raw())
    assert isinstance(p, proctable.Proc), where
    assert 0 < p.pid <= _lowlevel.PID_MAX, where
    assert len(p.state) == 1 and p.state.isascii() and p.state.isalpha(), where
    assert 0 <= p.ppid <= _lowlevel.PID_MAX, where
    assert 0 <= p.pgid <= _lowlevel.PID_MAX, where
    assert 0 <= p.sid <= _lowlevel.PID_MAX, where
    assert p.start_time >= 0, where
    assert p.create_time >= _lowlevel.BOOT_EPOCH, where
    assert p.num_threads >= 0, where
    assert p.utime >= 0 and p.stime >= 0, where
    assert p.rss is None or p.rss >= 0, where
    assert (p.rss is None) == (p.vms is None), where
    assert p.uid is None or p.uid >= 0, where
    assert len(p.name.encode("utf-8", "surrogateescape")) <= 64, where
    ex = p.exit
    if ex is not None:
        assert p.state == "Z", where
        assert isinstance(ex, proctable.ExitStatus), where


def check_table(rows: Iterable[proctable.Proc]) -> int:
    """Every row well formed, pids strictly increasing (so no duplicate). Returns the count."""
    last = 0
    n = 0
    for p in rows:
        check_row(p)
        assert p.pid > last, f"pid {p.pid} after {last}: not sorted, or listed twice"
        last = p.pid
        n += 1
    return n


# --- churn ----------------------------------------------------------------------

# A helper process that starts `rate` short processes a second (at most `live`
# alive at once) and reaps them, until SIGTERM; then it reaps what is left and
# prints {"started": n, "seconds": s}. It is a child subreaper, so the orphans of
# its double forks come back to it and are reaped too. Kinds of child, in turn:
# exit at once; rename to a comm with ')' and spaces, sleep 5 ms, exit 3; setsid
# and double fork; SIGKILL itself; exec /bin/true; start a thread, exit 0.
CHURN_CODE = r"""
import ctypes, json, os, signal, sys, threading, time
rate, live_max = float(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)           # PR_SET_CHILD_SUBREAPER
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
def child(kind):
    if kind == 0:
        os._exit(0)
    if kind == 1:
        libc.prctl(15, ctypes.c_char_p(b"churn) (x y"), 0, 0, 0)   # PR_SET_NAME
        time.sleep(0.005)
        os._exit(3)
    if kind == 2:
        os.setsid()
        if os.fork() == 0:
            time.sleep(0.002)
        os._exit(0)
    if kind == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == 4:
        os.execv("/bin/true", ["true"])
    threading.Thread(target=time.sleep, args=(0.002,)).start()
    os._exit(0)
started = 0
live = 0
t0 = time.monotonic()
print("ready", flush=True)
while not stop:
    due = int((time.monotonic() - t0) * rate) - started
    for _ in range(max(0, min(due, live_max - live))):
        pid = os.fork()
        if pid == 0:
            try:
                child(started % 6)
            finally:
                os._exit(1)
        started += 1
        live += 1
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        live -= 1
    time.sleep(0.0005)
elapsed = time.monotonic() - t0
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid == 0:
        time.sleep(0.005)
print(json.dumps({"started": started, "seconds": elapsed}), flush=True)
"""


class Churn:
    """The churn helper process: started, then stopped by pid, and reaped."""

    def __init__(self, rate: float = 800.0, live: int = 64) -> None:
        self.proc: subprocess.Popen[bytes] = subprocess.Popen(
            [sys.executable, "-c", CHURN_CODE, str(rate), str(live)],
            stdout=subprocess.PIPE,
        )
        self.result: Optional[dict[str, Any]] = None
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        if not ready or self.proc.stdout.readline().strip() != b"ready":
            self.kill()
            pytest.fail("the churn helper did not start")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> dict[str, Any]:
        """SIGTERM, then its report (processes started, seconds); bounded."""
        if self.result is not None:
            return self.result
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("the churn helper did not stop within 20 s")
        self.result = json.loads(out.decode().strip().splitlines()[-1])
        return self.result

    def kill(self) -> None:
        if self.proc.returncode is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)


# The suite's one bounded poll, under the name these files use.
wait_for = wait_until
