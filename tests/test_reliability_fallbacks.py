"""Hosts without the new kernel features, forced with PROCTABLE_DISABLE.

``PROCTABLE_DISABLE`` (comma separated) turns off exit sources (``pidfd``,
``pidfd_info``, ``waitid``, ``zombie``) and lineage backends (``proc_connector``,
``cgroup``) on a kernel that has them all. Here every combination of exit
sources answers a real exit correctly, or says it cannot know (``ExitUnknown``,
``None``) exactly where no enabled source could; lineages tear down fully
without pidfds, the proc connector or a cgroup; and the exit test files run
again in a subprocess without pidfds (Linux before 5.3). PROCTABLE_SLOW_TESTS=1
reruns more of the suite under more combinations.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any, Optional

import pytest

import proctable
from proctable import _pidfd
from proctable.exits._watcher import _reset_default_watcher

from ._reliability import SLOW, linux_only, wait_for

pytestmark = linux_only

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL_PIDFD, KERNEL_INFO = _pidfd._probe_kernel().pidfd, _pidfd._probe_kernel().info
SOURCES = ("pidfd", "pidfd_info", "waitid", "zombie")
COMBOS = [c for n in range(len(SOURCES) + 1) for c in itertools.combinations(SOURCES, n)]


@pytest.fixture
def disable(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """set(words): PROCTABLE_DISABLE for this test; the shared watcher restarts with it."""

    def set_words(words: tuple[str, ...]) -> None:
        monkeypatch.setenv("PROCTABLE_DISABLE", ",".join(words))
        _reset_default_watcher()

    yield set_words
    monkeypatch.delenv("PROCTABLE_DISABLE", raising=False)
    _reset_default_watcher()


def _expect_known(off: tuple[str, ...]) -> tuple[bool, bool]:
    """(known before the reap, known after it) for a pid target that is our own child."""
    before = "waitid" not in off or "zombie" not in off
    after = KERNEL_INFO and "pidfd" not in off and "pidfd_info" not in off
    return before, after


def _outcome(fut: proctable.ExitFuture, p: subprocess.Popen[bytes]) -> Any:
    """The watch's answer: given 0.5 s before we reap, then 10 s after (bounded)."""
    try:
        return fut.result(timeout=0.5)
    except concurrent.futures.TimeoutError:
        pass
    except proctable.ExitUnknown:
        return "unknown"
    p.wait(timeout=10)
    try:
        return fut.result(timeout=10)
    except proctable.ExitUnknown:
        return "unknown"


@pytest.mark.parametrize("off", COMBOS, ids=lambda c: "+".join(c) or "none")
def test_every_source_combination_answers_right_or_unknown(
        disable: Any, off: tuple[str, ...]) -> None:
    disable(off)
    before, after = _expect_known(off)
    with proctable.ExitWatcher() as w:
        assert w.features.pidfd == (KERNEL_PIDFD and "pidfd" not in off)
        # 1. A Popen. (With both waitid and zombie off and no pidfd exit info, the
        # watcher gives up on the zombie rather than wait for the Popen's own reap:
        # unknown, never wrong. Only this switch reaches that: waitid always
        # works on one's own child.)
        p = subprocess.Popen(["sh", "-c", "exit 7"])
        got = _outcome(w.watch(p), p)
        if before or after:
            assert isinstance(got, proctable.ExitStatus) and got.code == 7, got
        else:
            assert got == "unknown" or (isinstance(got, proctable.ExitStatus)
                                        and got.code == 7), got

        # 2. A bare pid of our own child that exits 7.
        p = subprocess.Popen(["sh", "-c", "exit 7"])
        got = _outcome(w.watch(p.pid), p)
        if before or after:
            assert isinstance(got, proctable.ExitStatus) and got.code == 7, got
        else:
            assert got == "unknown"

        # 3. An Identity, killed by SIGKILL.
        p = subprocess.Popen(["sleep", "60"])
        ident = proctable.identity(p.pid)
        assert ident is not None
        fut = w.watch(ident)
        p.kill()
        got = _outcome(fut, p)
        if before or after:
            assert isinstance(got, proctable.ExitStatus) and got.signal == signal.SIGKILL, got
        else:
            assert got == "unknown"

    # 4. terminate(): never reaps, so only the sources before a reap can answer.
    p = subprocess.Popen(["sleep", "60"])
    try:
        # Where no source can answer, it waits all of grace: keep that short.
        st = proctable.terminate(p.pid, grace=5.0 if before else 0.3, kill_timeout=0.3)
        if before:
            assert st is not None and st.signal == signal.SIGTERM, st
        else:
            assert st is None
    finally:
        p.kill()
        assert p.wait(timeout=10) == -signal.SIGTERM  # terminate did stop it


SETSID_JOB = "setsid sleep 300 & sleep 300 & wait"


