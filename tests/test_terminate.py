"""terminate(): SIGTERM, a bounded grace, SIGKILL, a bounded wait; always returns.

Timing is asserted only as a generous bound: back within grace + kill_timeout + 1s.
Key tests run with every source, without pidfd exit info, and without pidfds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

import pytest

import proctable
from proctable import _pidfd
from proctable.exits._terminate import _still_our_child
from proctable.exits._watcher import _reset_default_watcher

from .conftest import (
    PY,
    Procs,
    needs_root,
    run_as_nobody,
    wait_until,
    wait_zombie,
)

SLACK = 1.0


_STUBBORN = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


def _ready(p: subprocess.Popen[bytes]) -> None:
    assert p.stdout is not None
    assert p.stdout.readline() == b"ready\n"


def test_child_ignoring_sigterm_is_killed_inside_the_bound(procs: Procs, mode: str) -> None:
    p = procs.py(_STUBBORN, stdout=subprocess.PIPE)
    _ready(p)
    grace, kill_timeout = 0.5, 3.0
    t0 = time.monotonic()
    status = proctable.terminate(p, grace=grace, kill_timeout=kill_timeout)
    took = time.monotonic() - t0
    assert status is not None and status.signal == signal.SIGKILL
    assert grace <= took < grace + kill_timeout + SLACK
    assert p.wait(timeout=10) == -signal.SIGKILL  # terminate never reaps


def test_child_that_obeys_sigterm_returns_early(procs: Procs, mode: str) -> None:
    p = procs.py(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
        "print('ready', flush=True)\n"
        # Slices: a SIGTERM just after 'ready' may land before one long sleep
        # starts, and CPython would run the handler only once it ends.
        "while True: time.sleep(0.05)\n",
        stdout=subprocess.PIPE,
    )
    _ready(p)
    t0 = time.monotonic()
    status = proctable.terminate(p.pid, grace=5.0, kill_timeout=5.0)
    assert status is not None and status.code == 3
    assert time.monotonic() - t0 < 5.0
    assert p.wait(timeout=10) == 3


_NEVER_REAPS = r"""
import os, signal, sys, time
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    if sys.argv[1] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.write(w, b"x")
    time.sleep(120)
    os._exit(0)
