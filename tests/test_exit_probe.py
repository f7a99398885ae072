"""exit_probe on real processes: zombies, signals, stops, threads, privilege, reuse."""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

import proctable
from proctable import ProbeState

from .conftest import PY, Procs, needs_root, run_as_nobody, wait_until, wait_zombie


@pytest.mark.parametrize("code", [0, 7, 255])
def test_zombie_exit_code_is_read_without_reaping(procs: Procs, code: int) -> None:
    p = procs.py(f"import os; os._exit({code})")
    wait_zombie(p.pid)
    probe = proctable.exit_probe(p.pid)
    assert probe.state is ProbeState.EXITED
    assert probe.status == proctable.ExitStatus(code, None, False, code << 8)
    assert probe.status.returncode == code
    assert proctable.zombie_exit(p.pid) == probe.status
    # Probing never reaps: the parent's wait still gets the real status.
    _, status = os.waitpid(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    assert status == probe.status.raw
    assert proctable.exit_probe(p.pid).state is ProbeState.GONE
    assert proctable.zombie_exit(p.pid) is None


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_signal_death(procs: Procs, sig: int) -> None:
    p = procs.popen(["sleep", "60"])
    wait_until(lambda: proctable.exit_probe(p.pid).state is ProbeState.RUNNING)
    os.kill(p.pid, sig)
    wait_zombie(p.pid)
    status = proctable.zombie_exit(p.pid)
    assert status is not None
    assert (status.code, status.signal, status.core_dumped) == (None, sig, False)
    assert status.returncode == -sig
    assert p.wait(timeout=10) == -sig


def test_core_dump_sets_core_bit(procs: Procs) -> None:
    with open("/proc/sys/kernel/core_pattern") as f:
        pattern = f.read().strip()
    if pattern.startswith("|"):
        pytest.skip(f"core dumps go to a helper program here ({pattern.split()[0]})")
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    if hard == 0:
        pytest.skip("core dumps are off for this session (hard RLIMIT_CORE is 0, e.g. sudo)")
    with tempfile.TemporaryDirectory() as tmp:
        p = procs.py(
            "import os; os.abort()",
            cwd=tmp,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (hard, hard)),
        )
        wait_zombie(p.pid, timeout=30)
        status = proctable.zombie_exit(p.pid)
        _, raw = os.waitpid(p.pid, 0)
        p.returncode = -signal.SIGABRT
        assert status is not None
        assert status.raw == raw
        if not os.WCOREDUMP(raw):
            pytest.skip("the kernel did not write a core here (core_pattern or a limit)")
        assert (status.signal, status.core_dumped) == (signal.SIGABRT, True)
        assert raw & 0x80


def test_stopped_is_not_an_exit(procs: Procs) -> None:
    p = procs.popen(["sleep", "60"])
    os.kill(p.pid, signal.SIGSTOP)
    wait_until(lambda: proctable.read(p.pid).state == "T")  # type: ignore[union-attr]
    probe = proctable.exit_probe(p.pid)
    assert probe.state is ProbeState.STOPPED
    assert probe.status is None
    assert proctable.zombie_exit(p.pid) is None
    os.kill(p.pid, signal.SIGCONT)
    wait_until(lambda: proctable.exit_probe(p.pid).state is ProbeState.RUNNING)


def test_running(procs: Procs) -> None:
    p = procs.popen(["sleep", "60"])
    probe = proctable.exit_probe(p.pid)
    assert probe.state is ProbeState.RUNNING
    assert probe.status is None
    assert probe.proc is not None and probe.proc.pid == p.pid


LEADER_EXIT = r"""
import ctypes, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
SYS_exit = {"x86_64": 60, "aarch64": 93}[os.uname().machine]
def worker():
    sys.stdin.buffer.read(1)     # the test says when to finish
    os._exit(42)
threading.Thread(target=worker).start()
sys.stdout.write("ready\n"); sys.stdout.flush()
# The raw exit syscall ends only the calling (main) thread, as pthread_exit does,
# without unwinding through the interpreter's frames.
libc.syscall(SYS_exit, 0)
"""


