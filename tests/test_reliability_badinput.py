"""Bad input across the public API and the command line.

Wrong types, negative, zero and huge pids, NaN and infinite seconds, a closed
watcher or scanner, a lineage used after its teardown, and ``proctable run`` of
commands that cannot run: each gets a clear exception (or exit code and
message) before anything reaches the kernel, and nothing is left running.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import uuid
from typing import Any, Callable

import pytest

import proctable
from proctable.lineage import _cgroup

from ._reliability import linux_only

PID_MAX = 2**31 - 1
NOT_INTS: list[Any] = ["1", 1.0, None, True, b"1", [1], object()]
BAD_PIDS: list[Any] = [0, -1, -(2**31), PID_MAX + 1, 2**64, 2**200]
BAD_SECONDS: list[Any] = [-1, -0.001, math.nan, math.inf, -math.inf]
NOT_SECONDS: list[Any] = ["1", None, True, [1]]


def _pid_calls() -> list[tuple[str, Callable[[Any], Any]]]:
    return [
        ("read", proctable.read),
        ("exit_probe", proctable.exit_probe),
        ("zombie_exit", proctable.zombie_exit),
        ("identity", proctable.identity),
        ("terminate", lambda pid: proctable.terminate(pid, grace=0, kill_timeout=0)),
        ("watch", lambda pid: proctable.ExitWatcher().watch(pid)),
        ("Lineage", proctable.Lineage),
        ("Identity.alive", lambda pid: proctable.Identity(pid, 0).alive()),
    ]


@pytest.mark.parametrize(("name", "call"), _pid_calls(), ids=[n for n, _ in _pid_calls()])
def test_pids_of_the_wrong_type_or_range(name: str, call: Callable[[Any], Any]) -> None:
    for bad in NOT_INTS:
        if name == "Lineage" and bad is None:
            continue  # covered below: a root is a pid, Identity or Popen
        with pytest.raises(TypeError):
            call(bad)
    for bad in BAD_PIDS:
        with pytest.raises(ValueError):
            call(bad)


def test_pids_in_range_that_name_nothing() -> None:
    assert proctable.read(PID_MAX) is None
    assert proctable.identity(PID_MAX) is None
    assert proctable.exit_probe(PID_MAX).state is proctable.ProbeState.GONE
    assert proctable.zombie_exit(PID_MAX) is None
    assert proctable.terminate(PID_MAX, grace=0, kill_timeout=0) is None
    assert not proctable.Identity(PID_MAX, 0).alive()
    with proctable.ExitWatcher() as w:
        assert isinstance(w.watch(PID_MAX).exception(timeout=10), proctable.NoSuchProcess)
    with pytest.raises(proctable.NoSuchProcess):
        proctable.Lineage(PID_MAX)


def test_start_times_and_identities_of_the_wrong_type() -> None:
    me = os.getpid()
    bad: Any
    for bad in ("1", 1.5, True):
        with pytest.raises(TypeError):
            proctable.exit_probe(me, start_time=bad)
    with proctable.ExitWatcher() as w:
        with pytest.raises(TypeError):
            w.watch(proctable.Identity(me, "0"))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            w.watch(proctable.Identity(me, 0, "handle"))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            w.watch(me, reap=1)  # type: ignore[arg-type]
    # Any int start time >= 0 is an answer, never a crash: it is just not this
    # process's; a negative one is no start time at all (issue 30, item 10).
    for st in (0, 2**70):
        assert proctable.exit_probe(me, start_time=st).state is proctable.ProbeState.REUSED
    with pytest.raises(ValueError):
        proctable.exit_probe(me, start_time=-1)


@pytest.mark.parametrize("bad", BAD_SECONDS + NOT_SECONDS, ids=repr)
def test_seconds_that_are_not_seconds(bad: Any) -> None:
    err = TypeError if bad in NOT_SECONDS or bad is None else ValueError
    me = os.getpid()
    with pytest.raises(err):
        proctable.terminate(me, grace=bad)
    with pytest.raises(err):
        proctable.terminate(me, kill_timeout=bad)
    with pytest.raises((TypeError, ValueError)):
        proctable.ExitWatcher(poll_interval=bad)
    with pytest.raises((TypeError, ValueError)):
        proctable.Lineage(me, interval=bad)
    with pytest.raises((TypeError, ValueError)):
        proctable.Lineage.spawn(["true"], interval=bad)


def test_wait_exit_with_bad_timeout() -> None:
    import asyncio

    for bad in (-1, math.nan, math.inf):
        with pytest.raises(ValueError):
            asyncio.run(proctable.wait_exit(os.getpid(), timeout=bad))
    with pytest.raises(TypeError):
        asyncio.run(proctable.wait_exit(os.getpid(), timeout="1"))  # type: ignore[arg-type]


def test_terminate_refuses_the_callers_own_group_before_any_signal() -> None:
    with pytest.raises(ValueError, match="process group"):
        proctable.terminate(os.getpid(), grace=0, kill_timeout=0, group=True)
    with pytest.raises(TypeError):
        proctable.terminate(os.getpid(), group="yes")  # type: ignore[arg-type]


def test_parse_stat_and_decode_bad_values() -> None:
    bad: Any
    for bad in ("1 (a) S", None, 1, ["1"]):
        with pytest.raises(TypeError):
            proctable.parse_stat(bad)
    for bad in (b"", b"\0" * 4096, b"x" * 1_000_000, b"1 (" + b")" * 100_000):
        with pytest.raises(ValueError):
            proctable.parse_stat(bad)
    for bad in (-1, 2**16, 2**40):
        with pytest.raises(ValueError):
            proctable.decode_wait_status(bad)
    with pytest.raises(TypeError):
        proctable.decode_wait_status("0")  # type: ignore[arg-type]


def test_table_lookups_with_odd_keys() -> None:
    t = proctable.snapshot()
    keys: list[Any] = ["x", -5, 2**70, None, 1.5]  # (0 is the kernel's roots' parent)
    for key in keys:
        assert t.get(key) is None
        assert not t.__contains__(key)
        assert t.children(key) == []
        assert t.descendants(key) == []


def test_closed_watcher_and_scanner() -> None:
    w = proctable.ExitWatcher()
    w.close()
    w.close()  # twice is fine
    with pytest.raises(proctable.WatcherClosed):
        w.watch(os.getpid())
    s = proctable.Scanner()
    s.refresh()
    s.close()
    s.close()
    with pytest.raises(ValueError, match="closed"):
        s.refresh()
    kw: dict[str, Any]
    for kw in ({"max_fds": -1}, {"threads": 0}, {"threads": -1}):
        with pytest.raises(ValueError):
            proctable.Scanner(**kw)
    for kw in ({"max_fds": "8"}, {"max_fds": 1.5}):
        with pytest.raises(TypeError):
            proctable.Scanner(**kw)


def test_lineage_bad_roots_modes_and_commands() -> None:
    for bad in ("x", None, 1.5, [os.getpid()]):
        with pytest.raises(TypeError):
            proctable.Lineage(bad)  # type: ignore[arg-type]
    for mode in ("bogus", "", None, "CGROUP"):
        with pytest.raises(ValueError, match="mode"):
            proctable.Lineage(os.getpid(), mode=mode)  # type: ignore[arg-type]
    for mode in ("cgroup", "subreaper"):
        with pytest.raises(ValueError, match="spawn"):
            proctable.Lineage(os.getpid(), mode=mode)
    with pytest.raises(ValueError, match="empty"):
        proctable.Lineage.spawn([])


@linux_only
@pytest.mark.parametrize("mode", ["auto", "scan", "subreaper", "cgroup"])
def test_lineage_spawn_of_a_missing_command_leaves_nothing(mode: str) -> None:
    if mode == "cgroup" and _cgroup.usable_parent() is None:
        pytest.skip("no writable cgroup v2 here")
    parent = _cgroup.own_cgroup()
    prefix = f"proctable-{os.getpid()}-"

    def ours() -> set[str]:
        if parent is None or not os.path.isdir(parent):
            return set()
        return {n for n in os.listdir(parent) if n.startswith(prefix)}

    before_cg = ours()
    before = {p.pid for p in proctable.snapshot().children(os.getpid())}
    with pytest.raises(FileNotFoundError):
        proctable.Lineage.spawn(["/nonexistent/command"], mode=mode)
    after = {p.pid for p in proctable.snapshot().children(os.getpid())}
    assert after <= before, f"left running: {after - before}"
    assert ours() == before_cg


@linux_only
def test_lineage_after_teardown() -> None:
    lin = proctable.Lineage.spawn(["sleep", "60"], mode="subreaper", interval=0.02)
    report = lin.terminate(grace=2.0, kill_timeout=5.0)
    assert len(report.members) == 1 and not report.unresolved
    assert lin.closed
    for call in (lin.members, lin.sample, lin.terminate):
        with pytest.raises(proctable.LineageClosed):
            call()
    lin.__exit__(None, None, None)  # leaving a with block after terminate: no error
    assert lin.process.wait(timeout=10) is not None


# --- the command line ---------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proctable", *args], capture_output=True,
                          text=True, timeout=60, check=False, env=env)


@pytest.mark.parametrize("args", [
    ["exit", "-1"], ["exit", "abc"], ["exit", "0"], ["exit", "99999999999"], ["exit"],
    ["exit", "--start-time", "x", "1"], ["tree", "0"], ["tree", "x"],
    ["watch", "--timeout", "-1", "1"], ["watch", "--timeout", "nan", "1"], ["watch", "-5"],
    ["ps", "--bogus"], ["bogus"], [],
], ids=" ".join)
def test_cli_usage_errors(args: list[str]) -> None:
    r = _cli(*args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    # A bare `proctable` prints its help on stdout (exit 2); the others complain on stderr.
    assert "usage:" in (r.stderr if args else r.stdout) or "proctable" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_pids_that_name_nothing() -> None:
    for args in (["exit", str(PID_MAX)], ["tree", str(PID_MAX)],
                 ["watch", "--timeout", "1", str(PID_MAX)]):
        r = _cli(*args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert str(PID_MAX) in r.stdout + r.stderr and "Traceback" not in r.stderr


def _marked_processes(mark: str) -> list[int]:
    """Pids whose environment carries mark (root reads every environ)."""
    found = []
    needle = f"PROCTABLE_RELIABILITY_MARK={mark}".encode()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if needle in f.read():
                        found.append(int(d))
            except OSError:
                pass
    return found


@linux_only
@pytest.mark.parametrize(("cmd", "code", "message"), [
    (["/nonexistent/cmd"], 127, "no such file"),
    (["no-such-command-for-proctable"], 127, "command not found"),
    ("NOEXEC", 126, "not executable"),
    ("BADINTERP", 127, "No such file"),
], ids=["path", "name", "not-executable", "bad-interpreter"])
@pytest.mark.parametrize("mode", ["auto", "scan", "subreaper"])
def test_cli_run_of_a_command_that_cannot_run(cmd: Any, code: int, message: str, mode: str,
                                              tmp_path: Any) -> None:
    if cmd in ("BADINTERP", "NOEXEC"):
        script = tmp_path / "bad.sh"
        script.write_text("#!/nonexistent/interpreter\necho never\n")
        script.chmod(0o755 if cmd == "BADINTERP" else 0o644)
        cmd = [str(script)]
    mark = uuid.uuid4().hex
    env = {**os.environ, "PROCTABLE_RELIABILITY_MARK": mark}
    r = _cli("run", "--mode", mode, "--", *cmd, env=env)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""
    if os.geteuid() == 0:
        assert _marked_processes(mark) == [], "a process of the run is still there"