@pytest.mark.parametrize("off", [
    ("pidfd", "pidfd_info", "proc_connector", "cgroup"),
    ("proc_connector", "cgroup"),
    ("pidfd_info", "proc_connector"),
    ("cgroup",),
], ids="+".join)
@pytest.mark.parametrize("how", ["auto", "subreaper", "scan", "attach"])
def test_lineage_without_backends(disable: Any, off: tuple[str, ...], how: str) -> None:
    disable(off)
    held: Optional[subprocess.Popen[bytes]] = None
    if how == "attach":
        held = subprocess.Popen(["sh", "-c", SETSID_JOB])
        lin = proctable.Lineage(held, interval=0.02)
    else:
        lin = proctable.Lineage.spawn(["sh", "-c", SETSID_JOB], mode=how, interval=0.02)
    try:
        if how == "auto":
            assert lin.mode == "subreaper" if "cgroup" in off else lin.mode in (
                "cgroup", "subreaper")
        if "proc_connector" in off:
            assert lin._engine.sub is None  # no share of the proc-connector hub
        def enough() -> Optional[list[proctable.Proc]]:
            m = lin.members()
            return m if len(m) >= 3 else None

        members = wait_for(enough, timeout=15)
        if "pidfd" in off:
            assert all(m.fd is None for m in lin._engine.reg.live.values())
        idents = [m.identity for m in members]
        report = lin.terminate(grace=2.0, kill_timeout=5.0)
        assert not report.unresolved, report
        assert not [i for i in idents if i.alive()], idents
        assert {m.pid for m in report.members} >= {i.pid for i in idents}
    finally:
        if not lin.closed:
            lin.terminate(grace=0.1, kill_timeout=5.0)
        if held is not None:
            held.wait(timeout=10)
        elif lin.process.returncode is None:
            lin.process.wait(timeout=10)


def test_cgroup_mode_refused_when_cgroups_are_off(disable: Any) -> None:
    disable(("cgroup",))
    with pytest.raises(proctable.ProctableError, match="cgroup"):
        proctable.Lineage.spawn(["true"], mode="cgroup")


def _rerun(files: list[str], off: str, deselect: str = "", timeout: float = 600) -> str:
    """Run test files in a fresh pytest under PROCTABLE_DISABLE=off; its summary line."""
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
            *(["-k", deselect] if deselect else []), *files]
    env = {**os.environ, "PROCTABLE_DISABLE": off}
    env.pop("PYTEST_ADDOPTS", None)
    t0 = time.monotonic()
    try:
        r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"PROCTABLE_DISABLE={off} pytest {files} did not end in {timeout} s")
    summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-500:]
    print(f"\nPROCTABLE_DISABLE={off} {' '.join(files)}: {summary} "
          f"({time.monotonic() - t0:.0f} s)")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    return summary


EXIT_FILES = ["tests/test_watcher.py", "tests/test_terminate.py", "tests/test_exit_probe.py"]
# Scan mode follows a fork chain whose middle link exits before any sample only
# through proc connector events (README, Lineage), and tells a same-tick pid reuse
# apart only through pidfds: those tests need the features this run turns off.
NEEDS_CONNECTOR_OR_PIDFD = (
    "not scan and not attach_sees_escapes and not pid_reuse and not unprivileged_user")


@pytest.mark.skipif(not SLOW, reason="slow (a minute): set PROCTABLE_SLOW_TESTS=1 to run it "
                    "(the default suite denies pidfd_open for real: test_reliability_denied)")
def test_exit_tests_again_without_pidfds() -> None:
    """Linux before 5.3: no pidfd, so no pidfd exit info; the watcher polls /proc."""
    if not os.path.isfile(os.path.join(ROOT, EXIT_FILES[0])):
        pytest.skip("the test files are not in this checkout")
    _rerun(EXIT_FILES, "pidfd,pidfd_info")


@pytest.mark.skipif(not SLOW, reason="slow (a minute): set PROCTABLE_SLOW_TESTS=1 to run it")
# Not "zombie" alone: the CLI watch tests then wait for a reap that never comes (no
# field 52 and no waitid on another's child: unknown until reaped, as it should be).
@pytest.mark.parametrize("off", ["pidfd_info", "pidfd_info,waitid", "waitid"])
def test_exit_tests_again_with_fewer_sources(off: str) -> None:
    _rerun(EXIT_FILES, off)


@pytest.mark.skipif(not SLOW, reason="slow (a minute): set PROCTABLE_SLOW_TESTS=1 to run it")
@pytest.mark.parametrize("off", ["pidfd,pidfd_info,proc_connector,cgroup",
                                 "proc_connector,cgroup", "pidfd_info"])
def test_lineage_tests_again_without_backends(off: str) -> None:
    deselect = NEEDS_CONNECTOR_OR_PIDFD if ("proc_connector" in off or "pidfd," in off) else ""
    _rerun(["tests/test_lineage.py", "tests/test_supervisor.py", "tests/test_run.py"], off,
           deselect)
