"""The leaked-process plugin, run by pytester on small test files that leak in each
way and that do not leak, in a real pytest subprocess (the entry point loads it).

Every process the inner runs leave is written down, as (pid, start time), by the
helpers that start it; the outer test ends each of them at its end, whatever the
plugin under test did.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator

import pytest

import proctable

from ._reliability import linux_only
from .conftest import needs_root

pytestmark = linux_only

PIDS_VAR = "LEAK_PIDS"

# The inner runs' helpers: start processes in every shape, and write the (pid,
# start time) of each one they leave to $LEAK_PIDS, for the outer test's cleanup.
HELPERS = '''
import os, subprocess, sys, tempfile, time

def record(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        start = int(f.read().rsplit(b")", 1)[1].split()[19])
    with open(os.environ["LEAK_PIDS"], "a") as f:
        f.write(f"{pid} {start}\\n")

def shell(script):
    # script ends with 'echo $! > "$PIDOUT"': the pid of what it left running
    fd, out = tempfile.mkstemp()
    os.close(fd)
    try:
        subprocess.run(["sh", "-c", script], check=True, env=dict(os.environ, PIDOUT=out),
                       **QUIET)
        deadline = time.monotonic() + 30
        while True:  # a background subshell writes it a moment later
            with open(out) as f:
                text = f.read()
            if text.endswith("\\n") or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    finally:
        os.unlink(out)
    pid = int(text)
    record(pid)
    while time.monotonic() < deadline:  # until it runs what it was asked to run
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "sleep":
                    break
        except OSError:
            break
        time.sleep(0.01)

QUIET = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
# (a leak that holds pytest-xdist's pipes keeps its worker from ending for a while)

def child():
    p = subprocess.Popen(["sleep", "600"], **QUIET)
    record(p.pid)
    return p

def nohup():
    shell('nohup sleep 601 >/dev/null 2>&1 & echo $! > "$PIDOUT"')

def setsid():
    shell('setsid sleep 602 >/dev/null 2>&1 & echo $! > "$PIDOUT"')

def double_fork_shell():
    shell('(sleep 603 >/dev/null 2>&1 & echo $! > "$PIDOUT") &')

def double_fork_python():
    # a pure-Python daemon: fork, setsid, fork again, never exec
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.close(r)
            # as a daemon does: no fd of its parent's but its report pipe (the
            # worker's execnet pipes held open kept pytest-xdist waiting ~20 s)
            os.closerange(3, w)
            os.closerange(w + 1, 1 << 16)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            record(os.getpid())
            os.write(w, b"x")
            os.close(w)
            time.sleep(604)
            os._exit(0)
        os._exit(0)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)

def scrubbed():
    p = subprocess.Popen(["sleep", "605"], env={}, **QUIET)  # no environment at all
    record(p.pid)
    return p
'''


@pytest.fixture
def pids_file(monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """$LEAK_PIDS for the inner runs; what they left is ended by (pid, start time)."""
    fd, name = tempfile.mkstemp(prefix="proctable-leak-pids-")
    os.close(fd)
    path = pathlib.Path(name)
    os.chmod(path, 0o666)  # an unprivileged inner run writes to it too
    monkeypatch.setenv(PIDS_VAR, str(path))
    try:
        yield path
    finally:
        for ident in _recorded(path):
            proctable.terminate(ident, grace=0.0, kill_timeout=5.0)
        path.unlink()


def _recorded(path: pathlib.Path) -> list[proctable.Identity]:
    out = []
    for line in path.read_text().splitlines():
        pid, start = (int(x) for x in line.split())
        out.append(proctable.Identity(pid, start))
    return out


def _running(path: pathlib.Path) -> list[proctable.Identity]:
    return [i for i in _recorded(path) if i.alive()]


@pytest.fixture
def inner(pytester: pytest.Pytester, pids_file: pathlib.Path,
          monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # An inner run is no xdist worker, even when this suite runs under -n: with
    # the variable, pytest-benchmark warns that xdist is active (an error under -W).
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makepyfile(leakhelpers=HELPERS)
    pytester.makeini("[pytest]\nleaked_processes_grace = 0.5\n")
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=120)


LEAKY = '''
import leakhelpers as h

def test_child():
    h.child()

def test_nohup():
    h.nohup()

def test_setsid():
    h.setsid()

def test_double_fork_shell():
    h.double_fork_shell()

def test_double_fork_python():
    h.double_fork_python()

def test_scrubbed_environment():
    h.scrubbed()

def test_clean():
    h.child().kill()
'''


def _leak_lines(out: str) -> dict[str, list[str]]:
    """The summary: node id -> its leak lines."""
    lines = out.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if "leaked processes:" in line)
    except StopIteration:
        return {}
    found: dict[str, list[str]] = {}
    current = ""
    for line in lines[start + 1:]:
        if line.startswith("=") or not line.strip():
            break
        if line.startswith("    "):
            found.setdefault(current, []).append(line.strip())
        else:
            current = line.strip()
    return found


# --- inactive unless asked -------------------------------------------------------------


def test_inactive_without_the_option(inner: pytest.Pytester,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # What the inner run inherits (this suite may run under the plugin itself).
    monkeypatch.setenv("OUTER_SCOPE", os.environ.get("PROCTABLE_LEAK_SCOPE", "-"))
    inner.makepyfile(test_it='''
        import os, leakhelpers as h
        def test_leak_unseen():
            # the run does not touch the environment
            assert os.environ.get("PROCTABLE_LEAK_SCOPE", "-") == os.environ["OUTER_SCOPE"]
            h.child()
    ''')
    r = run(inner)
    r.assert_outcomes(passed=1)
    assert "leaked processes" not in r.stdout.str()
    assert "LeakedProcessWarning" not in r.stdout.str()
    # the marker is registered all the same (--strict-markers users can mark tests)
    r = run(inner, "--markers")
    assert "allow_leaked_processes" in r.stdout.str()


def test_registered_as_a_pytest11_entry_point() -> None:
    import importlib.metadata as md

    eps = md.entry_points()
    group = (eps.select(group="pytest11") if hasattr(eps, "select")
             else eps.get("pytest11", []))  # type: ignore[attr-defined]
    assert {ep.name: ep.value for ep in group}.get("proctable") == "proctable.pytest_plugin"


def test_bad_mode_is_a_usage_error(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_it="def test_x(): pass")
    r = run(inner, "-o", "leaked_processes=sometimes")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    assert "leaked_processes" in r.stderr.str()


# --- warn: every way of escaping, named -------------------------------------------------


def test_a_child_that_left_the_session_is_named_new_session(inner: pytest.Pytester,
                                                            pids_file: pathlib.Path) -> None:
    # A direct child that called setsid is still below pytest: what it escaped is
    # the session, and that is what the report names.
    inner.makepyfile(test_it='''
        import subprocess, leakhelpers as h
        def test_new_session_child():
            p = subprocess.Popen(["sleep", "606"], start_new_session=True, **h.QUIET)
            h.record(p.pid)
    ''')
    r = run(inner, "--leaked-processes=warn")
    r.assert_outcomes(passed=1, warnings=1)
    (line,) = _leak_lines(r.stdout.str())["test_it.py::test_new_session_child"]
    assert re.search(r"'sleep' \(new session\): sleep 606$", line), line


def test_warn_names_every_escape_and_how(inner: pytest.Pytester,
                                         pids_file: pathlib.Path) -> None:
    inner.makepyfile(test_leaky=LEAKY)
    r = run(inner, "--leaked-processes=warn")
    r.assert_outcomes(passed=7, warnings=6)
    found = _leak_lines(r.stdout.str())
    expect = {
        "test_leaky.py::test_child": r"'sleep' \(child\): sleep 600$",
        "test_leaky.py::test_nohup": r"'sleep' \(re-parented orphan\): sleep 601$",
        "test_leaky.py::test_setsid": r"'sleep' \(new session\): sleep 602$",
        "test_leaky.py::test_double_fork_shell": r"'sleep' \(re-parented orphan\): sleep 603$",
        "test_leaky.py::test_double_fork_python": r"'python[0-9.]*' \(new session\): .*pytest",
        "test_leaky.py::test_scrubbed_environment": r"'sleep' \(child\): sleep 605$",
    }
    assert set(found) == set(expect), r.stdout.str()
    for nodeid, pattern in expect.items():
        (line,) = found[nodeid]
        assert re.match(r"pid \d+ ", line) and re.search(pattern, line), line
    # each one is really one of those it left, and still runs
    left = {i.pid for i in _running(pids_file)}
    reported = {int(ln.split()[1]) for lines in found.values() for ln in lines}
    assert reported == left and len(left) == 6
    assert "LeakedProcessWarning" in r.stdout.str()


def test_fail_is_an_error_in_teardown(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_leaky=LEAKY)
    r = run(inner, "--leaked-processes=fail")
    r.assert_outcomes(passed=7, errors=6)
    out = r.stdout.str()
    for name in ("test_child", "test_nohup", "test_setsid", "test_double_fork_shell",
                 "test_double_fork_python", "test_scrubbed_environment"):
        assert f"ERROR at teardown of {name}" in out, out
    assert "ERROR at teardown of test_clean" not in out
    assert "test_leaky.py::test_child left 1 process(es) running" in out
    assert r.ret == pytest.ExitCode.TESTS_FAILED


def test_kill_ends_them_and_nothing_else(inner: pytest.Pytester,
                                         pids_file: pathlib.Path) -> None:
    # An unrelated process of ours, started before the inner run (so it carries no
    # scope of it), must survive a kill-mode run untouched.
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        inner.makepyfile(test_leaky=LEAKY)
        r = run(inner, "--leaked-processes=kill")
        r.assert_outcomes(passed=7, warnings=6)
        found = _leak_lines(r.stdout.str())
        lines = [ln for lines in found.values() for ln in lines]
        assert len(lines) == 6 and all(ln.endswith("[killed]") for ln in lines), lines
        assert len(_recorded(pids_file)) == 7  # the six leaks, and test_clean's own
        assert _running(pids_file) == []  # nothing the inner run left runs any more
        assert bystander.poll() is None
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait(timeout=10)


# --- what is not a leak ---------------------------------------------------------------


CLEAN = '''
import os, signal, subprocess, sys, time
import pytest
import leakhelpers as h

def test_run():
    subprocess.run(["sleep", "0.01"], check=True)

def test_popen_waited():
    p = h.child()
    p.terminate()
    assert p.wait(timeout=10) == -signal.SIGTERM

def test_terminated_without_waiting():
    # SIGTERM sent, exit not awaited: the grace covers it
    h.child().terminate()

def test_zombie_left():
    # an exited child nobody reaped does not run: no leak
    p = subprocess.Popen(["true"])
    while open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)

@pytest.fixture
def server():
    p = h.child()
    yield p
    p.kill()
    p.wait(timeout=10)

def test_fixture_cleans_up(server):
    assert server.poll() is None

@pytest.mark.allow_leaked_processes(reason="the leak is the point")
def test_allowed():
    h.child()
'''


def test_clean_tests_and_the_marker_report_nothing(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_clean=CLEAN)
    r = run(inner, "--leaked-processes=fail", "-W", "error::pytest.PytestWarning")
    r.assert_outcomes(passed=6)
    assert "leaked processes" not in r.stdout.str()


def test_subprocess_reaping_is_untouched(inner: pytest.Pytester) -> None:
    # The plugin looks at the table between tests; the children's exit statuses
    # stay with their Popen (no reaping, no re-parenting).
    inner.makepyfile(test_reap='''
        import os, subprocess, sys, time
        import pytest
        procs = {}

        def _zombie(pid):
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"

        def test_start():
            procs["a"] = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"])
            procs["b"] = subprocess.Popen(["sh", "-c", "exit 9"])
            # Exited, not reaped, before the test ends (a child still starting at the
            # test's end would be a leak, and rightly reported).
            deadline = time.monotonic() + 30
            while not all(_zombie(p.pid) for p in procs.values()):
                assert time.monotonic() < deadline
                time.sleep(0.01)

        def test_reap_later():
            assert procs["a"].wait(timeout=20) == 7
            assert procs["b"].wait(timeout=20) == 9

        def test_waitpid_any():
            pid = os.fork()
            if pid == 0:
                os._exit(5)
            got, status = os.waitpid(-1, 0)
            assert got == pid and os.waitstatus_to_exitcode(status) == 5
    ''')
    r = run(inner, "--leaked-processes=fail")
    r.assert_outcomes(passed=3)


# --- fixtures of wider scope ------------------------------------------------------------


FIXTURES = '''
import pytest
import leakhelpers as h

@pytest.fixture(scope="session")
def session_server():
    yield h.child()  # never stopped

@pytest.fixture(scope="module")
def module_server():
    p = h.child()
    yield p  # never stopped either

@pytest.fixture(scope="module")
def tidy_server():
    p = h.child()
    yield p
    p.kill()
    p.wait(timeout=10)

def test_first(module_server, session_server, tidy_server):
    pass

def test_second(module_server, session_server, tidy_server):
    pass

def test_last():
    pass
'''


def test_wider_fixtures_are_blamed_not_the_first_test(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_fix=FIXTURES)
    r = run(inner, "--leaked-processes=fail")
    # the module's and the session's fixture leaks fail the teardown they come with
    r.assert_outcomes(passed=3, errors=1)
    out = r.stdout.str()
    assert "ERROR at teardown of test_last" in out
    assert "module-scoped fixture 'module_server' (test_fix.py) left 1 process(es)" in out
    found = _leak_lines(out)
    (nodeid,) = found  # not test_first, which set them up, nor test_second
    assert nodeid == "test_fix.py::test_last"
    scopes = sorted(re.sub(r".*\[(.*)\]$", r"\1", ln) for ln in found[nodeid])
    assert scopes == ["module-scoped fixture 'module_server' (test_fix.py)",
                      "session-scoped fixture 'session_server' (session)"]


# --- the ini option, and off -------------------------------------------------------------


def test_ini_option_and_off_on_the_command_line(inner: pytest.Pytester) -> None:
    inner.makeini("[pytest]\nleaked_processes = fail\nleaked_processes_grace = 0.5\n")
    inner.makepyfile(test_it="import leakhelpers as h\ndef test_leak(): h.child()\n")
    run(inner).assert_outcomes(passed=1, errors=1)
    run(inner, "--leaked-processes=off").assert_outcomes(passed=1)


# --- pytest-xdist -------------------------------------------------------------------


def test_xdist_workers_each_guard_their_tests(inner: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    inner.makepyfile(test_leaky=LEAKY)
    inner.makepyfile(test_clean=CLEAN)
    r = run(inner, "-n", "2", "--leaked-processes=fail")
    r.assert_outcomes(passed=13, errors=6)
    found = _leak_lines(r.stdout.str())  # the controller's summary, from the workers
    assert set(found) == {f"test_leaky.py::{n}" for n in (
        "test_child", "test_nohup", "test_setsid", "test_double_fork_shell",
        "test_double_fork_python", "test_scrubbed_environment")}, r.stdout.str()
    assert "ERROR at teardown of" in r.stdout.str()


# --- without root -----------------------------------------------------------------------


@pytest.fixture
def open_dir() -> Iterator[pathlib.Path]:
    """A directory that uid 65534 may use (pytest's own tmp_path is root's only)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="proctable-plugin-"))
    try:
        os.chmod(path, 0o777)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_works_as_an_unprivileged_user(open_dir: pathlib.Path, pids_file: pathlib.Path) -> None:
    # pytest run in a forked child that dropped to uid 65534 (no exec: this
    # interpreter may live where 65534 may not enter)
    work = open_dir
    (work / "leakhelpers.py").write_text(HELPERS)
    (work / "test_leaky.py").write_text(LEAKY)
    (work / "pytest.ini").write_text("[pytest]\nleaked_processes_grace = 0.5\n")
    for p in work.iterdir():
        os.chmod(p, 0o666)
    out = work / "out.txt"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            # What pytest imports late, while the interpreter's files are readable
            # (they may live where 65534 may not look); and no other plugin (they
            # import more, late).
            import sysconfig
            sysconfig.get_config_vars()
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.chdir(work)
            sys.path.insert(0, str(work))
            f = open(out, "w")  # noqa: SIM115 - the child ends with os._exit
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            sys.stdout = sys.stderr = f  # not the outer run's capture
            code = int(pytest.main(["-p", "proctable.pytest_plugin", "-p", "no:cacheprovider",
                                    "-q", "--leaked-processes=warn",
                                    "--rootdir", str(work), "-c", str(work / "pytest.ini"),
                                    str(work)]))
            f.flush()
        except BaseException as exc:
            import traceback
            with open(out, "a") as f2:
                f2.write(f"\nthe child failed: {exc!r}\n{traceback.format_exc()}")
        finally:
            os._exit(code)
    status = _wait_child(pid, timeout=120)
    text = out.read_text()
    assert os.waitstatus_to_exitcode(status) == 0, text
    found = _leak_lines(text)
    assert len(found) == 6, text
    reported = {int(ln.split()[1]) for lines in found.values() for ln in lines}
    assert reported == {i.pid for i in _running(pids_file)}
    for pid in reported:
        row = proctable.read(pid)
        assert row is not None and row.uid == 65534


