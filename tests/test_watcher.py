"""The exit watcher and wait_exit, on real processes: lost exits, reaping, identity.

Key tests run three times: with every source the kernel has ("native"), with
pidfd exit info turned off, and without pidfds at all (/proc polling), through
PROCTABLE_DISABLE.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

import proctable
from proctable import ExitStatus
from proctable import _pidfd as pidfd
from proctable.exits._watcher import _default_watcher

from .conftest import KERNEL_PIDFD, KERNEL_PIDFD_INFO, PY, Procs, wait_until, wait_zombie

RESOLVE = 10.0  # generous bound on any single resolution


@pytest.fixture
def watcher(mode: str) -> Iterator[proctable.ExitWatcher]:
    w = proctable.ExitWatcher(poll_interval=0.02)
    assert w.features.pidfd == (mode != "no_pidfd")
    try:
        yield w
    finally:
        w.close()


def test_features_follow_disable_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pidfd.DISABLE_ENV, "pidfd, zombie ,bogus")
    f = pidfd.features()
    assert (f.pidfd, f.pidfd_info, f.zombie) == (False, False, False)
    assert f.waitid
    monkeypatch.delenv(pidfd.DISABLE_ENV)
    assert pidfd.features().pidfd == KERNEL_PIDFD


def test_lost_popen_exit_resolves_and_popen_wait_still_works(
    procs: Procs, watcher: proctable.ExitWatcher
) -> None:
    """The runtime never waits: the watcher still answers, and reaps nothing."""
    p = procs.py("import os, time; time.sleep(0.2); os._exit(7)")
    fut = watcher.watch(p)
    status = fut.result(RESOLVE)
    assert status == ExitStatus(7, None, False, 7 << 8)
    assert fut.source == "waitid"
    assert fut.identity is not None and fut.identity.pid == p.pid
    assert p.returncode is None  # the watcher did not touch the Popen
    assert p.wait(timeout=10) == 7


def test_forked_child_reaped_only_after_the_watcher_resolved(
    procs: Procs, watcher: proctable.ExitWatcher
) -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        time.sleep(0.1)
        os._exit(3)
    procs.pids.append(pid)
    assert watcher.watch(pid).result(RESOLVE).code == 3
    # Still unreaped: our own waitpid gets the real status afterwards.
    assert os.waitpid(pid, 0) == (pid, 3 << 8)


def test_signal_death_and_zombie_at_watch_time(
    procs: Procs, watcher: proctable.ExitWatcher
) -> None:
    p = procs.popen(["sleep", "60"])
    os.kill(p.pid, signal.SIGKILL)
    wait_zombie(p.pid)
    fut = watcher.watch(p.pid)
    assert fut.done()  # an exit that happened already is answered inside watch()
    assert fut.result() == ExitStatus(None, signal.SIGKILL, False, signal.SIGKILL)
    assert p.wait(timeout=10) == -signal.SIGKILL


_GRANDCHILD = r"""
import os, sys
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(w)
    os.read(r, 1)   # exit when the test says so
    os._exit(5)
