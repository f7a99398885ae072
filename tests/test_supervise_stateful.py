"""A stateful property test: random sequences of calls against a REAL Supervisor.

Hypothesis drives start/stop/remove/adopt/close (and lets time pass) with short
real commands that exit 0, exit 1, die by a signal, ignore SIGTERM, or leave
escaped children (setsid, nohup), under restart policies with and without
delays, and with timeouts. After every step it checks the README's promises:

- per key, generations only grow; exactly one ``exited`` per generation, after its
  ``created`` and before any ``deleted``;
- nothing starts after ``stop``/``remove``/``close``/``gave_up`` (until the next
  start of that key);
- no process of a stopped, removed, closed or given-up key still runs, found by
  scanning the process table for the mark every started process carries in its
  environment (not by asking the supervisor);
- a timeout fires within a bound, whatever the other keys do;
- with ``output="events"`` and chatty commands (lines tagged with the writing
  shell's pid, written by the command, its background jobs, an escape, and a
  TERM handler): every output event comes after its generation's ``created`` and
  before its ``exited``, and carries only what that generation's processes wrote.

The default run is small (a few examples, well under a minute in the suite);
``PROCTABLE_SLOW_TESTS=1`` runs 100 examples of up to 40 steps, and
``PROCTABLE_STATEFUL_EXAMPLES`` / ``PROCTABLE_STATEFUL_STEPS`` set the numbers.
Run with ``-s`` to see what a run did (``test_report_the_stateful_run``).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import time
from collections.abc import Hashable
from typing import Optional

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import proctable
from proctable import RestartPolicy, Supervisor, SupervisorClosed
from proctable.supervise import Event

from ._reliability import SLOW
from ._supervise import Recorder, marked_env, running_marked
from .conftest import wait_until

EXAMPLES = int(os.environ.get("PROCTABLE_STATEFUL_EXAMPLES", "100" if SLOW else "4"))
STEPS = int(os.environ.get("PROCTABLE_STATEFUL_STEPS", "40" if SLOW else "12"))

GRACE = 0.2
KILL = 2.0
TIMEOUT_SLACK = GRACE + KILL + 8.0  # generous: the machine is shared and loaded

KEYS = ("a", "b", "c")
COMMANDS: dict[str, list[str]] = {
    "exit0": ["sh", "-c", "exit 0"],
    "exit1": ["sh", "-c", "exit 1"],
    "signal": ["sh", "-c", "kill -KILL $$"],
    "ignore_term": ["sh", "-c", "trap '' TERM; sleep 30"],
    "escape_exit": ["sh", "-c", "setsid sleep 30 & nohup sleep 30 >/dev/null 2>&1 & exit 0"],
    "escape_run": ["sh", "-c", "setsid sleep 30 & sleep 30"],
    "short": ["sh", "-c", "sleep 0.2"],
    "long": ["sleep", "30"],
    # Chatty: every line carries W<pid of the command's shell> ($$ is the same in subshells).
    "chatty": ["sh", "-c", 'i=0; while [ $i -lt 300 ]; do echo "W$$ $i"; i=$((i+1)); done'],
    "late_writer": ["sh", "-c", 'trap \'for i in 1 2 3 4 5 6 7 8; do echo "W$$ late $i"; done; '
                    'exit 0\' TERM; while :; do echo "W$$ tick"; sleep 0.05; done'],
    "chatty_escape": ["sh", "-c", '(sleep 0.1; echo "W$$ bg") & '
                      'setsid sh -c \'echo "W$0 escaped"; sleep 30\' $$ & echo "W$$ fg"; sleep 30'],
}
_WRITER = re.compile(rb"W(\d+) ")
ADOPTABLE = ("exit0", "exit1", "signal", "ignore_term", "short", "long")
POLICIES: list[Optional[RestartPolicy]] = [
    None,
    RestartPolicy(max_restarts=2, max_fast_exits=2, delay=0.0),
    RestartPolicy(max_restarts=2, max_fast_exits=2, delay=0.3),
    RestartPolicy(max_restarts=1, max_fast_exits=1, delay=1.0),
]
TIMEOUTS: list[Optional[float]] = [None, None, 0.3, 1.0]

STATS = {"examples": 0, "steps": 0, "created": 0, "timed_out": 0, "max_lateness": 0.0,
         "output_bytes": 0}
_runs = itertools.count()


class _Run(Recorder):
    """The events, plus when each generation with a timeout was created."""

    def __init__(self) -> None:
        super().__init__()
        self.limit: dict[Hashable, Optional[float]] = {}   # key -> timeout of its last start
        self.timed: dict[tuple[Hashable, int], tuple[float, float]] = {}  # -> (limit, created)

    def __call__(self, ev: Event) -> None:
        if ev.kind == "output":
            STATS["output_bytes"] += len(ev.data or b"")
        if ev.kind == "created":
            STATS["created"] += 1
            limit = self.limit.get(ev.key)
            if limit is not None:  # restarts carry their start's timeout
                self.timed[(ev.key, ev.generation)] = (limit, time.monotonic())
        elif ev.kind == "exited" and ev.status == "timeout":
            limit_created = self.timed.get((ev.key, ev.generation))
            if limit_created is not None:
                limit, created = limit_created
                # How late the teardown began: the victim's own grace (it ignored
                # SIGTERM and needed SIGKILL) is not lateness.
                own = GRACE if ev.exit is not None and ev.exit.signal == signal.SIGKILL else 0.0
                STATS["timed_out"] += 1
                STATS["max_lateness"] = max(STATS["max_lateness"],
                                            time.monotonic() - created - limit - own)
        super().__call__(ev)

    def exited(self, key: Hashable, gen: int) -> bool:
        with self.cond:
            return any(e.kind == "exited" and e.key == key and e.generation == gen
                       for e in self.events)


class SupervisorRun(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        STATS["examples"] += 1
        self.tag = f"stateful-{os.getpid()}-{next(_runs)}-"
        self.epoch = 0
        self.marks = itertools.count()
        self.adopted: list[subprocess.Popen[bytes]] = []
        self._new_supervisor()

    def _new_supervisor(self) -> None:
        self.epoch += 1
        self.prefix = f"{self.tag}{self.epoch}:"
        self.rec = _Run()
        self.sup = Supervisor(on_event=self.rec, grace=GRACE, kill_timeout=KILL)
        self.closed = False
        self.current: dict[Hashable, str] = {}  # key -> the mark of its last start
        self.frozen: dict[Hashable, int] = {}   # key -> its created count, which must stay

    def _mark(self, key: Hashable) -> str:
        return f"{self.prefix}{key}:{next(self.marks)}"

    # --- the calls ------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS), cmd=st.sampled_from(sorted(COMMANDS)),
          policy=st.sampled_from(POLICIES), timeout=st.sampled_from(TIMEOUTS),
          output=st.sampled_from(["inherit", "events", "events"]))
    def start(self, key: str, cmd: str, policy: Optional[RestartPolicy],
              timeout: Optional[float], output: str = "events") -> None:
        mark = self._mark(key)
        self.rec.limit[key] = timeout
        if cmd in ("chatty", "late_writer", "chatty_escape") and output == "inherit":
            output = "events"  # their output is what they are here for
        ident = self.sup.start(key, COMMANDS[cmd], restart=policy, timeout=timeout,
                               env=marked_env(mark), output=output)
        assert isinstance(ident, proctable.Identity)
        self.current[key] = mark
        self.frozen.pop(key, None)

    @rule(key=st.sampled_from(KEYS), cmd=st.sampled_from(["long", "ignore_term"]),
          timeout=st.sampled_from([0.3, 0.6]))
    def start_timed(self, key: str, cmd: str, timeout: float) -> None:
        """A long runner whose timeout must fire, whatever the other keys do."""
        self.start(key, cmd, None, timeout)

    @rule(key=st.sampled_from(KEYS), cmd=st.sampled_from(ADOPTABLE),
          policy=st.sampled_from(POLICIES))
    def adopt(self, key: str, cmd: str, policy: Optional[RestartPolicy]) -> None:
        mark = self._mark(key)
        p = subprocess.Popen(COMMANDS[cmd], env=marked_env(mark))
        self.adopted.append(p)
        # Our unreaped child is there until we reap it (identity() may say None once,
        # if it exits between its two looks).
        ident = wait_until(lambda: proctable.identity(p.pid))
        assert isinstance(ident, proctable.Identity)
        self.rec.limit[key] = None
        try:
            self.sup.adopt(key, ident, restart=policy, args=COMMANDS[cmd], env=marked_env(mark))
        except proctable.NoSuchProcess:
            # It ended as it was adopted (the attach saw it exit): then the adoption
            # failed like a start that cannot start, and nothing of the key runs.
            assert not ident.alive()
            self.frozen[key] = self.rec.count("created", key)
            return
        self.current[key] = mark
        self.frozen.pop(key, None)

    @rule(key=st.sampled_from(KEYS))
    def stop(self, key: str) -> None:
        try:
            self.sup.stop(key)
        except KeyError:
            assert key not in self.sup
            return
        self._after_stop(key)

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key: str) -> None:
        try:
            self.sup.remove(key)
        except KeyError:
            assert key not in self.sup
            return
        self._after_stop(key)
        assert key not in self.sup

    @rule()
    def close(self) -> None:
        self.sup.close()
        self.closed = True
        for key in KEYS:
            self._after_stop(key)
        with pytest.raises(SupervisorClosed):
            self.sup.start("a", ["sleep", "30"])
        self._check_events(final=True)
        self._new_supervisor()  # and go on with a fresh one

    @rule(seconds=st.sampled_from([0.05, 0.2, 0.5]))
    def let_time_pass(self, seconds: float) -> None:
        time.sleep(seconds)  # restarts, natural exits and timeouts happen meanwhile

    def _after_stop(self, key: Hashable) -> None:
        """stop/remove/close returned: nothing of key runs, and nothing starts later."""
        assert self.sup.flush_events()
        kinds = [e.kind for e in self.rec.of(key)]
        assert not kinds or kinds[-1] != "created", kinds
        self.frozen[key] = self.rec.count("created", key)
        running = {m: p for m, p in running_marked(self.prefix).items()
                   if m.split(":")[1] == key}
        assert running == {}, f"{key!r} still runs after stop: {running}"

    # --- the promises, after every step ------------------------------------------------

    @invariant()
    def promises_hold(self) -> None:
        STATS["steps"] += 1
        for p in self.adopted:
            p.poll()  # reap what ended (the supervisor read its status without reaping)
        assert self.sup.flush_events()
        self._check_events(final=False)
        for key in KEYS:
            events = self.rec.of(key)
            if events and events[-1].kind == "gave_up":
                self.frozen.setdefault(key, self.rec.count("created", key))
        for key, created in self.frozen.items():
            assert self.rec.count("created", key) == created, \
                f"{key!r} started again after it was stopped: {self.rec.kinds(key)}"
        for mark, pids in running_marked(self.prefix).items():
            key = mark.split(":")[1]
            assert key not in self.frozen, f"{key!r} is stopped, yet {pids} ({mark}) run"
            assert mark == self.current.get(key), f"{pids} of an earlier start ({mark}) run"
        now = time.monotonic()
        for (key, gen), (limit, created) in list(self.rec.timed.items()):
            if not self.rec.exited(key, gen):
                assert now - created <= limit + TIMEOUT_SLACK, \
                    f"{key!r} generation {gen}: its {limit}s timeout has not fired " \
                    f"after {now - created:.1f}s"

    def _check_events(self, final: bool) -> None:
        with self.rec.cond:
            events = list(self.rec.events)
        per_key: dict[Hashable, list[Event]] = {}
        for ev in events:
            per_key.setdefault(ev.key, []).append(ev)
        for key, evs in per_key.items():
            last = 0
            created: set[int] = set()
            exited: dict[int, int] = {}
            writer: dict[int, int] = {}  # generation -> its command's pid
            written: dict[int, list[bytes]] = {}
            for ev in evs:
                if ev.kind == "output":
                    # Only between its own created and exited, never another's.
                    assert ev.generation in created and ev.generation not in exited, \
                        f"{key!r}: output of generation {ev.generation} outside its life: {evs}"
                    assert ev.data and ev.stream in ("stdout", "stderr"), ev
                    written.setdefault(ev.generation, []).append(ev.data)
                elif ev.kind == "created":
                    assert ev.generation > last, f"{key!r}: generations must grow: {evs}"
                    last = ev.generation
                    created.add(ev.generation)
                    assert ev.identity is not None
                    writer[ev.generation] = ev.identity.pid
                elif ev.kind == "exited":
                    assert ev.generation in created, f"{key!r}: exited before created: {evs}"
                    exited[ev.generation] = exited.get(ev.generation, 0) + 1
                    assert exited[ev.generation] == 1, f"{key!r}: two exited: {evs}"
                elif ev.kind == "deleted":
                    assert last == 0 or exited.get(last) == 1, \
                        f"{key!r}: deleted before the exited of generation {last}: {evs}"
                assert ev.kind != "teardown_failed", f"{key!r}: {ev}"  # all killable here
            for gen, chunks in written.items():  # whole lines: a line may span two chunks
                pids = {int(m) for m in _WRITER.findall(b"".join(chunks))}
                assert pids <= {writer[gen]}, \
                    f"{key!r} generation {gen} (pid {writer[gen]}) delivered output of {pids}"
            if final:
                assert all(exited.get(g) == 1 for g in created), \
                    f"{key!r}: a generation without its exited: {evs}"

    def teardown(self) -> None:
        try:
            # Let every timeout that is due fire before close() ends them all.
            for (key, gen), (limit, _created) in list(self.rec.timed.items()):
                self.rec.wait_for(lambda r, k=key, g=gen: r.exited(k, g),  # type: ignore[misc]
                                  timeout=limit + TIMEOUT_SLACK)
            self.sup.close()
            self._check_events(final=True)
            assert running_marked(self.tag) == {}
        finally:
            for p in self.adopted:
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=10)


SupervisorRun.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestSupervisorRun = SupervisorRun.TestCase


def test_report_the_stateful_run() -> None:
    """Not a check: prints what the stateful run above did (see it with -s)."""
    print(f"\nstateful supervisor run: {STATS}")
