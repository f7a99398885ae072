"""Helpers of the lineage tests: the backends here, a tracker that cleans up, bounded reads."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

import proctable
from proctable.lineage import Lineage, _cgroup

from .conftest import PY, build_c, wait_until

CGROUP = _cgroup.usable_parent() is not None
MODES = [*(["cgroup"] if CGROUP else []), "subreaper", "scan"]
SPAWN_MODES = [*MODES, "auto"]
needs_cgroup = pytest.mark.skipif(not CGROUP, reason="no writable cgroup v2 here")

SETSID_NOHUP = "setsid sh -c 'nohup sleep 300 > /dev/null 2>&1 & echo $!'"



def no_idle_hub(timeout: float = 10.0) -> None:
    """End at once an event hub an earlier test's lineages left lingering unused (it
    keeps its socket and pipe for LINGER_SECONDS after its last lineage, so an fd
    count taken beside it counts them or not depending on what ran before), instead
    of waiting out its linger; bounded (a hub still in use fails the test)."""
    from proctable.lineage import _hub

    hub = _hub._hub
    if hub is None:
        return
    linger = _hub.LINGER_SECONDS
    _hub.LINGER_SECONDS = 0.0
    try:
        with hub._lock:
            hub._poke_locked()  # its thread looks again, and retires it
        wait_until(lambda: _hub._hub is None, timeout=timeout)
    finally:
        _hub.LINGER_SECONDS = linger


def helpers_at_rest(mirror: int, timeout: float = 20.0) -> None:
    """Wait (bounded) until a lineage's mirror (pid ``mirror``, its ``lin.process``)
    and its reaper have passed on every signal they were sent: each asleep in
    poll() with no signal pending (they block every signal and read them from a
    signalfd, so an unread one shows in SigPnd/ShdPnd) and neither woken over a
    look 20 ms long (same context switch counts). A relay is a kill() or a
    sigqueue() done before the helper sleeps again, and a line the mirror wrote
    wakes the reaper at once: at rest, every copy the command will ever get is
    queued at it. Nothing to wait for where ``mirror`` is no mirror (scan mode:
    lin.process is the command). Self-contained (stdlib only): the scripts of
    callers in a process of their own carry its source."""
    import time as _time

    def comm(pid: int) -> str:
        try:
            with open(f"/proc/{pid}/comm") as f:
                return f.read().strip()
        except OSError:
            return ""

    if comm(mirror) != "pt-mirror":
        return
    try:
        with open(f"/proc/{mirror}/task/{mirror}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except OSError:
        kids = []
    helpers = [mirror, *(k for k in kids if comm(k) == "pt-reaper")]

    def look(pid: int) -> object:
        """A helper's switch counts while it sleeps in poll() with nothing
        pending; None otherwise."""
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read().strip()
        except OSError:
            return None  # gone: not at rest (these tests keep their helpers)
        if not fields["State"].strip().startswith("S"):
            return None
        if int(fields["SigPnd"], 16) or int(fields["ShdPnd"], 16):
            return None
        if wchan not in ("", "0") and "poll" not in wchan:
            return None  # asleep elsewhere (a nanosleep of a retry, say)
        return (fields["voluntary_ctxt_switches"].strip(),
                fields["nonvoluntary_ctxt_switches"].strip())

    deadline = _time.monotonic() + timeout
    while _time.monotonic() < deadline:
        first = [look(p) for p in helpers]
        _time.sleep(0.02)
        if None not in first and [look(p) for p in helpers] == first:
            return
    raise AssertionError(f"the helpers {helpers} did not come to rest in {timeout} s")


def cpu_seconds() -> float:
    """The CPU time (user + system, every thread) this process has used so far."""
    t = os.times()
    return t.user + t.system


# A teardown must wait without spinning: its CPU time over a wait is held against a
# generous share of the wall time it took (a busy loop takes all of it).
IDLE_SHARE = 0.25


def kill_identity(ident: Optional[proctable.Identity]) -> None:
    """SIGKILL ident through a pidfd, only while that pid is still ident's process
    (the test made it; a reused pid is left alone)."""
    if ident is None:
        return
    try:
        fd = os.pidfd_open(ident.pid)
    except ProcessLookupError:
        return
    try:
        if proctable.identity(ident.pid) == ident:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it ended between the look and the signal (a teardown got there first)
    finally:
        os.close(fd)

def _cgroups_of_ours() -> set[str]:
    parent = _cgroup.own_cgroup()
    if parent is None:
        return set()
    prefix = f"proctable-{os.getpid()}-"
    return {n for n in os.listdir(parent) if n.startswith(prefix)}


class Tracker:
    """Lineages and pids a test started: torn down / killed by pid at the end, and
    every cgroup the test created removed."""

    def __init__(self) -> None:
        self.lineages: list[Lineage] = []
        self.idents: list[proctable.Identity] = []
        self.cgroups_before = _cgroups_of_ours()

    def spawn(self, args: Any, **kw: Any) -> Lineage:
        kw.setdefault("interval", 0.02)
        lin = Lineage.spawn(args, **kw)
        self.lineages.append(lin)
        return lin

    def attach(self, root: Any, **kw: Any) -> Lineage:
        kw.setdefault("interval", 0.02)
        lin = Lineage(root, **kw)
        self.lineages.append(lin)
        return lin

    def pid(self, pid: int) -> proctable.Identity:
        """Remember pid (started by the test's lineage) to kill it if the test fails."""
        ident = proctable.identity(pid)
        assert ident is not None, f"pid {pid} is gone already"
        self.idents.append(ident)
        return ident

    def cleanup(self) -> None:
        for lin in self.lineages:
            if not lin.closed:
                try:
                    lin.terminate(grace=0.2, kill_timeout=2.0)
                except proctable.ProctableError:
                    pass
            p = lin._engine.process
            if p is not None and p.returncode is None:
                try:
                    p.kill()
                    p.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        for ident in self.idents:
            kill_identity(ident)
        leftover = _cgroups_of_ours() - self.cgroups_before
        parent = _cgroup.own_cgroup()
        for name in leftover:
            assert parent is not None
            try:
                os.rmdir(os.path.join(parent, name))
            except OSError:
                pass
        assert not leftover, f"cgroups left behind: {leftover}"


def tracker() -> Iterator[Tracker]:
    """The body of the ``track`` fixture (conftest.py registers it)."""
    t = Tracker()
    try:
        yield t
    finally:
        t.cleanup()


def read_line(stream: Any, timeout: float = 10.0) -> str:
    """One line from a pipe, bounded."""
    fd = stream.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"no line within {timeout}s (got {buf!r})")
        r, _, _ = select.select([fd], [], [], left)
        if r:
            ch = os.read(fd, 1)
            if not ch:
                pytest.fail(f"EOF before a line (got {buf!r})")
            buf += ch
    return buf.decode().strip()


