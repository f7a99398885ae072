"""A scan-mode spawn has no reaper of its own: the command asks the kernel for
SIGKILL when the supervising process dies (PR_SET_PDEATHSIG). What it started
itself does not inherit that, and survives such a death (docs/lineage.md); the
reaper modes catch those too."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Optional

import pytest

import proctable
from proctable._fdwait import readable
from proctable.lineage import Lineage

from ._lineage import Tracker, kill_identity, read_line
from .conftest import wait_until

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG is Linux's")



@linux_only
def test_a_scan_spawn_from_a_short_lived_thread_outlives_the_thread(track: Tracker) -> None:
    """The kernel sends the parent-death signal when the *thread* that forked the
    child ends: a command the supervisor launches from a worker thread must not die
    with that worker."""
    box: list[Lineage] = []
    tid: list[int] = []

    def launch() -> None:
        tid.append(threading.get_native_id())
        box.append(track.spawn(["sleep", "60"], mode="scan"))

    t = threading.Thread(target=launch)
    t.start()
    t.join(30)
    assert box, "the spawn did not return"
    # Once the OS thread is gone from /proc, its exit (and any signal it causes) is done.
    wait_until(lambda: not os.path.exists(f"/proc/self/task/{tid[0]}"), timeout=30)
    lin = box[0]
    fd = os.pidfd_open(lin.process.pid)
    try:
        assert not readable([fd], 1.0), "the command died with the thread that started it"
    finally:
        os.close(fd)
    assert lin.process.poll() is None
    lin.terminate(grace=1.0, kill_timeout=3.0)


@linux_only
def test_the_callers_preexec_fn_still_runs(track: Tracker) -> None:
    lin = track.spawn(["sh", "-c", "umask"], mode="scan", stdout=subprocess.PIPE,
                      preexec_fn=lambda: os.umask(0o027))
    assert read_line(lin.process.stdout) == "0027"
    lin.process.wait(timeout=30)
    assert lin.process.stdout is not None
    lin.process.stdout.close()


_SUPERVISOR = r"""
import sys
import proctable
sup = proctable.Supervisor(mode="scan")
ident = sup.start("a", ["sh", "-c", 'sleep 300 & echo $! > "$0"; exec sleep 300', sys.argv[1]])
print(ident.pid, flush=True)
sys.stdin.readline()  # until the test kills us
"""


@linux_only
def test_a_scan_spawned_command_dies_with_its_sigkilled_supervisor(tmp_path: Path) -> None:
    pidfile = tmp_path / "child"
    p = subprocess.Popen([sys.executable, "-c", _SUPERVISOR, str(pidfile)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    command: Optional[proctable.Identity] = None
    orphan: Optional[proctable.Identity] = None
    try:
        command = proctable.identity(int(read_line(p.stdout, timeout=30)))
        text = wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=30)
        orphan = proctable.identity(int(str(text)))
        assert command is not None and orphan is not None
        p.kill()  # the supervising process, SIGKILLed: nothing of ours runs any more
        assert p.wait(timeout=30) == -signal.SIGKILL
        wait_until(lambda: not command.alive(), timeout=30)  # type: ignore[union-attr]
        # What the command started itself did not inherit the signal: it survives
        # in scan mode (the reaper modes catch it), as the docs say.
        assert orphan.alive()
    finally:
        if p.returncode is None:
            p.kill()
            p.wait(timeout=30)
        kill_identity(command)
        kill_identity(orphan)
        if p.stdin is not None:
            p.stdin.close()
        if p.stdout is not None:
            p.stdout.close()


@linux_only
def test_the_spawner_thread_keeps_nothing_of_a_spawn() -> None:
    """The spawner thread used to hold its last job (the Popen, the lineage) until
    the next one came: the last scan-mode Popen was never collected, so never
    reaped (a zombie left behind)."""
    refs: list[weakref.ref[object]] = []

    def launch() -> None:
        lin = Lineage.spawn(["sleep", "60"], mode="scan")
        refs.append(weakref.ref(lin.process))
        refs.append(weakref.ref(lin))
        lin.terminate(grace=1.0, kill_timeout=3.0)

    t = threading.Thread(target=launch)
    t.start()
    t.join(30)
    assert len(refs) == 2
    gc.collect()
    assert [r() for r in refs] == [None, None]
