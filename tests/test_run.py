"""`proctable run`: exit codes, signal forwarding, escapes reported and ended."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import time
from typing import Optional

import pytest

import proctable

from ._lineage import IDLE_SHARE, MODES
from .conftest import PY, Procs, wait_until


def run(*args: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "proctable", "run", *args], capture_output=True,
                          text=True, timeout=timeout, check=False, **kw)  # type: ignore[call-overload]


def _gone(pid: int) -> bool:
    row = proctable.read(pid)
    return row is None or row.state == "Z"


@pytest.mark.parametrize("code", [0, 3, 255])
def test_returns_the_commands_code(code: int) -> None:
    r = run("--", PY, "-c", f"import sys; sys.exit({code})")
    assert r.returncode == code, r.stderr
    assert "outlived" not in r.stderr


def test_signal_death_is_128_plus_signal() -> None:
    r = run("--", PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert r.returncode == 128 + signal.SIGKILL


def test_stdio_passes_through() -> None:
    r = run("--", PY, "-c", "import sys; sys.stdout.write(sys.stdin.read().upper())",
            input="hello")
    assert r.returncode == 0
    assert r.stdout == "HELLO"


def test_leaked_escapes_are_reported_and_killed(tmp_path: object) -> None:
    pidfile = os.path.join(str(tmp_path), "pids")
    report = os.path.join(str(tmp_path), "report.json")
    script = (f"setsid sh -c 'echo $$ >> {pidfile}; exec sleep 300' & "
              f"nohup sh -c 'echo $$ >> {pidfile}; exec sleep 301' >/dev/null 2>&1 & "
              "sleep 0.5; exit 0")
    r = run("--grace", "1", "--json-report", report, "--", "sh", "-c", script)
    with open(pidfile) as f:
        pids = [int(x) for x in f.read().split()]
    assert len(pids) == 2
    for pid in pids:
        wait_until(lambda pid=pid: _gone(pid), timeout=5)
    assert r.returncode == 0, r.stderr
    assert "2 processes outlived the command" in r.stderr
    for pid in pids:
        assert f"{pid} sleep" in r.stderr
    with open(report) as f:
        data = json.load(f)
    assert data["exit_code"] == 0
    assert sorted(p["pid"] for p in data["runs"][0]["outlived"]) == sorted(pids)


def test_command_not_found_is_127_and_leaves_nothing() -> None:
    before = {p.pid for p in proctable.snapshot().descendants(os.getpid())}
    r = run("--", "no-such-command-proctable-test")
    assert r.returncode == 127
    assert "command not found" in r.stderr
    after = {p.pid for p in proctable.snapshot().descendants(os.getpid())}
    assert after <= before
    r = run()
    assert r.returncode == 2


def test_interrupt_is_forwarded_and_nothing_is_left(procs: Procs, tmp_path: object) -> None:
    pidfile = os.path.join(str(tmp_path), "pid")
    code = ("import os, signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
            f"c = subprocess.Popen(['setsid', 'sleep', '300'])\n"
            f"open({pidfile!r}, 'w').write(str(c.pid))\n"
            "time.sleep(300)\n")
    p = procs.popen([PY, "-m", "proctable", "run", "--grace", "1", "--", PY, "-c", code],
                    stderr=subprocess.PIPE)

    def escaped() -> Optional[int]:
        try:
            with open(pidfile) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        return int(text) if text else None

    pid = wait_until(escaped)
    assert isinstance(pid, int)
    wait_until(lambda: proctable.read(pid) is not None and proctable.read(pid).name == "sleep")  # type: ignore[union-attr]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 42  # the command's own answer to SIGTERM
    assert p.stderr is not None
    err = p.stderr.read().decode()
    assert "outlived the command" in err and f"{pid} sleep" in err
    wait_until(lambda: _gone(pid), timeout=5)


def test_interrupt_not_obeyed_still_ends_the_run(procs: Procs, tmp_path: object) -> None:
    """A command that ignores SIGTERM: after --grace the run tears it down anyway."""
    marker = os.path.join(str(tmp_path), "ready")
    code = ("import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"open({marker!r}, 'w').close()\n"
            "time.sleep(300)\n")
    p = procs.popen([PY, "-m", "proctable", "run", "--grace", "0.5", "--", PY, "-c", code],
                    stderr=subprocess.PIPE)
    wait_until(lambda: os.path.exists(marker))
    cmd = [q for q in proctable.snapshot().descendants(p.pid) if q.name.startswith("python")]
    p.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    rc = p.wait(timeout=30)
    assert time.monotonic() - t0 < 15  # bounded: grace, then the teardown's SIGKILL
    assert rc == 128 + signal.SIGKILL
    for q in cmd:
        wait_until(lambda q=q: _gone(q.pid), timeout=5)


@pytest.mark.parametrize("grace", ["-1", "nan", "inf", "x"])
def test_bad_grace_is_refused_before_anything_runs(grace: str) -> None:
    r = run("--grace", grace, "--", "sleep", "0")
    assert r.returncode == 2
    assert "--grace" in r.stderr


def test_unwritable_json_report_is_refused_before_anything_runs(tmp_path: object) -> None:
    """``--json-report`` into a directory that does not exist ran the command, tore it
    down, then died with a traceback and exit 1, losing the command's code (issue 30,
    item 8, found by trying the command line as a new user): the path is checked
    first, as ``--events`` does, and nothing runs."""
    marker = os.path.join(str(tmp_path), "ran")
    report = os.path.join(str(tmp_path), "no-such-dir", "report.json")
    r = run("--json-report", report, "--", "sh", "-c", f"touch {marker}; exit 3")
    assert r.returncode == 2, r.stderr
    assert "--json-report" in r.stderr and "No such file or directory" in r.stderr
    assert "Traceback" not in r.stderr
    assert not os.path.exists(marker)  # the command never ran


def test_json_report_written_with_the_commands_code(tmp_path: object) -> None:
    """The report file opened up front is the one written at the end (with the code)."""
    report = os.path.join(str(tmp_path), "report.json")
    r = run("--json-report", report, "--", "sh", "-c", "exit 3")
    assert r.returncode == 3, r.stderr
    with open(report) as f:
        assert json.load(f)["exit_code"] == 3


def test_survivors_are_named_as_of_the_teardown(tmp_path: object) -> None:
    """``run -- sh -c 'setsid sleep 100 & echo hi'`` said ``outlived the command: N sh``,
    the name it had when the command ended, where it was ``sleep`` by the teardown
    (issue 30, item 11, found by trying the command line as a new user). Here the
    job ignores SIGTERM and execs ``sleep`` during the grace (0.3 s after its start,
    1.5 s before the grace ends): it is named ``sleep``."""
    pidfile = os.path.join(str(tmp_path), "pid")
    script = (f"sh -c 'trap \"\" TERM; echo $$ > {pidfile}; sleep 0.3; exec sleep 100' & "
              f"while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 0")
    r = run("--grace", "1.5", "--", "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    with open(pidfile) as f:
        pid = int(f.read())
    wait_until(lambda: _gone(pid), timeout=10)
    [line] = [x for x in r.stderr.splitlines() if "outlived the command" in x]
    assert f"{pid} sleep" in line and f"{pid} sh" not in line, line


def _run_with_stderr_on_a_terminal(args: list[str], timeout: float = 60) -> tuple[int, str]:
    """proctable run with a pseudo-terminal as its stderr: (exit code, what it wrote there)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([PY, "-m", "proctable", "run", *args], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 1.0)
            if not r:
                if p.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every slave fd is closed
                break
            if not chunk:
                break
            out += chunk
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        os.close(master)
    return rc, out.decode("utf-8", "replace")


