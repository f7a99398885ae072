"""Helpers for the supervisor tests: an event recorder, and a scan of the process
table for marked processes (what runs is checked by looking, not by asking the
supervisor)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Hashable
from typing import Callable, Optional

import pytest

import proctable
from proctable.supervise import Event

MARK = "PROCTABLE_TEST_SUPERVISED"


class Recorder:
    """Collects events (with the monotonic time each arrived); wait_for() blocks
    (bounded) until a predicate holds."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.arrived: list[float] = []
        self.cond = threading.Condition()
        self.hook: Optional[Callable[[Event], object]] = None

    def __call__(self, ev: Event) -> None:
        with self.cond:
            self.events.append(ev)
            self.arrived.append(time.monotonic())
            self.cond.notify_all()
        if self.hook is not None:
            self.hook(ev)

    def of(self, key: Hashable) -> list[Event]:
        with self.cond:
            return [e for e in self.events if e.key == key]

    def kinds(self, key: Hashable = None) -> list[tuple[str, int, Optional[str]]]:
        with self.cond:
            return [(e.kind, e.generation, e.status) for e in self.events
                    if key is None or e.key == key]

    def count(self, kind: str, key: Hashable = None) -> int:
        return sum(1 for k, _, _ in self.kinds(key) if k == kind)

    def wait_for(self, pred: Callable[[Recorder], object], timeout: float = 30.0,
                 poll: Optional[float] = None) -> None:
        """Until pred holds, bounded. pred is asked again at each new event; one that
        reads anything besides the events (the process table, a tail) needs poll:
        asked that often too, or it would wait for an event that may never come."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"events so far: {self.events}")
                self.cond.wait(left if poll is None else min(left, poll))

    def first(self, kind: str, key: Hashable) -> tuple[Event, float]:
        with self.cond:
            for e, t in zip(self.events, self.arrived):
                if e.kind == kind and e.key == key:
                    return e, t
        raise AssertionError(f"no {kind} event for {key!r}: {self.events}")


def tag_for(request: pytest.FixtureRequest) -> str:
    """A mark prefix of this test's own (its name and this worker's pid): runs of the
    suite beside each other on one host never take each other's processes for theirs."""
    return f"{request.node.name}-{os.getpid()}-"


def marked_env(tag: str) -> dict[str, str]:
    """An environment that marks every process started with it (children inherit it)."""
    return {**os.environ, MARK: tag}


_floor: Optional[int] = None


def running_marked(prefix: str) -> dict[str, list[int]]:
    """Live processes (zombies left out) whose environment carries a mark starting
    with prefix: mark -> pids. Only processes started after this test process are
    read (our own children and their escapes are all among them)."""
    global _floor
    if _floor is None:
        me = proctable.read(os.getpid())
        assert me is not None
        _floor = me.start_time
    want = f"{MARK}={prefix}".encode()
    out: dict[str, list[int]] = {}
    for p in proctable.snapshot():
        if p.start_time < _floor or p.state in ("Z", "X") or p.pid == os.getpid():
            continue
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                data = f.read()
        except OSError:
            continue  # gone meanwhile
        for item in data.split(b"\0"):
            if item.startswith(want):
                # Read once more: a pid that exited and was reused between the two
                # reads is not ours.
                again = proctable.read(p.pid)
                if again is not None and again.start_time == p.start_time and again.state != "Z":
                    out.setdefault(item.split(b"=", 1)[1].decode(), []).append(p.pid)
                break
    return out


def ignore_term(marker: str) -> list[str]:
    """A shell that ignores SIGTERM (and so does its sleep), and says so by creating marker."""
    return ["sh", "-c", f"trap '' TERM; : > '{marker}'; sleep 60"]


HELPERS = ("pt-mirror", "pt-reaper")  # the lineage's native helper processes (their comm)


def left_running(prefix: str, helper_wait: float = 10.0) -> dict[str, list[int]]:
    """running_marked(prefix) just after a teardown, with the lineage's own helper
    processes told apart: a command or job still running is returned at once; a
    helper (which carries the command's environment, and ends just after the
    teardown it serves) is waited for, bounded by helper_wait, and returned if
    it outlives that."""
    def commands(found: dict[str, list[int]]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for mark, pids in found.items():
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/comm") as f:
                        comm = f.read().strip()
                except OSError:
                    continue  # gone meanwhile
                if comm not in HELPERS:
                    out.setdefault(mark, []).append(pid)
        return out

    found = running_marked(prefix)
    left = commands(found)
    if left or not found:
        return left
    deadline = time.monotonic() + helper_wait
    while found and time.monotonic() < deadline:
        time.sleep(0.02)
        found = running_marked(prefix)
    return found


class LeftJobs:
    """A command that starts ``n`` jobs escaping with ``setsid nohup`` (each ignores
    SIGTERM, so that a teardown needs its whole grace to end them), writes their
    pids, and exits 0 once :meth:`go` is called: what a tool provider does when it
    leaves background jobs behind."""

    def __init__(self, directory: str, n: int = 4) -> None:
        self.pidfile = os.path.join(directory, "jobs")
        self.gofile = os.path.join(directory, "go")
        self.n = n
        self.args = ["sh", "-c", (
            f"for i in $(seq {n}); do "
            "setsid nohup sh -c \"trap '' TERM; exec sleep 300\" >/dev/null 2>&1 & "
            f"echo $! >> '{self.pidfile}'; done; "
            f"while [ ! -e '{self.gofile}' ]; do sleep 0.02; done; exit 0")]
        self.jobs: list[proctable.Identity] = []

    def started(self, timeout: float = 20.0) -> list[proctable.Identity]:
        """Wait until every job runs its sleep; their identities (pid and start time)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with open(self.pidfile) as f:
                    pids = [int(x) for x in f.read().split()]
            except FileNotFoundError:
                pids = []
            rows = [proctable.read(p) for p in pids]
            if len(pids) == self.n and all(r is not None and r.name == "sleep" for r in rows):
                self.jobs = [proctable.Identity(r.pid, r.start_time) for r in rows if r]
                return self.jobs
            if time.monotonic() > deadline:
                pytest.fail(f"the jobs did not start: {pids} {rows}")
            time.sleep(0.02)

    def go(self) -> None:
        with open(self.gofile, "w"):
            pass

    def alive(self) -> list[proctable.Identity]:
        """The jobs still running (by pid and start time; a zombie is not running)."""
        return [j for j in self.jobs if j.alive()]

    def clean(self) -> None:
        """SIGKILL what the test left running (by pidfd, only while the identity holds)."""
        for j in self.alive():
            try:
                fd = os.pidfd_open(j.pid)
            except ProcessLookupError:
                continue
            try:
                if j.alive():
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            finally:
                os.close(fd)
