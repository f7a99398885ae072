"""A member whose main thread exited (pthread_exit in main) is a live member.

Such a process shows state Z with more than one thread and runs on. The first
round's lineage took it for gone: it escaped spawned lineages, and an attached
lineage reported "no members" while it ran. Here it must be recorded, listed,
signalled and waited for, in every mode and attached, with and without the proc
connector; and the table, the probe and the watcher must agree that it lives.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import proctable
from proctable import _pidfd
from proctable.lineage import Ended

from ._lineage import MODES, Tracker, pids, read_line
from .conftest import Procs, wait_until

LEADER_EXITS = r"""
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The other thread says its pid once the main thread is a zombie (bounded). */
static void *run(void *arg) {
    char path[64], buf[512];
    (void)arg;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)getpid());
    for (int i = 0; i < 4000; i++) {
        FILE *f = fopen(path, "r");
        if (f != NULL) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = 0;
            char *p = strrchr(buf, ')');
            if (p != NULL && p[1] == ' ' && p[2] == 'Z')
                break;
        }
        usleep(5000);
    }
    printf("%d\n", (int)getpid());
    fflush(stdout);
    for (;;)
        pause();
    return NULL;
}

int main(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, run, NULL) != 0)
        return 1;
    pthread_exit(NULL);
}
"""


@pytest.fixture(scope="module")
def leader_exits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny C program whose main thread calls pthread_exit, compiled here."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler here (gcc) to build the pthread_exit program")
    d = tmp_path_factory.mktemp("leader")
    src = d / "leader_exits.c"
    src.write_text(LEADER_EXITS)
    exe = d / "leader_exits"
    r = subprocess.run([cc, "-O", "-pthread", "-o", str(exe), str(src)],
                       capture_output=True, text=True, timeout=120, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot build the pthread_exit program: {r.stderr[-500:]}")
    return exe


@pytest.fixture(params=[True, False], ids=["events", "no-events"])
def connector(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if not request.param:
        monkeypatch.setenv(_pidfd.DISABLE_ENV, "proc_connector")
    return bool(request.param)


def _leader_exited(pid: int) -> proctable.Proc:
    row = proctable.read(pid)
    assert row is not None and row.state == "Z" and row.num_threads > 1, row
    return row


@pytest.mark.parametrize("how", [*MODES, "attach"])
def test_member_whose_main_thread_exited_is_live_and_torn_down(
        track: Tracker, procs: Procs, leader_exits: Path, how: str, connector: bool) -> None:
    if how == "attach":
        p = procs.popen([str(leader_exits)], stdout=subprocess.PIPE)
        pid = int(read_line(p.stdout))
        assert p.stdout is not None
        p.stdout.close()
        lin = track.attach(p)
    else:
        # The shell stays its parent: found by the walk even without events.
        lin = track.spawn(["sh", "-c", '"$0" & wait', str(leader_exits)], mode=how,
                          stdout=subprocess.PIPE)
        pid = int(read_line(lin.process.stdout))
        assert lin.process.stdout is not None
        lin.process.stdout.close()
    row = _leader_exited(pid)
    ident = proctable.identity(pid)
    assert ident is not None and ident.alive()  # the one predicate: it lives
    assert proctable.exit_probe(pid).state is proctable.ProbeState.LEADER_EXITED
    assert wait_until(lambda: pid in pids(lin), timeout=10)
    assert [p.state for p in lin.members() if p.pid == pid] == ["Z"]  # listed as it is
    report = lin.terminate(grace=3.0, kill_timeout=3.0)
    ends = [m for m in report.members if m.pid == pid]
    assert [m.ended for m in ends] == [Ended.TERM], report
    assert ends[0].identity.handle == ident.handle
    assert not ident.alive()
    assert not report.unresolved
    assert row.start_time == ends[0].proc.start_time


def test_watcher_waits_for_the_whole_thread_group(procs: Procs, leader_exits: Path) -> None:
    """The exit watcher resolves only when the last thread is gone, not at the
    main thread's pthread_exit."""
    p = procs.popen([str(leader_exits)], stdout=subprocess.PIPE)
    pid = int(read_line(p.stdout))
    assert p.stdout is not None
    p.stdout.close()
    _leader_exited(pid)
    with proctable.ExitWatcher() as w:
        fut = w.watch(p)
        assert not fut.done()
        _leader_exited(pid)
        assert not fut.done()  # resolved only by the whole group's end
        os.kill(pid, 15)
        status = fut.result(timeout=10)
    assert status.signal == 15


def test_identity_alive_follows_the_predicate(procs: Procs, leader_exits: Path) -> None:
    p = procs.popen([str(leader_exits)], stdout=subprocess.PIPE)
    pid = int(read_line(p.stdout))
    assert p.stdout is not None
    p.stdout.close()
    ident = proctable.identity(pid)
    assert ident is not None
    _leader_exited(pid)
    assert ident.alive() and proctable.Identity(ident.pid, ident.start_time).alive()
    p.kill()
    wait_until(lambda: not ident.alive(), timeout=10)
    row: Any = proctable.read(pid)
    assert row is not None and row.state == "Z" and row.num_threads == 1  # now ended
    assert p.wait(timeout=10) == -9
