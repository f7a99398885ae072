"""``proctable run``: run a command as a lineage, report and end what it leaves behind."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any, Optional, TextIO, Union

from .._argtypes import seconds_arg
from .._status import ExitStatus
from ..errors import ProctableError, TeardownError
from ..table import Identity, Proc
from ._protocol import JsonLines
from ._runevents import MemberTracker, RunEvents, lineage_changes

if TYPE_CHECKING:  # loaded by run_command: the other commands never need them
    from ..lineage import Lineage

__all__ = ["register", "run_command"]

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _exit_code(status: Optional[ExitStatus]) -> int:
    """The shell's convention: the code, or 128 + signal for a signal death."""
    if status is None:
        return 1
    if status.signal is not None:
        return 128 + status.signal
    return status.code if status.code is not None else 1


def _precheck(cmd: str) -> Optional[tuple[int, str]]:
    """(exit code, message) when cmd cannot run at all: 127 not found, 126 not executable."""
    if os.sep in cmd:
        if not os.path.exists(cmd):
            return 127, f"proctable run: {cmd}: no such file"
        if os.path.isdir(cmd) or not os.access(cmd, os.X_OK):
            return 126, f"proctable run: {cmd}: not executable"
        return None
    if shutil.which(cmd) is None:
        return 127, f"proctable run: {cmd}: command not found"
    return None


def _describe(procs: list[Proc]) -> str:
    n = len(procs)
    names = ", ".join(f"{p.pid} {p.name}" for p in procs)
    return f"{n} process{'es' if n != 1 else ''} outlived the command: {names}"


class _TeardownWatch:
    """Beside a teardown: re-reads each process it waits for (by pid and start time),
    so that a survivor is named as of the teardown rather than as first seen (a job
    that execs during the grace); and where ``tell`` (stderr is a terminal), once the
    teardown has waited a moment, says in one line what it waits for and when it
    kills. Without a thread for it, names stay as first seen and nothing is said."""

    LOOK = 0.05   # seconds between two reads of the names
    QUIET = 0.25  # a teardown that ends sooner says nothing

    def __init__(self, procs: list[Proc], grace: float, tell: bool) -> None:
        self.rows = {(p.pid, p.start_time): p for p in procs}
        self.grace = grace
        self.tell = tell
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._t0 = time.monotonic()

    def __enter__(self) -> _TeardownWatch:
        if self.rows:
            t = threading.Thread(target=self._run, name="proctable-run-teardown", daemon=True)
            try:
                t.start()
            except RuntimeError:  # no thread (RLIMIT_NPROC): the teardown matters, not this
                return self
            self._thread = t
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(1.0)

    def named(self, procs: list[Proc], report: Any) -> list[Proc]:
        """procs, each with its row as last read here, or else as the teardown's report
        last saw it (its name as of the teardown)."""
        seen = {(m.proc.pid, m.proc.start_time): m.proc
                for m in getattr(report, "members", ())}
        out = []
        for p in procs:
            key = (p.pid, p.start_time)
            row = self.rows.get(key, p)
            out.append(seen.get(key, p) if row is p else row)
        return out

    def _run(self) -> None:
        told = not self.tell
        while True:
            alive = self._look()
            if not alive:
                return
            waited = time.monotonic() - self._t0
            if not told and waited >= self.QUIET and waited < self.grace:
                told = True
                n = len(alive)
                names = ", ".join(f"{p.pid} {p.name}" for p in alive)
                print(f"proctable run: waiting up to {self.grace - waited:.1f} s for {n} "
                      f"process{'es' if n != 1 else ''} ({names}) to exit on SIGTERM, "
                      "then SIGKILL", file=sys.stderr, flush=True)
            if self._done.wait(self.LOOK):
                return

    def _look(self) -> list[Proc]:
        """The processes still running, each re-read (a pid now naming another process,
        or a zombie, is not one of them)."""
        alive = []
        for key, old in list(self.rows.items()):
            try:
                row = Identity(old.pid, old.start_time).current(memory=False)
            except (ProctableError, OSError):
                continue
            if row is not None and row.state not in ("Z", "X"):
                self.rows[key] = row
                alive.append(row)
        return alive


