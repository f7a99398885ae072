"""A pytest plugin that reports (or fails, or ends) processes a test leaves behind.

Registered through the ``pytest11`` entry point and inactive unless asked:
``pytest --leaked-processes=warn|fail|kill`` or ``leaked_processes = ...`` in
the ini file. Without that, it only registers its option and its marker
(``allow_leaked_processes``), so that installing proctable changes nobody's
test run, and it imports nothing of proctable.

How it finds a test's processes, without root and without touching anyone's
process tree (see the README, "A pytest plugin"):

- an environment marker: while a test runs (setup, call, teardown), this
  pytest process's environment holds ``PROCTABLE_LEAK_SCOPE=<token>/<scope>``,
  which every process it starts inherits, through exec, ``setsid``, double
  forks and ``nohup … &``; ``/proc/<pid>/environ`` tells whose it is;
- a fork registry: a Python ``os.fork()`` without exec (a pure-Python daemon)
  keeps the environment block of this process as it was at its own exec, so
  an at-fork hook notes such children (pid, scope, clock tick) in a file;
- ancestry: a process below this one that carries neither (a scrubbed
  environment) is the current scope's, or that of the fixture whose process
  it descends from.

At the end of each test's teardown one listing of /proc, diffed by (pid,
inode) against the last, names the processes started since; those that are
the test's and still run (zombies do not) after a short grace are its leaks. Processes that a
session-, package-, module- or class-scoped fixture started are that fixture's,
checked when the fixture is finalized. It never reaps, never re-parents and
never signals anything but, in ``kill`` mode, the leaks it found.
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
import time
import warnings
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import pytest

if TYPE_CHECKING:
    from .table import Proc

__all__ = ["ENV", "Leak", "LeakGuard", "LeakedProcessWarning"]

ENV = "PROCTABLE_LEAK_SCOPE"
MODES = ("warn", "fail", "kill")
MARKER = "allow_leaked_processes"
_NOT_OURS, _UNSURE = -1, -2  # what _marker says when it names no scope of ours
_LOOKS = 3  # checks at which an unreadable environment is read again
DEFAULT_GRACE = 2.0

# Long-lived helpers the standard library starts on first use and keeps for the
# rest of the run, on purpose: never a test's leak.
_STDLIB_SERVICES = (
    "from multiprocessing.resource_tracker import main",
    "from multiprocessing.forkserver import main",
    "from multiprocessing.semaphore_tracker import main",
)


class LeakedProcessWarning(pytest.PytestWarning):
    """A test (or a higher-scoped fixture) left processes running."""


@dataclass
class Leak:
    """One process that outlived its scope."""

    pid: int
    start_time: int
    name: str
    cmdline: str
    how: str  # "child", "re-parented orphan" or "new session"
    scope: str  # the test's node id, or the fixture's description
    killed: Optional[bool] = None  # kill mode: proven gone (True) or not (False)

    def line(self) -> str:
        end = {None: "", True: " [killed]", False: " [NOT killed]"}[self.killed]
        return f"pid {self.pid} {self.name!r} ({self.how}): {self.cmdline}{end}"

    def as_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_time": self.start_time, "name": self.name,
                "cmdline": self.cmdline, "how": self.how, "scope": self.scope,
                "killed": self.killed}


@dataclass
class _Scope:
    index: int
    label: str  # node id of a test, or "<scope>-scoped fixture 'name' (<node id>)"
    start_tick: int
    fixture: bool
    exempt: bool = False
    done: bool = False  # a test's: checked already
    owned: dict[tuple[int, int], bool] = field(default_factory=dict)  # its processes


# --- options, marker, activation ----------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("proctable", "leaked processes (proctable)")
    group.addoption(
        "--leaked-processes", dest="leaked_processes", default=None,
        choices=[*MODES, "off"],
        help="report processes a test leaves running: warn, fail (an error in the "
             "test's teardown) or kill (end them through a lineage teardown, and warn); "
             "off overrides the ini option. Default: the leaked_processes ini option, "
             "else off.")
    parser.addini("leaked_processes", default="",
                  help="warn|fail|kill|off: as --leaked-processes (default off)")
    parser.addini("leaked_processes_grace", default=str(DEFAULT_GRACE),
                  help="seconds a test's process may take to exit after its teardown "
                       f"before it counts as leaked (default {DEFAULT_GRACE})")


def _mode(config: pytest.Config) -> Optional[str]:
    mode = config.getoption("leaked_processes") or str(config.getini("leaked_processes"))
    mode = mode.strip().lower()
    if mode in ("", "off"):
        return None
    if mode not in MODES:
        raise pytest.UsageError(
            f"leaked_processes = {mode!r}: expected one of {', '.join(MODES)} or off")
    return mode


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(reason=None): this test may leave processes running "
        "(proctable's --leaked-processes does not report them)")
    mode = _mode(config)
    if mode is None:
        return
    try:
        grace = float(str(config.getini("leaked_processes_grace")))
    except ValueError:
        raise pytest.UsageError("leaked_processes_grace must be a number of seconds") from None
    if not sys.platform.startswith("linux"):
        config.issue_config_time_warning(LeakedProcessWarning(
            f"--leaked-processes needs Linux's /proc/<pid>/environ: off on {sys.platform}"),
            stacklevel=2)
        return
    config.pluginmanager.register(LeakGuard(config, mode, grace), "proctable-leak-guard")


# --- the guard -----------------------------------------------------------------------

_active: list[LeakGuard] = []  # guards of this process (pytester runs nest them)


def _after_fork_in_child() -> None:
    # Runs in every child of os.fork() (and subprocess with preexec_fn): note it.
    for guard in _active:
        guard.note_fork()


_hooked = False


class LeakGuard:
    """The plugin's state for one pytest run (one per xdist worker)."""

    def __init__(self, config: pytest.Config, mode: str, grace: float) -> None:
        from . import _lowlevel as _ll  # noqa: PLC0415 - only when asked for

        self.config = config
        self.mode = mode
        self.grace = grace
        self.me = os.getpid()
        self.token = f"{self.me}.{secrets.token_hex(4)}"
        self.base = os.environ.get(ENV, "")  # an outer run's marker, kept in front
        self.ticks = _ll.TICKS_PER_SECOND
        self.scopes: list[_Scope] = []
        self.current: Optional[_Scope] = None
        self.stack: list[Optional[_Scope]] = []
        self.known: dict[tuple[int, int], Optional[int]] = {}  # -> scope index or None
        self.fixture_scopes: dict[int, _Scope] = {}  # id(fixturedef) -> scope
        self.finalized: list[_Scope] = []
        self.unsure: dict[tuple[int, int], int] = {}  # environ unreadable: looks left
        self.late: list[tuple[int, int]] = []  # found after their test was checked
        self.leaks: list[tuple[str, list[dict[str, Any]]]] = []  # for the summary
        self.last_pid = _last_pid()
        self.checks = 0  # teardowns checked by this process
        self.spent = 0.0  # CPU seconds this process spent checking
        self.my_sid = os.getsid(0)
        fd, self.registry = tempfile.mkstemp(prefix="proctable-forks-", suffix=".txt")
        os.close(fd)
        self.registry_pos = 0
        self.forks: dict[int, tuple[int, int]] = {}  # pid -> (scope index, tick)
        self.seen: dict[int, int] = _listing()  # pid -> /proc/<pid> inode at the last look
        global _hooked
        if not _hooked and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _hooked = True
        _active.append(self)

    # -- clock, marker, registry ---------------------------------------------------

    def tick(self) -> int:
        """Clock ticks since boot now: the unit of a process's start time."""
        return int(time.clock_gettime(time.CLOCK_BOOTTIME) * self.ticks)

    def _enter(self, scope: Optional[_Scope]) -> None:
        self.stack.append(self.current)
        self._set(scope)

    def _leave(self) -> None:
        self._set(self.stack.pop() if self.stack else None)

    def _set(self, scope: Optional[_Scope]) -> None:
        self.current = scope
        if scope is None:
            if self.base:
                os.environ[ENV] = self.base
            else:
                os.environ.pop(ENV, None)
            return
        mark = f"{self.token}/{scope.index}"
        os.environ[ENV] = f"{self.base};{mark}" if self.base else mark

    def _new_scope(self, label: str, fixture: bool, exempt: bool = False) -> _Scope:
        s = _Scope(len(self.scopes), label, self.tick(), fixture, exempt)
        self.scopes.append(s)
        return s

    def note_fork(self) -> None:
        """In a forked child: append (pid, scope, tick) to the registry."""
        scope = self.current
        if scope is None or os.getpid() == self.me:
            return
        try:
            fd = os.open(self.registry, os.O_WRONLY | os.O_APPEND)
        except OSError:
            return  # dropped privileges, or the run is over: nothing to note
        try:
            os.write(fd, f"{os.getpid()} {scope.index} {self.tick()}\n".encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    def _read_registry(self) -> None:
        try:
            with open(self.registry, "rb") as f:
                f.seek(self.registry_pos)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self.registry_pos += end
        for line in data[:end].splitlines():
            try:
                pid, index, tick = (int(x) for x in line.split())
            except ValueError:
                continue
            self.forks[pid] = (index, tick)

    def _marker(self, pid: int) -> Optional[int]:
        """The scope index in pid's environment marker: >= 0 for one of ours,
        _NOT_OURS when its environment has none of ours (or cannot be read: another
        user's, without root), _UNSURE when it is empty (mid-exec)."""
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            return _NOT_OURS  # gone, or another user's (without root): ancestry may tell
        if not env:
            return _UNSURE  # mid-exec: its new environment is not in place yet
        key = ENV.encode() + b"="
        at = env.find(key)
        while at > 0 and env[at - 1] != 0:
            at = env.find(key, at + 1)
        if at < 0:
            return _NOT_OURS
        end = env.find(b"\x00", at)
        value = env[at + len(key): end if end >= 0 else len(env)].decode("ascii", "replace")
        mine = f"{self.token}/"
        for part in value.split(";"):
            if part.startswith(mine):
                try:
                    index = int(part[len(mine):])
                except ValueError:
                    return _NOT_OURS
                return index if 0 <= index < len(self.scopes) else _NOT_OURS
        return _NOT_OURS

    # -- finding and judging ---------------------------------------------------------

    def _new_pids(self) -> list[int]:
        """Pids listed in /proc now that were not, or not as the same directory, at
        the last look: a (pid, inode) diff of one listing, so that a check costs in
        proportion to the processes started, not to the host's (a reused pid has a
        new /proc/<pid> inode)."""
        now = _listing()
        seen = self.seen
        new = [pid for pid, ino in now.items() if seen.get(pid) != ino]
        self.seen = now
        if len(self.known) > 2 * len(now) + 1024:
            # Forget what is gone (a (pid, start time) never comes back).
            self.known = {k: v for k, v in self.known.items() if k[0] in now}
        return new

    def _attribute(self, view: _View, new: Iterable[int], since: int,
                   fallback: Optional[_Scope], retry: bool = False) -> None:
        """Give every new process that is not known yet its scope, or None (not
        ours): by its marker, the fork registry, or, for one below this process
        that started since `since` (clock ticks), its nearest known ancestor or the
        fallback. One caught mid-exec (an empty environment) that nothing else ties
        to us is looked at again (retry: in the same check, without using up its
        looks)."""
        self._read_registry()
        fresh = [r for pid in new if pid != self.me and (r := view.get(pid)) is not None
                 and (r.pid, r.start_time) not in self.known]
        tries = self.unsure
        again = [r for k in tries if (r := view.get(k[0])) is not None
                 and r.start_time == k[1]]
        self.unsure = {}
        for p in sorted({(r.pid, r.start_time): r for r in fresh + again}.values(),
                        key=lambda r: r.start_time):
            key = (p.pid, p.start_time)
            index: Optional[int] = self._marker(p.pid)
            unsure = index == _UNSURE
            if index is not None and index < 0:
                index = None
            if index is None:
                fork = self.forks.get(p.pid)
                if fork is not None and p.start_time <= fork[1]:
                    index = fork[0]
            if index is None and p.start_time >= since and view.below(p):
                index = self._owner_above(p, view, fallback)
            if index is None and unsure:
                left = tries.get(key, _LOOKS) - (0 if retry else 1)
                if left > 0:
                    self.unsure[key] = left
                    continue
                # still empty after its looks: not ours, as far as anything shows
            if index is not None and _is_stdlib_service(p.pid):
                if _forked_without_exec(p.pid) is False:
                    index = None  # the service itself (exec'd): never a leak
                else:
                    # A fork of the service (the forkserver's Process): its
                    # environment and command line are the service's, from the
                    # test that started the service; ancestry and start time tell.
                    index = self._forked_by_service(p, view, since, fallback)
            self._own(key, index)

    def _own(self, key: tuple[int, int], index: Optional[int]) -> None:
        """Note whose the process is (None: not ours)."""
        self.known[key] = index
        if index is not None:
            scope = self.scopes[index]
            scope.owned[key] = True
            if scope.done:
                self.late.append(key)

    def _forked_by_service(self, p: Proc, view: _View, since: int,
                           fallback: Optional[_Scope]) -> Optional[int]:
        """The scope of a process forked by a stdlib service of ours (found new
        now): that of its nearest ancestor of ours below this process, else the
        scope being checked."""
        if p.start_time >= since and view.below(p):
            return self._owner_above(p, view, fallback)
        return None if fallback is None else fallback.index

    def _owner_above(self, p: Proc, view: _View, fallback: Optional[_Scope]) -> Optional[int]:
        """A descendant without a marker: the scope of its nearest ancestor that is
        known as ours (a fixture's server starting workers), else the fallback."""
        for row in view.ancestors(p):
            index = self.known.get((row.pid, row.start_time))
            if index is not None:
                return index
        return None if fallback is None else fallback.index

    def _alive(self, view: _View, keys: Iterable[tuple[int, int]]) -> list[Proc]:
        out = []
        for pid, start in keys:
            row = view.get(pid)
            if row is not None and row.start_time == start and _runs(row):
                out.append(row)
        return out

    def _wait_gone(self, rows: list[Proc]) -> list[Proc]:
        """The rows still running after at most `grace` seconds (bounded)."""
        from .table import read  # noqa: PLC0415

        deadline = time.monotonic() + self.grace
        left = rows
        while True:
            now_left = []
            for r in left:
                try:
                    cur = read(r.pid, memory=False)
                except OSError:
                    cur = None
                if cur is not None and cur.start_time == r.start_time and _runs(cur):
                    now_left.append(cur)
            left = now_left
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.01)  # a bounded poll for an exit, not a synchronisation

    def _describe(self, row: Proc, view: _View, scope: _Scope) -> Leak:
        if row.sid is not None and row.sid != self.my_sid:
            how = "new session"  # (also a child that called setsid: it left the session)
        elif view.below(row):
            how = "child"
        else:
            how = "re-parented orphan"
        return Leak(row.pid, row.start_time, row.name, _cmdline(row.pid), how, scope.label)

    def _kill(self, leaks: list[Leak], view: _View) -> None:
        """End each leak (and what it started) through a lineage teardown, then say
        of each whether it is proven gone."""
        from .errors import ProctableError  # noqa: PLC0415
        from .lineage import Lineage  # noqa: PLC0415
        from .table import Identity  # noqa: PLC0415

        pids = {lk.pid for lk in leaks}
        for lk in leaks:
            row = view.get(lk.pid)
            if row is not None and row.ppid in pids:
                continue  # its parent's lineage takes it along
            try:
                with Lineage(Identity(lk.pid, lk.start_time), mode="scan") as lin:
                    lin.terminate(grace=1.0, kill_timeout=5.0)
            except (ProctableError, OSError):
                pass  # gone already (NoSuchProcess), or a TeardownError: told below
        for lk in leaks:
            lk.killed = not Identity(lk.pid, lk.start_time).alive()

    def check(self, item: pytest.Item, test: _Scope) -> tuple[list[Leak], list[Leak]]:
        """After the test's teardown: (the test's leaks, leaks of fixtures finalized in
        it). Marks all of them known, so that no later test reports them again."""
        finalized, self.finalized = [f for f in self.finalized if f.owned], []
        last = _last_pid()
        if last is not None and last == self.last_pid and not finalized and not (
                self.unsure or self.late):
            # No pid was handed out since the last look: nothing new can be running.
            return [], []
        self.last_pid = last
        view = _View(self.me)
        self._attribute(view, self._new_pids(), test.start_tick, test)
        deadline = time.monotonic() + 0.5
        while self.unsure and time.monotonic() < deadline:
            # caught mid-exec: its environment is there a moment later
            time.sleep(0.005)
            self._attribute(_View(self.me), (), test.start_tick, test, retry=True)
        test.done = True
        rows = self._alive(view, list(test.owned))
        late, self.late = self.late, []
        late_rows = [(self.scopes[i], r) for r in self._alive(view, late)
                     if (i := self.known.get((r.pid, r.start_time))) is not None
                     and not self.scopes[i].exempt and self.scopes[i] is not test]
        fixture_rows = [(s, self._alive(view, s.owned)) for s in finalized if not s.exempt]
        fixture_rows += [(sc, [r]) for sc, r in late_rows]  # told under their own scope
        candidates = rows + [r for _, rs in fixture_rows for r in rs]
        for s in finalized:
            s.owned.clear()
        test.owned.clear()  # known now, under the test's index: never reported again
        if not candidates:
            return [], []
        still = {(r.pid, r.start_time) for r in self._wait_gone(candidates)}
        view = _View(self.me)  # the rows as they are now, after the grace
        now = {k: r for k in still if (r := view.get(k[0])) is not None
               and r.start_time == k[1] and _runs(r)}
        leaks = [] if test.exempt else [self._describe(now[k], view, test) for r in rows
                                        if (k := (r.pid, r.start_time)) in now]
        fixture_leaks = [self._describe(now[k], view, s) for s, rs in fixture_rows
                         for r in rs if (k := (r.pid, r.start_time)) in now]
        if self.mode == "kill" and (leaks or fixture_leaks):
            self._kill(leaks + fixture_leaks, view)
        return leaks, fixture_leaks

    # -- hooks ---------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, object, object]:
        exempt = item.get_closest_marker(MARKER) is not None
        scope = self._new_scope(item.nodeid, fixture=False, exempt=exempt)
        item.stash[_SCOPE] = scope
        self._enter(scope)
        return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any
                             ) -> Generator[None, object, object]:
        if getattr(fixturedef, "scope", "function") == "function" or self.current is None:
            return (yield)
        where = getattr(request.node, "nodeid", "") or "session"
        scope = self._new_scope(
            f"{fixturedef.scope}-scoped fixture {fixturedef.argname!r} ({where})", fixture=True)
        self.fixture_scopes[id(fixturedef)] = scope
        self._enter(scope)
        try:
            return (yield)
        finally:
            self._leave()
            # Processes it started below us without a marker (a scrubbed environment)
            # are its own, not the test's that happens to set it up.
            t0 = time.process_time()
            self._attribute(_View(self.me), self._new_pids(), scope.start_tick, scope)
            self.spent += time.process_time() - t0

    @pytest.hookimpl(tryfirst=True)
    def pytest_fixture_post_finalizer(self, fixturedef: Any, request: Any) -> None:
        scope = self.fixture_scopes.pop(id(fixturedef), None)
        if scope is not None:
            self.finalized.append(scope)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: Optional[pytest.Item]
                                ) -> Generator[None, object, object]:
        failed = True
        try:
            result = yield
            failed = False
        finally:
            scope = item.stash.get(_SCOPE, None)
            leaks: list[Leak] = []
            fixture_leaks: list[Leak] = []
            if scope is not None:
                t0 = time.process_time()
                try:
                    leaks, fixture_leaks = self.check(item, scope)
                finally:
                    self._set(None)
                    self.stack.clear()
                    self.checks += 1
                    self.spent += time.process_time() - t0
            self._report(item, leaks, fixture_leaks, raise_=not failed)
        return result

    def _report(self, item: pytest.Item, leaks: list[Leak], fixture_leaks: list[Leak],
                raise_: bool) -> None:
        every = leaks + fixture_leaks
        if not every:
            return
        item.stash[_LEAKS] = [lk.as_dict() for lk in every]
        text = _message(leaks, fixture_leaks, item.nodeid)
        if self.mode == "fail" and raise_:
            pytest.fail(text, pytrace=False)
        # Located at the test, not here: the warnings summary names the test's line.
        path, line, _ = item.location
        lineno = line + 1 if line is not None else 0
        warnings.warn_explicit(LeakedProcessWarning(text), LeakedProcessWarning,
                               filename=str(item.path) if line is not None else path,
                               lineno=lineno, module=item.module.__name__
                               if isinstance(item, pytest.Function) and item.module else None)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any
                                  ) -> Generator[None, Any, Any]:
        report = yield
        if call.when == "teardown":
            found = item.stash.get(_LEAKS, None)
            if found:
                report.leaked_processes = found  # survives xdist's report transport
        return report

    # -- the summary (plain runs, and the xdist controller, from the workers' reports)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        found = getattr(report, "leaked_processes", None)
        if found and report.when == "teardown":
            self.leaks.append((report.nodeid, list(found)))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.checks and terminalreporter.verbosity > 0:
            terminalreporter.write_line(
                f"leaked processes: {self.checks} teardowns checked in "
                f"{self.spent:.2f} s of CPU time ({self.mode})")
        if not self.leaks:
            return
        total = sum(len(v) for _, v in self.leaks)
        terminalreporter.write_sep(
            "=", f"leaked processes: {total} from {len(self.leaks)} test(s)", yellow=True)
        for nodeid, found in self.leaks:
            terminalreporter.write_line(nodeid)
            for d in found:
                lk = Leak(**d)
                where = "" if lk.scope == nodeid else f"  [{lk.scope}]"
                terminalreporter.write_line(f"    {lk.line()}{where}")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self in _active:
            _active.remove(self)
        try:
            os.unlink(self.registry)
        except OSError:
            pass
        self._set(None)