os.close(r)
print(pid, flush=True)
sys.stdin.readline()
os.write(w, b"x")
got, status = os.waitpid(pid, 0)   # its own parent reaps it at once
print(status, flush=True)
sys.stdin.readline()
"""


def _grandchild(procs: Procs) -> tuple[subprocess.Popen[bytes], int]:
    mid = procs.py(_GRANDCHILD, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert mid.stdout is not None
    return mid, int(mid.stdout.readline())


def _release(mid: subprocess.Popen[bytes]) -> int:
    assert mid.stdin is not None and mid.stdout is not None
    mid.stdin.write(b"go\n")
    mid.stdin.flush()
    return int(mid.stdout.readline())


def test_grandchild_reaped_by_its_own_parent(procs: Procs, mode: str,
                                             watcher: proctable.ExitWatcher) -> None:
    """Not our child, reaped by its parent at once: the watcher still gives the status."""
    mid, gpid = _grandchild(procs)
    fut = watcher.watch(gpid)
    assert not fut.done()
    assert _release(mid) == 5 << 8
    if mode == "native" and KERNEL_PIDFD_INFO:
        assert fut.result(RESOLVE).code == 5
        assert fut.source in ("zombie", "pidfd_info")
    else:
        # Without pidfd exit info the zombie may be gone before anyone looks:
        # then the answer is a clear ExitUnknown, never a hang or a guess.
        exc = fut.exception(RESOLVE)
        if exc is None:
            assert fut.result().code == 5
            assert fut.source == "zombie"
        else:
            assert isinstance(exc, proctable.ExitUnknown) and exc.pid == gpid


@pytest.mark.skipif(not KERNEL_PIDFD_INFO, reason="no PIDFD_GET_INFO on this kernel")
def test_grandchild_status_from_pidfd_info(procs: Procs, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the zombie decode off, only pidfs's exit info can answer: it does."""
    monkeypatch.setenv(pidfd.DISABLE_ENV, "zombie")
    with proctable.ExitWatcher() as w:
        mid, gpid = _grandchild(procs)
        fut = w.watch(gpid)
        _release(mid)
        status = fut.result(RESOLVE)
    if fut.source is None:  # pragma: no cover
        pytest.fail("resolved without a source")
    if status.code == 5 and fut.source == "pidfd_info":
        return
    pytest.fail(f"got {status} from {fut.source}")  # pragma: no cover