os.read(r, 1)
print(pid, flush=True)
time.sleep(120)   # never reaps its child
"""


@pytest.mark.parametrize("kind", ["obeys", "stubborn"])
def test_zombie_whose_parent_never_reaps(procs: Procs, mode: str, kind: str) -> None:
    """Not our child, and nobody will reap it: the zombie decode gives the status."""
    parent = procs.popen([PY, "-c", _NEVER_REAPS, kind], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    gpid = int(parent.stdout.readline())  # once its SIGTERM disposition is set
    grace, kill_timeout = 0.5, 2.0
    t0 = time.monotonic()
    status = proctable.terminate(gpid, grace=grace, kill_timeout=kill_timeout)
    took = time.monotonic() - t0
    expected = signal.SIGTERM if kind == "obeys" else signal.SIGKILL
    assert status is not None and status.signal == expected
    assert took < grace + kill_timeout + SLACK
    assert proctable.read(gpid).state == "Z"  # type: ignore[union-attr]  # still unreaped


def test_zombie_already_answers_at_once(procs: Procs, mode: str) -> None:
    parent = procs.popen([PY, "-c", _NEVER_REAPS, "obeys"], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    gpid = int(parent.stdout.readline())
    os.kill(gpid, signal.SIGUSR1)
    wait_zombie(gpid)
    t0 = time.monotonic()
    status = proctable.terminate(gpid, grace=3.0, kill_timeout=3.0)
    assert status is not None and status.signal == signal.SIGUSR1
    assert time.monotonic() - t0 < 2.0


def test_gone_and_reused_targets_return_none(procs: Procs, mode: str) -> None:
    p = procs.popen(["sleep", "60"])
    ident = proctable.identity(p.pid)
    assert ident is not None
    other = ident._replace(start_time=ident.start_time + 1)
    assert proctable.terminate(other, grace=0.1, kill_timeout=0.1) is None
    assert p.poll() is None  # the live process behind the pid was not hit
    p.kill()
    p.wait(timeout=10)
    # A Popen reaped already: its returncode is the answer.
    assert proctable.terminate(p).signal == signal.SIGKILL  # type: ignore[union-attr]
    # By identity: None whether or not the pid was reused meanwhile.
    assert proctable.terminate(ident, grace=0.1, kill_timeout=0.1) is None
    # By bare pid only while no process holds it (a reuse would be someone else's).
    if proctable.read(p.pid) is None:
        assert proctable.terminate(p.pid, grace=0.1, kill_timeout=0.1) is None


def test_group_signals_the_whole_group(procs: Procs, mode: str) -> None:
    leader = procs.py(
        "import subprocess, sys, time\n"
        "c = subprocess.Popen(['sleep', '120'])\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(120)\n",
        stdout=subprocess.PIPE, start_new_session=True,
    )
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    status = proctable.terminate(leader, grace=2.0, kill_timeout=2.0, group=True)
    assert status is not None and status.signal == signal.SIGTERM
    # The member (sleep) got the SIGTERM too: it dies, and its parent is gone.
    wait_until(lambda: proctable.exit_probe(member).state is not proctable.ProbeState.RUNNING)
    assert leader.wait(timeout=10) == -signal.SIGTERM


def test_group_of_our_own_is_refused_before_any_signal(procs: Procs) -> None:
    p = procs.popen(["sleep", "60"])  # in our process group
    with pytest.raises(ValueError, match="own"):
        proctable.terminate(p, grace=0.1, kill_timeout=0.1, group=True)
    time.sleep(0.1)
    assert p.poll() is None


def test_bad_arguments_are_refused(procs: Procs) -> None:
    """Harmless shapes only here; pid 0 and -1 are refused in a private pid namespace
    (see test_watcher.py)."""
    p = procs.popen(["sleep", "60"])
    bad_values: list[dict[str, Any]] = [
        {"grace": -1}, {"kill_timeout": float("nan")}, {"grace": float("inf")}]
    for kwargs in bad_values:
        with pytest.raises(ValueError):
            proctable.terminate(p, **kwargs)
    bad_types: list[dict[str, Any]] = [{"grace": "1"}, {"kill_timeout": None}, {"group": 1}]
    for kwargs in bad_types:
        with pytest.raises(TypeError):
            proctable.terminate(p, **kwargs)
    for target in ("1", 1.5, None, object()):
        with pytest.raises(TypeError):
            proctable.terminate(target)  # type: ignore[arg-type]
    assert p.poll() is None


@needs_root
def test_not_allowed_to_signal_is_access_denied(procs: Procs) -> None:
    p = procs.popen(["sleep", "60"])  # root's

    def attempt() -> str:
        _reset_default_watcher()
        try:
            proctable.terminate(p.pid, grace=0.1, kill_timeout=0.1)
        except proctable.AccessDenied:
            return "denied"
        return "signaled"

    assert run_as_nobody(attempt) == ("ok", "denied")
    assert p.poll() is None


def test_a_popen_whose_pid_names_a_stranger_is_never_signalled(procs: Procs) -> None:
    """The guard behind terminate(popen): a pidfd that is not our unreaped child
    (the Popen was reaped elsewhere and its pid reused) must not be signalled."""
    if not hasattr(os, "pidfd_open") or not hasattr(os, "P_PIDFD"):
        pytest.skip("needs pidfds")
    if not _pidfd.features().waitid_pidfd:
        # (PROCTABLE_DISABLE=pidfd: terminate() opens no pidfd, so this guard gets
        # none; the start time check is what stands then.)
        pytest.skip("proctable waits on no pidfd here")
    mine = procs.popen(["sleep", "60"])
    fd = os.pidfd_open(mine.pid)
    try:
        assert _still_our_child(mine, fd)
    finally:
        os.close(fd)
    stranger = os.pidfd_open(os.getppid())  # alive, and not our child
    try:
        assert not _still_our_child(mine, stranger)
    finally:
        os.close(stranger)
    mine.kill()
    mine.wait(timeout=10)
    assert not _still_our_child(mine, None)  # returncode set: no longer ours