_SCOPE = pytest.StashKey[_Scope]()
_LEAKS = pytest.StashKey[list[dict[str, Any]]]()


# --- helpers -------------------------------------------------------------------------


def _listing() -> dict[int, int]:
    """pid -> inode of its /proc directory, from one listing (getdents: no stat)."""
    out = {}
    with os.scandir("/proc") as it:
        for entry in it:
            name = entry.name
            if name.isdigit():
                out[int(name)] = entry.inode()
    return out


class _View:
    """Rows of one look at the table, read on demand (one read per pid)."""

    def __init__(self, me: int) -> None:
        self.me = me
        self.rows: dict[int, Optional[Proc]] = {}

    def get(self, pid: int) -> Optional[Proc]:
        if pid in self.rows:
            return self.rows[pid]
        from .errors import ProctableError  # noqa: PLC0415
        from .table import read  # noqa: PLC0415

        try:
            row = read(pid, memory=False) if pid > 0 else None
        except (OSError, ProctableError):  # denied (hidepid), or caught mid-exit
            row = None
        self.rows[pid] = row
        return row

    def ancestors(self, p: Proc) -> Iterator[Proc]:
        """p's parent, its parent, ... up to (not including) this process or init;
        a parent that started after its child is a reused pid: the walk stops."""
        row, depth = self.get(p.ppid), 0
        child = p
        while row is not None and row.pid != self.me and depth < 4096:
            if row.start_time > child.start_time:
                return
            yield row
            child, row, depth = row, self.get(row.ppid), depth + 1

    def below(self, p: Proc) -> bool:
        """Is p a descendant of this process?"""
        row, depth, child = self.get(p.ppid), 0, p
        while row is not None and depth < 4096:
            if row.start_time > child.start_time:
                return False
            if row.pid == self.me:
                return True
            child, row, depth = row, self.get(row.ppid), depth + 1
        return False


