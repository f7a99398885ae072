"""The /proc reader against the kernel's own races: a process whose non-leader
thread execs (de_thread, as Go's syscall.Exec does) lives throughout, whatever
its stat file shows for a moment."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import proctable

from ._reliability import SLOW, linux_only
from .conftest import build_c, wait_until

pytestmark = linux_only

# A process that execs itself forever from a second thread (the main thread
# idles): every exec runs de_thread, which moves the exec'ing thread onto the
# leader's pid. The process (its pid) lives throughout.
EXEC_FROM_THREAD = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>
static char **args;
static void *execer(void *a) { (void)a; execv("/proc/self/exe", args); return 0; }
static void *idle(void *a) { (void)a; for (;;) pause(); }
int main(int argc, char **argv) {
    pthread_t t;
    (void)argc;
    args = argv;
    pthread_create(&t, 0, idle, 0);
    pthread_create(&t, 0, execer, 0);
    for (;;) pause();
}
"""


@pytest.fixture(scope="module")
def exec_from_thread(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(build_c(tmp_path_factory.mktemp("dethread"), "execloop", EXEC_FROM_THREAD,
                        "-pthread"))


@pytest.fixture
def execing(exec_from_thread: Path) -> Iterator[list[int]]:
    """Two processes exec'ing from a thread in a loop; killed and reaped by pid."""
    ps = [subprocess.Popen([str(exec_from_thread)]) for _ in range(2)]
    try:
        for p in ps:
            wait_until(lambda p=p: (r := proctable.read(p.pid, memory=False)) is not None
                       and r.num_threads >= 2)
        yield [p.pid for p in ps]
    finally:
        for p in ps:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)


def test_read_never_loses_a_process_whose_thread_execs(execing: list[int]) -> None:
    gone = []
    reads = 0
    deadline = time.monotonic() + 60
    while reads < 4000 and time.monotonic() < deadline:
        for pid in execing:
            r = proctable.read(pid)
            reads += 1
            if r is None or r.pid != pid:
                gone.append(r)
            elif proctable.exit_probe(pid).state is proctable.ProbeState.GONE:
                gone.append("probe")
    assert reads >= 400, "too few reads to say anything"
    assert gone == [], f"{len(gone)} of {reads} reads said a live process is gone"


def test_snapshot_never_leaves_out_a_process_whose_thread_execs(execing: list[int]) -> None:
    missing = 0
    tables = 0
    deadline = time.monotonic() + 60
    want = 6000 if SLOW else 1000  # (each table is a chance to catch the exec's moment)
    with proctable.Scanner(reader="proc") as scanner:
        while tables < want and time.monotonic() < deadline:
            for t in (proctable.snapshot(reader="proc", memory=False), scanner.refresh()):
                tables += 1
                missing += sum(1 for pid in execing if pid not in t)
    assert tables >= 100, "too few tables to say anything"
    assert missing == 0, f"{missing} rows missing over {tables} tables"