def _wait_child(pid: int, timeout: float) -> int:
    """waitpid, bounded: the child is killed (and reaped) if it overruns."""
    deadline = time.monotonic() + timeout
    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the unprivileged pytest did not finish in {timeout} s")
        time.sleep(0.05)


def test_summary_is_one_line_per_leak(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_it=textwrap.dedent('''
        import leakhelpers as h
        def test_two():
            h.child(); h.child()
    '''))
    r = run(inner, "--leaked-processes=warn")
    found = _leak_lines(r.stdout.str())
    assert list(found) == ["test_it.py::test_two"] and len(found["test_it.py::test_two"]) == 2
    assert "leaked processes: 2 from 1 test(s)" in r.stdout.str()


# --- multiprocessing: the forkserver is exempt, never what it forks ----------------------


FORKSERVER = '''
import multiprocessing, time
import leakhelpers as h

CTX = multiprocessing.get_context("forkserver")

def _start(target, *args):
    # daemon: the inner run's exit ends it (a non-daemon one would be joined)
    p = CTX.Process(target=target, args=args, daemon=True)
    p.start()
    h.record(p.pid)
    return p

def test_starts_the_forkserver():
    # the forkserver starts here, and stays for the run: a service, not a leak.
    # Its child waits until it is recorded (one that slept 0 s was gone, reaped by
    # the forkserver, before record() read its stat file, once under load).
    go = CTX.Event()
    p = _start(go.wait, 30)
    go.set()
    p.join(timeout=30)
    assert p.exitcode == 0

def test_leaves_a_forkserver_child():
    _start(time.sleep, 607)

def test_clean_after():
    pass
'''