def _last_pid() -> Optional[int]:
    """The pid most recently handed out in this pid namespace (/proc/loadavg)."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[4])
    except (OSError, ValueError, IndexError):
        return None


def _runs(row: Proc) -> bool:
    """Still running: not a zombie (one whose other threads run still counts)."""
    return not (row.state in ("Z", "X") and (row.num_threads or 1) <= 1)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return "?"
    args = raw.rstrip(b"\x00").split(b"\x00")
    text = " ".join(a.decode("utf-8", "backslashreplace") for a in args)
    return text if len(text) <= 200 else text[:197] + "..."


def _is_stdlib_service(pid: int) -> bool:
    """Does pid carry a stdlib service's command line (the service, or a fork of it)?"""
    text = _cmdline(pid)
    return any(s in text for s in _STDLIB_SERVICES)


_PF_FORKNOEXEC = 0x00000040  # include/linux/sched.h: forked but didn't exec


def _forked_without_exec(pid: int) -> Optional[bool]:
    """Did pid fork from its parent without an exec since (the kernel's
    PF_FORKNOEXEC, field 9 of /proc/<pid>/stat)? None when unreadable. The stdlib
    services are exec'd (False); the forkserver's children are its forks (True),
    with its command line."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return bool(int(fields[9 - 3]) & _PF_FORKNOEXEC)
    except (OSError, ValueError, IndexError):
        return None


def _message(leaks: list[Leak], fixture_leaks: list[Leak], nodeid: str) -> str:
    parts = []
    if leaks:
        verb = "left" if leaks[0].killed is None else "left (killed now)"
        parts.append(f"{nodeid} {verb} {len(leaks)} process(es) running:\n"
                     + "\n".join("  " + lk.line() for lk in leaks))
    by_scope: dict[str, list[Leak]] = {}
    for lk in fixture_leaks:
        by_scope.setdefault(lk.scope, []).append(lk)
    for label, group in by_scope.items():
        parts.append(f"{label} left {len(group)} process(es) running after its teardown:\n"
                     + "\n".join("  " + lk.line() for lk in group))
    return "\n".join(parts)