class _Forwarder:
    """Forwards SIGINT/SIGTERM/SIGHUP to the current run's root while installed."""

    def __init__(self) -> None:
        self.target: Any = None
        self.root_pid: Optional[int] = None  # the command (its group decides who got ^C)
        self.received: Optional[int] = None
        self.count = 0                       # signals received so far
        self.first_at: Optional[float] = None  # monotonic time of the first one
        # (signal, forwarded) for the events stream: written by the main loop,
        # never from the handler (a write there could land inside another one).
        self.log: list[tuple[int, bool]] = []
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Optional[FrameType]) -> None:
        self.received = signum
        self.count += 1
        if self.first_at is None:
            self.first_at = time.monotonic()
        proc = self.target
        if proc is None or proc.returncode is not None:
            self.log.append((signum, False))
            return
        if signum == signal.SIGINT and _terminal_delivered_sigint(self.root_pid):
            self.log.append((signum, True))
            return  # the terminal sent it to the command's process group already
        try:
            proc.send_signal(signum)
            self.log.append((signum, True))
        except (ProcessLookupError, OSError):
            self.log.append((signum, False))

    def __enter__(self) -> _Forwarder:
        for sig in _FORWARDED:
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _terminal_delivered_sigint(root_pid: Optional[int]) -> bool:
    """True when we are the terminal's foreground group and the command is in it:
    Ctrl-C reached the command too. (In the reaper modes the command leads a group
    of its own: then it is passed on.)"""
    try:
        fd = sys.stdin.fileno()
        ours = os.getpgrp()
        return (os.isatty(fd) and os.tcgetpgrp(fd) == ours and root_pid is not None
                and os.getpgid(root_pid) == ours)
    except (OSError, ValueError, AttributeError):
        return False


class _Stream:
    """The events of a run: nothing at all without --events."""

    def __init__(self, events: Optional[RunEvents]) -> None:
        self.events = events
        self.tracker: Optional[MemberTracker] = None
        self.warned = False

    def follow(self, lin: Lineage) -> None:
        self.tracker = MemberTracker(lin.root) if self.events is not None else None

    def tick(self, lin: Lineage, fwd: _Forwarder) -> None:
        """Write what happened since the last tick: signals, members joined and left."""
        ev = self.events
        if ev is None:
            return
        while fwd.log:
            signum, forwarded = fwd.log.pop(0)
            ev.signal(signum, signal.Signals(signum).name, forwarded)
        if self.tracker is not None:
            try:
                changes = lineage_changes(lin, self.tracker)
            except Exception as exc:  # a failed sample must not end the run
                if not self.warned:
                    print(f"proctable run: sampling the lineage failed: {exc}", file=sys.stderr)
                    self.warned = True
                return
            for ch in changes:
                ev.changed(ch)