def test_no_source_left_fails_clearly(procs: Procs, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit info and zombie decode off, not our child: ExitUnknown, not a hang."""
    monkeypatch.setenv(pidfd.DISABLE_ENV, "zombie,pidfd_info")
    with proctable.ExitWatcher() as w:
        mid, gpid = _grandchild(procs)
        fut = w.watch(gpid)
        _release(mid)
        with pytest.raises(proctable.ExitUnknown, match=str(gpid)):
            fut.result(RESOLVE)


def test_two_watches_of_one_process_each_resolve_once(
    procs: Procs, watcher: proctable.ExitWatcher
) -> None:
    p = procs.popen(["sleep", "60"])
    calls: list[object] = []
    futs = [watcher.watch(p), watcher.watch(p.pid)]
    with proctable.ExitWatcher() as other:
        futs.append(other.watch(p.pid))
        for f in futs:
            f.add_done_callback(calls.append)
        os.kill(p.pid, signal.SIGTERM)
        results = [f.result(RESOLVE) for f in futs]
    assert all(r.signal == signal.SIGTERM for r in results)
    time.sleep(0.1)  # a second resolution would show up as a second callback
    assert sorted(map(id, calls)) == sorted(map(id, futs))
    assert watcher.pending == 0


def test_reap_true_reaps_our_child(procs: Procs, watcher: proctable.ExitWatcher) -> None:
    p = procs.py("import os; os._exit(4)")
    assert watcher.watch(p, reap=True).result(RESOLVE).code == 4
    wait_until(lambda: p.returncode is not None)  # Popen.poll() did the reaping
    assert p.returncode == 4
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(6)
    procs.pids.append(pid)
    assert watcher.watch(pid, reap=True).result(RESOLVE).code == 6
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_popen_reaped_already_answers_from_returncode(procs: Procs) -> None:
    p = procs.py("import os; os._exit(9)")
    p.wait(timeout=10)
    with proctable.ExitWatcher() as w:
        fut = w.watch(p)
        assert fut.done() and fut.result().code == 9 and fut.source == "popen"


def test_gone_or_reused_at_watch_time_is_an_immediate_answer(
    procs: Procs, watcher: proctable.ExitWatcher
) -> None:
    p = procs.popen(["sleep", "60"])
    ident = proctable.identity(p.pid)
    assert ident is not None
    # Another start time (or another pidfs handle): the pid names another process.
    for wrong in (ident._replace(start_time=ident.start_time + 1),
                  ident._replace(handle=(ident.handle or 0) + 1)):
        if wrong.handle is not None and wrong.handle != ident.handle and not watcher.features.pidfd:
            continue  # a handle can only be checked through a pidfd
        fut = watcher.watch(wrong)
        assert fut.done()
        with pytest.raises(proctable.NoSuchProcess, match="another process"):
            fut.result()
    # The right identity watches fine.
    fut = watcher.watch(ident)
    assert not fut.done()
    p.kill()
    assert fut.result(RESOLVE).signal == signal.SIGKILL
    p.wait(timeout=10)
    # The pid is gone now (reaped): an immediate NoSuchProcess.
    if proctable.read(p.pid) is None:
        fut = watcher.watch(p.pid)
        assert fut.done()
        with pytest.raises(proctable.NoSuchProcess):
            fut.result()


def test_bad_targets_are_refused_before_anything() -> None:
    """Harmless types only here; pid 0 and -1 are tested in a private pid namespace."""
    with proctable.ExitWatcher() as w:
        for bad in ("123", 1.0, None, True, object(), [1]):
            with pytest.raises(TypeError):
                w.watch(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="out of range"):
            w.watch(2**40)
        with pytest.raises(TypeError):
            w.watch(os.getpid(), reap=1)  # type: ignore[arg-type]
        assert w.pending == 0


def test_closed_watcher_refuses_and_cancels_pending(procs: Procs, mode: str) -> None:
    p = procs.popen(["sleep", "60"])
    w = proctable.ExitWatcher()
    fut = w.watch(p)
    assert not fut.done() and w.pending == 1
    t0 = time.monotonic()
    w.close()
    assert fut.cancelled()
    assert time.monotonic() - t0 < 5
    with pytest.raises(proctable.WatcherClosed):
        w.watch(p)
    w.close()  # twice is fine
    with proctable.ExitWatcher() as w2:
        pass
    with pytest.raises(proctable.WatcherClosed):
        w2.watch(p)
    assert p.poll() is None  # nothing was signaled or reaped


def test_cancel_ends_the_watch(procs: Procs, watcher: proctable.ExitWatcher) -> None:
    p = procs.popen(["sleep", "60"])
    fut = watcher.watch(p)
    assert watcher.pending == 1
    fut.cancel()
    wait_until(lambda: watcher.pending == 0, timeout=RESOLVE)


def test_wait_exit_result_and_timeout(procs: Procs, mode: str) -> None:
    p = procs.popen(["sleep", "60"])
    q = procs.py("import os, time; time.sleep(0.1); os._exit(12)")

    async def main() -> tuple[ExitStatus, float]:
        t0 = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await proctable.wait_exit(p, timeout=0.2)
        waited = time.monotonic() - t0
        return await proctable.wait_exit(q, timeout=RESOLVE), waited

    status, waited = asyncio.run(main())
    assert status.code == 12
    assert 0.15 < waited < 5
    assert q.wait(timeout=10) == 12
    # The timed-out watch did not stay behind, and p was not touched.
    wait_until(lambda: _default_watcher().pending == 0, timeout=RESOLVE)
    assert p.poll() is None


def test_wait_exit_gone_pid(procs: Procs) -> None:
    p = procs.py("pass")
    p.wait(timeout=10)
    if proctable.read(p.pid) is not None:  # pragma: no cover - reused already
        pytest.skip("pid reused")
    with pytest.raises(proctable.NoSuchProcess):
        asyncio.run(proctable.wait_exit(p.pid, timeout=RESOLVE))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.slow
def test_a_thousand_watches_cost_one_thread(procs: Procs) -> None:
    n = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 200:
        if hard != resource.RLIM_INFINITY and hard < n + 200:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is too low for {n} pidfds")
        resource.setrlimit(resource.RLIMIT_NOFILE, (n + 200, hard))
    ps = [procs.popen(["sleep", "120"]) for _ in range(n)]
    before_py, before_os = threading.active_count(), _threads()
    with proctable.ExitWatcher() as w:
        futs = [w.watch(p) for p in ps]
        assert w.pending == n
        assert threading.active_count() == before_py + 1
        assert _threads() == before_os + 1
        assert not any(f.done() for f in futs)
        for p in ps:
            os.kill(p.pid, signal.SIGKILL)
        _, not_done = concurrent.futures.wait(futs, 60)
        assert not not_done
        assert all(f.result().signal == signal.SIGKILL for f in futs)
        assert w.pending == 0
    for p in ps:
        assert p.wait(timeout=10) == -signal.SIGKILL


# --- the command line -------------------------------------------------------


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "proctable", "watch", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_cli_watch_prints_each_exit(procs: Procs) -> None:
    a = procs.popen(["sleep", "60"])
    b = procs.py("import os, sys; sys.stdin.readline(); os._exit(3)", stdin=subprocess.PIPE)
    cmd = procs.popen([PY, "-m", "proctable", "watch", "--json", "--timeout", "30",
                       str(a.pid), str(b.pid)], stdout=subprocess.PIPE, text=True)
    assert cmd.stdout is not None
    time.sleep(0.5)  # let it start watching (a missed start is answered anyway)
    a.kill()
    first = json.loads(cmd.stdout.readline())
    assert first["pid"] == a.pid and first["status"]["signal"] == signal.SIGKILL
    assert first["v"] == 1 and first["type"] == "exit" and first["name"] == "sleep"
    assert first["outcome"] == "exited" and first["source"] in ("zombie", "pidfd_info")
    assert b.stdin is not None
    b.stdin.write(b"\n")
    b.stdin.flush()
    second = json.loads(cmd.stdout.readline())
    assert second["pid"] == b.pid and second["status"]["returncode"] == 3
    assert cmd.wait(timeout=30) == 0
    a.wait(timeout=10)
    b.wait(timeout=10)


def test_cli_watch_text_timeout_and_errors(procs: Procs) -> None:
    p = procs.popen(["sleep", "60"])
    r = _cli("--timeout", "0.2", str(p.pid))
    assert r.returncode == 1 and "still running" in r.stderr
    for bad in ("0", "-1", "abc", str(2**31)):
        r = _cli(bad)
        assert r.returncode == 2 and "not a pid" in r.stderr
    gone = procs.py("pass")
    gone.wait(timeout=10)
    if proctable.read(gone.pid) is None:
        r = _cli(str(gone.pid))
        assert r.returncode == 1 and "no such process" in r.stderr
    z = procs.py("import os; os._exit(2)")
    wait_zombie(z.pid)
    r = _cli(str(z.pid))
    assert r.returncode == 0, r.stderr
    name = proctable.read(z.pid).name  # type: ignore[union-attr]
    assert r.stdout == f"{z.pid} {name}: exited, exit code 2 (seen by zombie)\n"
    assert z.wait(timeout=10) == 2


# --- pid 0 and -1, inside a private pid namespace ----------------------------

_REFUSALS = r"""
import asyncio, os, sys
import proctable
assert os.getpid() == 1, os.getpid()   # a private pid namespace: nothing else to hit
bad = 0
calls = [
    lambda t: proctable.terminate(t, grace=0.1, kill_timeout=0.1),
    lambda t: proctable.terminate(t, grace=0.1, kill_timeout=0.1, group=True),
    lambda t: proctable.ExitWatcher().watch(t),
    lambda t: asyncio.run(proctable.wait_exit(t, timeout=0.1)),
]
# Identity(0, 1) and Identity(-1, 1) are refused when made (issue 30, item 10).
for target in (0, -1, -2, True, False, 1.0, "1", None, lambda: proctable.Identity(0, 1),
               lambda: proctable.Identity(-1, 1)):
    for call in calls:
        try:
            call(target() if callable(target) else target)
        except (ValueError, TypeError):
            continue
        print("NOT REFUSED", repr(target), flush=True)
        bad += 1
print("refused all" if not bad else "FAILED", flush=True)
sys.exit(1 if bad else 0)
"""


def test_pid_zero_and_minus_one_are_refused_in_a_private_pid_namespace() -> None:
    base = ["unshare", "-p", "-f", "--mount-proc"]
    if os.geteuid() != 0:
        base = ["unshare", "-r", "-p", "-f", "--mount-proc"]
    try:
        probe = subprocess.run([*base, "true"], capture_output=True, timeout=30, check=False)
    except FileNotFoundError:
        pytest.skip("no unshare(1) here")
    if probe.returncode != 0:
        pytest.skip(f"unshare -p not permitted here: {probe.stderr.decode().strip()}")
    r = subprocess.run([*base, sys.executable, "-c", _REFUSALS], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "refused all"