def test_leader_exited_then_exited(procs: Procs) -> None:
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("syscall number for exit known only on x86_64 and aarch64")
    p = procs.py(LEADER_EXIT, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdin is not None
    assert p.stdout.readline() == b"ready\n"

    def leader_zombie() -> bool:
        row = proctable.read(p.pid)
        return row is not None and row.state == "Z" and row.num_threads > 1

    wait_until(leader_zombie)
    probe = proctable.exit_probe(p.pid)
    assert probe.state is ProbeState.LEADER_EXITED
    assert probe.status is None
    p.stdin.write(b"x")
    p.stdin.flush()
    wait_zombie(p.pid)
    probe = proctable.exit_probe(p.pid)
    assert probe.state is ProbeState.EXITED
    assert probe.status is not None and probe.status.code == 42
    assert p.wait(timeout=10) == 42


def test_wrong_start_time_is_reused(procs: Procs) -> None:
    p = procs.popen(["sleep", "60"])
    row = proctable.read(p.pid)
    assert row is not None
    assert proctable.exit_probe(p.pid, row.start_time).state is ProbeState.RUNNING
    probe = proctable.exit_probe(p.pid, row.start_time + 1)
    assert probe.state is ProbeState.REUSED
    assert probe.status is None


def test_reused_zombie_status_is_not_given(procs: Procs) -> None:
    p = procs.py("import os; os._exit(9)")
    row = wait_zombie(p.pid)
    assert proctable.zombie_exit(p.pid, row.start_time - 1) is None
    expected = proctable.ExitStatus(9, None, False, 9 << 8)
    assert proctable.zombie_exit(p.pid, row.start_time) == expected


def test_reaped_is_gone(procs: Procs) -> None:
    p = procs.py("pass")
    p.wait(timeout=30)
    assert proctable.exit_probe(p.pid).state is ProbeState.GONE
    assert proctable.read(p.pid) is None


@needs_root
def test_masked_for_unprivileged_reader(procs: Procs) -> None:
    # A root-owned zombie exiting 7: uid 65534 may not see field 52 (it reads 0).
    p = procs.py("import os; os._exit(7)")
    wait_zombie(p.pid)
    got = run_as_nobody(lambda: (proctable.exit_probe(p.pid).state.value,
                                 proctable.read(p.pid).raw_exit_code))  # type: ignore[union-attr]
    assert got == ("ok", ("masked", 0))
    # The privileged reader still sees the real status, and the zombie is intact.
    assert proctable.zombie_exit(p.pid) == proctable.ExitStatus(7, None, False, 1792)
    assert p.wait(timeout=10) == 7


def _probe_own_child(code: int, dumpable: bool) -> tuple[str, object]:
    """Runs as uid 65534: fork a child exiting with code, probe it, reap it.

    Modules are imported by the parent: uid 65534 may not read this Python's files.
    """
    # A process that changed uid without exec is non-dumpable, and so are its
    # children: the kernel then hides their field 52 even from the same uid.
    ctypes.CDLL(None).prctl(4, 1 if dumpable else 0, 0, 0, 0)  # PR_SET_DUMPABLE
    pid = os.fork()
    if pid == 0:
        os._exit(code)
    deadline = time.monotonic() + 10
    while proctable.read(pid).state != "Z":  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            return ("timeout", None)
        time.sleep(0.002)
    probe = proctable.exit_probe(pid)
    _, raw = os.waitpid(pid, 0)
    assert raw == code << 8
    return (probe.state.value, probe.status.code if probe.status else None)


@needs_root
@pytest.mark.parametrize("code", [0, 7])
def test_unprivileged_reader_sees_its_own_zombie(code: int) -> None:
    # Exit 0 must read as EXITED code 0, not MASKED: the check is real.
    assert run_as_nobody(lambda: _probe_own_child(code, True)) == ("ok", ("exited", code))


@needs_root
@pytest.mark.parametrize("code", [0, 7])
def test_non_dumpable_zombie_is_masked_even_for_its_uid(code: int) -> None:
    assert run_as_nobody(lambda: _probe_own_child(code, False)) == ("ok", ("masked", None))


def test_bad_pids_are_refused_before_any_kernel_call() -> None:
    for bad in (0, -1, -12345):
        with pytest.raises(ValueError):
            proctable.exit_probe(bad)
        with pytest.raises(ValueError):
            proctable.read(bad)
        with pytest.raises(ValueError):
            proctable.identity(bad)
    for wrong in ("1", 1.0, None, True):
        with pytest.raises(TypeError):
            proctable.exit_probe(wrong)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        proctable.read(2**31)
    with pytest.raises(TypeError):
        proctable.exit_probe(1, "26")  # type: ignore[arg-type]


def test_decode_wait_status_table() -> None:
    d = proctable.decode_wait_status
    assert d(0) == proctable.ExitStatus(0, None, False, 0)
    assert d(1792) == proctable.ExitStatus(7, None, False, 1792)
    assert d(0xFF00).code == 255
    assert d(9) == proctable.ExitStatus(None, 9, False, 9)
    assert d(0x86) == proctable.ExitStatus(None, 6, True, 0x86)
    assert d(9).returncode == -9
    with pytest.raises(ValueError):
        d(0x137F)  # stopped by SIGSTOP
    with pytest.raises(ValueError):
        d(0xFFFF)  # continued
    with pytest.raises(ValueError):
        d(-1)
    with pytest.raises(TypeError):
        d("9")  # type: ignore[arg-type]


def test_probe_of_odd_name(procs: Procs, tmp_path: os.PathLike[str]) -> None:
    sleep = shutil.which("sleep")
    assert sleep is not None
    odd = os.path.join(tmp_path, "a b) Z 1 (c")
    shutil.copy(sleep, odd)
    p = procs.popen([odd, "60"])
    wait_until(lambda: proctable.read(p.pid).name == "a b) Z 1 (c")  # type: ignore[union-attr]
    assert proctable.exit_probe(p.pid).state is ProbeState.RUNNING
    os.kill(p.pid, signal.SIGKILL)
    row = wait_zombie(p.pid)
    assert row.name == "a b) Z 1 (c"
    assert row.exit == proctable.ExitStatus(None, 9, False, 9)
    assert p.wait(timeout=10) == -9


def test_python_executable_is_used() -> None:
    assert os.path.exists(PY)


def test_a_negative_start_time_is_refused() -> None:
    """``exit_probe(pid, start_time=-5)`` answered ``REUSED``, as if a process could
    have started before the boot (issue 30, item 10, found by the outside review's
    wrong-typed inputs): a start time is clock ticks since boot, never negative."""
    me = os.getpid()
    for bad in (-1, -5, -(2**70)):
        with pytest.raises(ValueError, match="start_time"):
            proctable.exit_probe(me, start_time=bad)
        with pytest.raises(ValueError, match="start_time"):
            proctable.zombie_exit(me, start_time=bad)
    assert proctable.exit_probe(me, start_time=2**70).state is ProbeState.REUSED