def dead(ident: proctable.Identity) -> bool:
    """Really gone (or a zombie): no live process holds this identity."""
    return not ident.alive()


def assert_all_dead(idents: list[proctable.Identity]) -> None:
    alive = [i for i in idents if not dead(i)]
    assert not alive, f"still alive after teardown: {alive}"


def pids(lin: Lineage) -> set[int]:
    return {p.pid for p in lin.members()}


def py_cmd(code: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(code)]


LEADER_EXITS = r"""
#include <pthread.h>
#include <signal.h>
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

int main(int argc, char **argv) {
    pthread_t t;
    (void)argv;
    if (argc > 1)
        signal(SIGTERM, SIG_IGN);  /* "ignore-term": only a SIGKILL ends it */
    if (pthread_create(&t, NULL, run, NULL) != 0)
        return 1;
    pthread_exit(NULL);
}
"""


def build_leader_exits(d: Path) -> Path:
    """A tiny C program whose main thread calls pthread_exit, compiled in d (the
    test is skipped without a C compiler). It prints its pid once its main thread
    is a zombie; with an argument it ignores SIGTERM."""
    return Path(build_c(d, "leader_exits", LEADER_EXITS, "-pthread"))


def left_by_a_killed_caller(caller: int, mark: str,
                            timeout: float = 20.0) -> tuple[list[str], list[proctable.Proc]]:
    """After a supervisor process ``caller`` was SIGKILLed: wait (bounded) until none of
    its lineage cgroups (``proctable-<caller>-*`` in this process's cgroup) and no live
    process marked ``mark`` (tests/_supervise.MARK, read from the table) is left.
    Returns what was still left then, after ending it (processes by identity,
    cgroups removed) so that the run stays clean."""
    from ._supervise import running_marked

    parent = _cgroup.own_cgroup()
    prefix = f"proctable-{caller}-"

    def dirs() -> list[str]:
        return [n for n in os.listdir(parent) if n.startswith(prefix)] if parent else []

    def marked() -> list[int]:
        return running_marked(mark).get(mark, [])

    deadline = time.monotonic() + timeout
    while (dirs() or marked()) and time.monotonic() < deadline:
        time.sleep(0.05)
    left_dirs = dirs()
    rows = [r for r in (proctable.read(p) for p in marked()) if r is not None]
    for row in rows:
        kill_identity(row.identity)
    for name in left_dirs:
        assert parent is not None
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                os.rmdir(os.path.join(parent, name))
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)
    return left_dirs, rows