def run_command(argv: list[str], grace: float = 5.0, mode: str = "auto",
                restart: str = "never", json_report: Union[str, TextIO, None] = None,
                kill_timeout: float = 5.0, events: Optional[RunEvents] = None,
                popen_kwargs: Optional[dict[str, Any]] = None) -> int:
    """Run argv as a lineage until it ends; tear down what it left; return its exit code.

    With ``events``, the run's life is written as protocol objects as it happens.
    ``json_report`` is a path, or a stream opened for writing (the command line
    opens it before the run, so that a bad path is refused before anything runs).
    """
    stream = _Stream(events)
    bad = _precheck(argv[0])
    if bad is not None:
        print(bad[1], file=sys.stderr)
        if events is not None:
            events.end(bad[0], bad[1])
        return bad[0]
    from ..lineage import Lineage  # noqa: PLC0415 - see the imports above
    from ..supervise._policy import Counters, RestartPolicy, decide  # noqa: PLC0415

    policy = RestartPolicy(max_fast_exits=5)
    counters = Counters()
    runs: list[dict[str, Any]] = []
    code = 1
    error: Optional[str] = None
    with _Forwarder() as fwd:
        while True:
            started = time.monotonic()
            try:
                lin = Lineage.spawn(list(argv), mode=mode, **(popen_kwargs or {}))
            except OSError as exc:
                msg = f"proctable run: {argv[0]}: {exc.strerror or exc}"
                print(msg, file=sys.stderr)
                code = 127 if isinstance(exc, FileNotFoundError) else 126
                if events is not None:
                    events.end(code, msg)
                return code
            fwd.target = lin.process
            fwd.root_pid = lin.root.pid if lin.root is not None else None
            if events is not None:
                events.started(argv, lin.mode, lin.root, lin.process.pid)
            stream.follow(lin)
            try:
                status = _wait_root(lin, fwd, grace, stream)
                # Whatever is still a member now outlived the command (or, when an
                # interrupt is being enforced, runs beside it).
                skip = {lin.process.pid} | ({lin.root.pid} if lin.root is not None else set())
                if stream.tracker is not None:
                    stream.tick(lin, fwd)
                    left = [m for m in stream.tracker.alive() if m.pid not in skip]
                else:
                    left = [m for m in lin.members() if m.pid not in skip]
            except BaseException:
                fwd.target = None
                try:  # never leave the lineage running, whatever failed
                    lin.terminate(grace=grace, kill_timeout=kill_timeout)
                except TeardownError as exc:
                    print(f"proctable run: {exc}", file=sys.stderr)
                raise
            fwd.target = None
            code = _exit_code(status)
            if events is not None and status is not None:
                events.exited(lin.root, lin.process.pid, status, code,
                              time.monotonic() - started, forced=False)
            report: Any = None
            survivors: list[Any] = []
            teardown_error: Optional[str] = None
            waited = left + _root_row(lin, status)
            with _TeardownWatch(waited, grace, _on_a_terminal(sys.stderr)) as watch:
                try:
                    report = lin.terminate(grace=grace, kill_timeout=kill_timeout)
                except TeardownError as exc:
                    survivors = list(exc.survivors)
                    report = exc.report
                    teardown_error = error = str(exc)
                    print(f"proctable run: {exc}", file=sys.stderr)
            left = watch.named(left, report)  # each survivor named as of the teardown
            if events is not None:
                events.teardown(report, left, teardown_error, lin.mode)
            forced = status is None
            if forced:  # interrupted and not obeyed: ended by the teardown
                try:
                    status = ExitStatus.from_returncode(lin.process.wait(timeout=1.0))
                except subprocess.TimeoutExpired:
                    status = None
                code = _exit_code(status)
                if events is not None:
                    events.exited(lin.root, lin.process.pid, status, code,
                                  time.monotonic() - started, forced=True)
            if left:
                print(f"proctable run: {_describe(left)}", file=sys.stderr)
            runs.append({
                "args": list(argv),
                "mode": lin.mode,
                "exit": None if status is None else status._asdict(),
                "exit_code": code,
                "seconds": round(time.monotonic() - started, 3),
                "outlived": [{"pid": p.pid, "name": p.name, "start_time": p.start_time}
                             for p in left],
                "survivors": [repr(s) for s in survivors],
                "teardown": repr(report) if report is not None else None,
            })
            if fwd.received is not None or restart == "never":
                break
            clean = status is not None and status.signal is None and status.code == 0
            if restart == "on-crash" and clean:
                break
            d = decide(policy, counters, status, time.monotonic() - started)
            if d.action == "give_up":
                print(f"proctable run: giving up: {d.reason}", file=sys.stderr)
                if events is not None:
                    events.gave_up(d.reason)
                break
            counters = d.counters
            print(f"proctable run: restarting: {d.reason}", file=sys.stderr)
            if events is not None:
                events.restarting(d.reason)
        if events is not None:
            while fwd.log:  # signals that came after the last run's lineage closed
                signum, forwarded = fwd.log.pop(0)
                events.signal(signum, signal.Signals(signum).name, forwarded)
    if json_report is not None:
        try:
            if isinstance(json_report, str):
                with open(json_report, "w") as f:
                    json.dump({"exit_code": code, "runs": runs}, f, indent=2)
            else:
                json.dump({"exit_code": code, "runs": runs}, json_report, indent=2)
                json_report.flush()
        except OSError as exc:  # the command's code is still the answer
            name = json_report if isinstance(json_report, str) else json_report.name
            print(f"proctable run: --json-report {name}: {exc.strerror or exc}",
                  file=sys.stderr)
    if events is not None:
        events.end(code, error)
    return code


def _root_row(lin: Lineage, status: Optional[ExitStatus]) -> list[Proc]:
    """The command's own row where it still runs (an interrupt it did not obey): the
    teardown waits for it too."""
    if status is not None or lin.root is None:
        return []
    try:
        row = lin.root.current(memory=False)
    except (ProctableError, OSError):
        return []
    return [] if row is None else [row]


def _on_a_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError, AttributeError):
        return False


def _wait_root(lin: Lineage, fwd: _Forwarder, grace: float,
               stream: _Stream) -> Optional[ExitStatus]:
    """Wait for the command to end, or for an interrupt it does not obey.

    After a forwarded signal the command has ``grace`` seconds to end on its own;
    a second signal, or the end of the grace, returns None and the caller tears
    the lineage down (SIGTERM, then SIGKILL): an interrupt always ends the run.
    """
    proc = lin.process
    while True:
        stream.tick(lin, fwd)
        try:
            return ExitStatus.from_returncode(proc.wait(timeout=0.05))
        except subprocess.TimeoutExpired:
            pass
        if fwd.first_at is not None and (
                fwd.count > 1 or time.monotonic() - fwd.first_at >= grace):
            return None


_FD_PATH = re.compile(r"/(?:dev|proc/self)/fd/([0-9]+)")