@pytest.mark.parametrize("args", [("--leaked-processes=warn",),
                                  ("--leaked-processes=kill",),
                                  ("--leaked-processes=fail", "-n", "2")],
                         ids=["warn", "kill", "fail-xdist"])
def test_a_forkserver_child_left_running_is_a_leak(inner: pytest.Pytester,
                                                   pids_file: pathlib.Path,
                                                   args: tuple[str, ...]) -> None:
    # It is a fork of the forkserver and carries its command line (and the
    # environment of the test that started the forkserver): the default start
    # method on Linux from Python 3.14.
    if "-n" in args:
        pytest.importorskip("xdist")
        # one worker per file: the forkserver is started in the same worker
        args = (*args, "--dist", "loadfile")
    inner.makepyfile(test_fs=FORKSERVER)
    r = run(inner, *args)
    out = r.stdout.str()
    found = _leak_lines(out)
    assert list(found) == ["test_fs.py::test_leaves_a_forkserver_child"], out
    (line,) = found["test_fs.py::test_leaves_a_forkserver_child"]
    # told under the test that left it, not the one that started the forkserver
    assert "multiprocessing.forkserver" in line and not re.search(r"  \[.*\]$", line), line
    leaked = int(line.split()[1])
    # the one it left (the inner run's exit has ended it since: it was a daemon)
    assert leaked == _recorded(pids_file)[1].pid
    if "-n" in args:
        r.assert_outcomes(passed=3, errors=1)
    else:
        r.assert_outcomes(passed=3, warnings=1)
    if "--leaked-processes=kill" in args:
        assert line.endswith(" [killed]"), line


