"""`proctable top`: CPU shares, batch frames, and a terminal that is always given back."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import resource
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from typing import Optional

import pytest

import proctable
from proctable.cli.top import CpuShares

from .conftest import DEFAULT_SIGNALS, PY, Procs, wait_until


def _row(ticks_user: int, ticks_sys: int, pid: int = 4242, start: int = 1000) -> proctable.Proc:
    """A row of pid with these CPU ticks, from a real stat line with its fields replaced."""
    with open("/proc/self/stat", "rb") as f:
        line = f.read()
    head, _, rest = line.rpartition(b") ")
    fields = rest.split()
    # After the ")": field n is token n - 3 (utime 14, stime 15, starttime 22).
    fields[14 - 3], fields[15 - 3], fields[22 - 3] = (
        str(ticks_user).encode(), str(ticks_sys).encode(), str(start).encode())
    pid_part = head.split(b" (", 1)[1]
    return proctable.parse_stat(f"{pid} (".encode() + pid_part + b") " + b" ".join(fields))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="builds rows from stat lines")
def test_cpu_share_is_the_growth_of_utime_plus_stime_over_the_interval() -> None:
    hz = os.sysconf("SC_CLK_TCK")
    cpu = CpuShares()
    assert cpu.update(proctable.Table([_row(0, 0)]), 10.0) == {}  # one refresh: no share
    # one second of CPU (user + system) over two seconds of wall time: 50% of a CPU
    shares = cpu.update(proctable.Table([_row(hz // 2, hz // 2)]), 12.0)
    assert shares == {(4242, 1000): pytest.approx(50.0)}
    assert cpu.total == pytest.approx(50.0)
    # the pid reused by another process (another start time) starts afresh, not negative
    shares = cpu.update(proctable.Table([_row(hz // 10, 0, start=2000)]), 13.0)
    assert shares == {(4242, 2000): pytest.approx(10.0)}


def _top(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "proctable", "top", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_batch_once_sorts_by_cpu(procs: Procs) -> None:
    busy = procs.py("while True: pass")
    idle = procs.popen(["sleep", "70"])
    wait_until(lambda: (_child_cpu(busy.pid) or 0) > 0.05, timeout=60)  # it is spinning
    r = _top("--once", "-d", "2", "-p", f"{idle.pid},{busy.pid}", "-o", "pid,cpu,name")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("proctable top")
    assert re.search(r"\d[\d,]* processes: \d+ running", lines[1])
    # Columns are as wide as their widest value (a 3-digit pid, a %CPU over 100).
    heads = [i for i, line in enumerate(lines) if re.fullmatch(r"\s*PID\s+%CPU\s+NAME", line)]
    assert len(heads) == 1, r.stdout
    head = heads[0]
    rows = [x.split() for x in lines[head + 1:]]
    assert [int(x[0]) for x in rows] == [busy.pid, idle.pid]
    assert float(rows[0][1]) > float(rows[1][1]) == 0.0


def test_batch_prints_n_frames_and_no_escapes() -> None:
    r = _top("-n", "2", "-d", "0.2", "-l", "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("proctable top") == 2
    assert "\033" not in r.stdout
    for bad in (["-d", "0.01"], ["-n", "0"], ["-o", "nosuch"]):
        assert _top(*bad).returncode == 2, bad


def _readable(fd: int, timeout: float) -> bool:
    p = select.poll()  # not select(): the fds-past-1024 test needs fds above its limit
    p.register(fd, select.POLLIN)
    return bool(p.poll(timeout * 1000))


class _Pty:
    """proctable top on a pseudo-terminal it controls, as in a terminal window."""

    def __init__(self, *args: str, cols: int = 100, rows: int = 30,
                 pass_fds: tuple[int, ...] = ()) -> None:
        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.before = termios.tcgetattr(self.slave)
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR")}
        env["TERM"] = "xterm"
        self.p = subprocess.Popen(
            [*DEFAULT_SIGNALS, PY, "-m", "proctable", "top", "-d", "0.3", *args],
            stdin=self.slave, stdout=self.slave, stderr=subprocess.PIPE, env=env,
            start_new_session=True, pass_fds=pass_fds,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # noqa: PLW1509
        )
        self.out = b""

    def read_until(self, marker: bytes, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.out:
            assert time.monotonic() < deadline, f"no {marker!r} in {self.out[-400:]!r}"
            if _readable(self.master, 1.0):
                try:
                    self.out += os.read(self.master, 65536)
                except OSError:
                    return

    def read_frames(self, n: int, start: int = 0, timeout: float = 60) -> None:
        """Read until n whole frames (each ends with a clear-to-end) came after start."""
        deadline = time.monotonic() + timeout
        while self.out.count(b"\033[J", start) < n:
            assert time.monotonic() < deadline, f"{n} frames did not come: {self.out[-400:]!r}"
            if _readable(self.master, 1.0):
                try:
                    self.out += os.read(self.master, 65536)
                except OSError:
                    return

    def drain(self) -> None:
        while True:
            if not _readable(self.master, 0.2):
                return
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.out += chunk

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(timeout=10)
        if self.p.stderr is not None:
            self.p.stderr.close()
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def term() -> Iterator[list[_Pty]]:
    made: list[_Pty] = []
    try:
        yield made
    finally:
        for t in made:
            t.close()


def _assert_restored(t: _Pty, rc: int, want: int) -> None:
    t.drain()
    assert rc == want, t.out[-500:]
    assert b"\033[?1049h" in t.out  # it used the alternate screen ...
    assert t.out.rstrip(b"\r\n").endswith(b"\033[?25h\033[?1049l")  # ... and left it
    assert termios.tcgetattr(t.slave) == t.before  # echo and line mode are back


@pytest.mark.parametrize("how", ["q", "ctrl-c", "sigterm"])
def test_interactive_view_quits_and_restores_the_terminal(term: list[_Pty], how: str) -> None:
    t = _Pty()
    term.append(t)
    t.read_until(b"%CPU")
    t.read_until(b"proctable top")  # a second frame: it is in its loop
    if how == "q":
        os.write(t.master, b"q")
        want = 0
    elif how == "ctrl-c":
        os.write(t.master, b"\x03")  # the terminal sends SIGINT to the foreground group
        want = 130
    else:
        t.p.send_signal(signal.SIGTERM)
        want = 128 + signal.SIGTERM
    rc = t.p.wait(timeout=30)
    _assert_restored(t, rc, want)


def test_interactive_keys_change_the_sort_and_show_kernel_threads(term: list[_Pty]) -> None:
    kthreads = [p for p in proctable.snapshot(memory=False) if p.kernel_thread]
    t = _Pty()
    term.append(t)
    t.read_until(b"sorted by -cpu,-time")
    os.write(t.master, b"m")
    t.read_until(b"sorted by -rss")
    if kthreads:
        os.write(t.master, b"k")
        mark = len(t.out)
        t.read_frames(2, start=mark)  # the frame in flight, then one drawn after the key
        frames = [f for f in t.out[mark:].split(b"\033[H") if f.endswith(b"\033[J")]
        assert b"kernel threads hidden" not in frames[-1]
    os.write(t.master, b"q")
    rc = t.p.wait(timeout=30)
    _assert_restored(t, rc, 0)


def _child_cpu(pid: int) -> Optional[float]:
    row = proctable.read(pid)
    if row is None or row.utime is None or row.stime is None:
        return None
    return row.utime + row.stime


def test_interactive_view_shows_what_runs(term: list[_Pty], procs: Procs) -> None:
    busy = procs.py("while True: pass")
    wait_until(lambda: (_child_cpu(busy.pid) or 0) > 0.05, timeout=60)
    t = _Pty("-p", str(busy.pid), "-o", "pid,cpu,name")
    term.append(t)
    t.read_until(f"{busy.pid}".encode())
    os.write(t.master, b"q")
    rc = t.p.wait(timeout=30)
    _assert_restored(t, rc, 0)


def test_interactive_view_with_fds_past_select_limit(term: list[_Pty]) -> None:
    # A Scanner on a large table holds thousands of fds, so top's own fds land past
    # 1024, where select() fails: give it 1,100 fds first, as such a table would.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 1400:
        if hard != resource.RLIM_INFINITY and hard < 1400:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below 1400")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1400, hard))
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        t = _Pty(pass_fds=tuple(fds))
        term.append(t)
        t.read_frames(2)
        os.write(t.master, b"q")
        rc = t.p.wait(timeout=30)
    finally:
        for fd in fds:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    _assert_restored(t, rc, 0)