def _events_fd(fd: int) -> TextIO:
    """A stream on the inherited fd itself, never reopened: a socketpair (Node's extra
    stdio) cannot be opened through /dev/fd/N (ENXIO), and a pipe or file need not be.
    The fd stays open after the stream is done with it (closefd=False)."""
    os.fstat(fd)  # EBADF now, not at the first event
    return open(fd, "w", encoding="ascii", buffering=1, closefd=False)


def _open_events(target: str) -> tuple[Optional[TextIO], bool]:
    """The stream for --events: stdout for "-"; the inherited fd N itself for
    /dev/fd/N (or /proc/self/fd/N); else the file (a fifo, a path)."""
    if target == "-":
        return sys.stdout, False
    m = _FD_PATH.fullmatch(target)
    if m is not None:
        return _events_fd(int(m.group(1))), True
    return open(target, "w", encoding="ascii", buffering=1), True


def _cmd_run(args: argparse.Namespace) -> int:
    argv = list(args.cmd)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("proctable run: no command given (proctable run -- CMD ARGS...)", file=sys.stderr)
        return 2
    events: Optional[RunEvents] = None
    stream: Optional[TextIO] = None
    owned = False
    popen_kwargs: dict[str, Any] = {}
    if args.events is not None and args.events_fd is not None:
        print("proctable run: --events and --events-fd: give one of them", file=sys.stderr)
        return 2
    target = args.events if args.events_fd is None else f"/dev/fd/{args.events_fd}"
    if target is not None:
        try:
            stream, owned = _open_events(target)
        except OSError as exc:
            print(f"proctable run: --events {target}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
        assert stream is not None
        events = RunEvents(JsonLines(stream))
        if target == "-":
            # stdout carries the protocol: the command's own output goes to stderr.
            popen_kwargs["stdout"] = sys.stderr.fileno()
    report: Optional[TextIO] = None
    if args.json_report is not None:  # opened now: a bad path is refused before the run
        try:
            report = open(args.json_report, "w")  # noqa: SIM115 - closed below
        except OSError as exc:
            print(f"proctable run: --json-report {args.json_report}: {exc.strerror or exc}",
                  file=sys.stderr)
            if owned and stream is not None:
                stream.close()
            return 2
    try:
        return run_command(argv, grace=args.grace, mode=args.mode, restart=args.restart,
                           json_report=report, events=events,
                           popen_kwargs=popen_kwargs)
    finally:
        for f in (stream if owned else None, report):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass


def _fd_arg(text: str) -> int:
    try:
        fd = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a file descriptor: {text!r}") from None
    if fd < 0:
        raise argparse.ArgumentTypeError(f"not a file descriptor: {text!r}")
    return fd


def register(sub: Any) -> None:
    """Add ``proctable run`` to the command line's subparsers."""
    p = sub.add_parser(
        "run",
        help="run a command as a lineage; end and report what it leaves behind",
        description="Run CMD with its whole lineage tracked (escapes by setsid, double fork "
        "or nohup included). When it ends, or is interrupted, every process it started is "
        "torn down, and those that outlived it are named on stderr (by their names as of "
        "the teardown); on a terminal, a teardown that waits out its grace says what it "
        "waits for and when it kills. SIGINT, SIGTERM and "
        "SIGHUP are forwarded to CMD. Exits with the command's code (128+N for signal N; "
        "127: not found, 126: not executable).",
    )
    p.add_argument("--grace", type=seconds_arg, default=5.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL at teardown (default 5)")
    p.add_argument("--mode", choices=["auto", "cgroup", "subreaper", "scan"], default="auto",
                   help="lineage backend (default: the strongest this host allows)")
    p.add_argument("--restart", choices=["on-crash", "always", "never"], default="never",
                   help="run it again after a crash, after any exit, or never (default)")
    p.add_argument("--events", metavar="FILE", default=None,
                   help="stream the run's life as JSON lines to FILE as it happens (started, "
                   "joined, left, exited, teardown, end; see docs/protocol.md); '-' is stdout, "
                   "and the command's own stdout then goes to stderr")
    p.add_argument("--events-fd", metavar="N", type=_fd_arg, default=None,
                   help="stream the same JSON lines to the inherited file descriptor N, "
                   "written to as it is (a pipe, a socketpair, a file), never reopened; "
                   "--events /dev/fd/N does the same")
    p.add_argument("--json-report", metavar="FILE", default=None,
                   help="write what happened (exits, escapes, teardown) as JSON to FILE "
                   "at the end; FILE is opened before CMD runs, so a path that cannot be "
                   "written is refused (exit 2) and CMD never starts")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...",
                   help="the command to run, after --")
    p.set_defaults(func=_cmd_run)