def test_an_orphaned_fork_of_a_forkserver_child_is_a_leak(inner: pytest.Pytester,
                                                         pids_file: pathlib.Path) -> None:
    # A forkserver child forks (no exec) and exits: the grandchild, with the
    # forkserver's command line, is adopted by the nearest subreaper, here the
    # pytest process itself. Only what the kernel says tells it from the forkserver:
    # it forked without an exec since.
    inner.makepyfile(test_orphan='''
        import ctypes, multiprocessing, os, time
        import leakhelpers as h

        def _leave_a_fork(seconds):
            r, w = os.pipe()
            if os.fork() == 0:
                os.close(r)
                h.record(os.getpid())
                os.write(w, b"x")
                time.sleep(seconds)
                os._exit(0)
            os.close(w)
            os.read(r, 1)

        def test_orphan():
            PR_SET_CHILD_SUBREAPER = 36
            assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            p = multiprocessing.get_context("forkserver").Process(
                target=_leave_a_fork, args=(608,), daemon=True)
            p.start()
            p.join(timeout=30)
            assert p.exitcode == 0
    ''')
    r = run(inner, "--leaked-processes=warn")
    r.assert_outcomes(passed=1, warnings=1)
    found = _leak_lines(r.stdout.str())
    (line,) = found["test_orphan.py::test_orphan"]
    assert "multiprocessing.forkserver" in line, line
    assert int(line.split()[1]) == _recorded(pids_file)[0].pid


# --- where a warning points -------------------------------------------------------------


def test_a_leak_warning_points_at_the_test(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_where=textwrap.dedent('''
        import leakhelpers as h


        def test_leaks_here():
            h.child()
    '''))
    r = run(inner, "--leaked-processes=warn")
    r.assert_outcomes(passed=1, warnings=1)
    out = r.stdout.str()
    # pytest's warnings summary: "<file>:<line>: LeakedProcessWarning: ...", at the
    # test function's def line
    source = (inner.path / "test_where.py").read_text().splitlines()
    line = source.index("def test_leaks_here():") + 1
    where = re.findall(r"^\s*(\S+):(\d+): LeakedProcessWarning", out, re.M)
    assert [(pathlib.Path(f).name, int(n)) for f, n in where] == [("test_where.py", line)], out
    assert "pytest_plugin.py" not in out, out