def test_a_teardown_waiting_out_its_grace_says_so_on_a_terminal(tmp_path: object) -> None:
    """A teardown waiting out its grace was silent: on a terminal the run seemed to
    hang for --grace seconds after the command ended (issue 30, item 11). On a
    terminal it says, in one line, what it waits for and when it kills."""
    pidfile = os.path.join(str(tmp_path), "pid")
    script = (f"sh -c 'trap \"\" TERM; echo $$ > {pidfile}; exec sleep 100' & "
              f"while [ ! -s {pidfile} ]; do sleep 0.01; done; sleep 0.1; exit 0")
    rc, err = _run_with_stderr_on_a_terminal(["--grace", "1", "--", "sh", "-c", script])
    with open(pidfile) as f:
        pid = int(f.read())
    wait_until(lambda: _gone(pid), timeout=10)
    assert rc == 0, err
    waiting = [x for x in err.splitlines() if "waiting" in x]
    assert len(waiting) == 1, err
    m = re.search(r"proctable run: waiting up to ([0-9.]+) s for 1 process \(([0-9]+) \S+\) "
                  r"to exit on SIGTERM, then SIGKILL", waiting[0])
    assert m is not None, waiting
    assert 0 < float(m.group(1)) <= 1.0 and int(m.group(2)) == pid


def test_a_teardown_waiting_out_its_grace_is_quiet_off_a_terminal(tmp_path: object) -> None:
    """Off a terminal (a log, a pipe) the wait is not announced: stderr keeps only what
    it said before (issue 30, item 11)."""
    script = "sh -c 'trap \"\" TERM; exec sleep 100' & sleep 0.3; exit 0"
    r = run("--grace", "0.6", "--", "sh", "-c", script)  # (announced after 0.25 s)
    assert r.returncode == 0, r.stderr
    assert "waiting" not in r.stderr and "outlived the command" in r.stderr


def _cpu_ticks(pid: int) -> int:
    """utime + stime of pid (every thread), in clock ticks, from its stat line."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@pytest.mark.parametrize("mode", MODES)
def test_waiting_out_the_grace_costs_no_cpu(procs: Procs, tmp_path: object, mode: str) -> None:
    """`proctable run --grace 0.8` of a command that leaves a job ignoring SIGTERM
    waits out the grace once the command is gone: in cgroup mode that wait spun a
    CPU (issue 30, item 1). The run's CPU time from the command's end to its own
    is held against the wall time."""
    pidfile = os.path.join(str(tmp_path), "pid")
    script = f"(trap '' TERM; exec sleep 300) & echo $$ > {pidfile}; sleep 0.3"
    p = procs.popen([PY, "-m", "proctable", "run", "--mode", mode, "--grace", "0.8", "--",
                     "sh", "-c", script], stderr=subprocess.PIPE)

    def shell() -> Optional[int]:
        try:
            with open(pidfile) as f:
                text = f.read().strip()
        except FileNotFoundError:
            return None
        return int(text) if text else None

    sh = wait_until(shell, timeout=30)
    assert isinstance(sh, int)
    wait_until(lambda: _gone(sh), timeout=30)
    ticks, t0 = _cpu_ticks(p.pid), time.monotonic()
    ended = os.pidfd_open(p.pid)
    try:
        assert select.select([ended], [], [], 30)[0], "the run did not end within 30 s"
    finally:
        os.close(ended)
    _, status, usage = os.wait4(p.pid, os.WNOHANG)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    cpu = usage.ru_utime + usage.ru_stime - ticks / os.sysconf("SC_CLK_TCK")
    assert p.returncode == 0, p.stderr.read() if p.stderr else None
    assert wall >= 0.5
    assert cpu < IDLE_SHARE * wall, f"{cpu:.2f} s of CPU in the run's {wall:.2f} s teardown"
