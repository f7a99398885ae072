"""``proctable run``: run a command as a lineage, report and end what it leaves behind."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Any, Optional

from .._argtypes import seconds_arg
from .._policy import Counters, RestartPolicy, decide
from .._status import ExitStatus
from ..errors import TeardownError
from ..lineage import Lineage
from ..table import Proc

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


class _Forwarder:
    """Forwards SIGINT/SIGTERM/SIGHUP to the current run's root while installed."""

    def __init__(self) -> None:
        self.target: Any = None
        self.received: Optional[int] = None
        self.count = 0                       # signals received so far
        self.first_at: Optional[float] = None  # monotonic time of the first one
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Optional[FrameType]) -> None:
        self.received = signum
        self.count += 1
        if self.first_at is None:
            self.first_at = time.monotonic()
        proc = self.target
        if proc is None or proc.returncode is not None:
            return
        if signum == signal.SIGINT and _terminal_delivered_sigint():
            return  # the terminal sent it to the command's process group already
        try:
            proc.send_signal(signum)
        except (ProcessLookupError, OSError):
            pass

    def __enter__(self) -> _Forwarder:
        for sig in _FORWARDED:
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _terminal_delivered_sigint() -> bool:
    """True when we are the terminal's foreground group: Ctrl-C reached the command too."""
    try:
        fd = sys.stdin.fileno()
        return os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


def run_command(argv: list[str], grace: float = 5.0, mode: str = "auto",
                restart: str = "never", json_report: Optional[str] = None,
                kill_timeout: float = 5.0) -> int:
    """Run argv as a lineage until it ends; tear down what it left; return its exit code."""
    bad = _precheck(argv[0])
    if bad is not None:
        print(bad[1], file=sys.stderr)
        return bad[0]
    policy = RestartPolicy(max_fast_exits=5)
    counters = Counters()
    runs: list[dict[str, Any]] = []
    code = 1
    with _Forwarder() as fwd:
        while True:
            started = time.monotonic()
            try:
                lin = Lineage.spawn(list(argv), mode=mode)
            except OSError as exc:
                print(f"proctable run: {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
                return 127 if isinstance(exc, FileNotFoundError) else 126
            fwd.target = lin.process
            try:
                status = _wait_root(lin, fwd, grace)
                # Whatever is still a member now outlived the command (or, when an
                # interrupt is being enforced, runs beside it).
                skip = {lin.process.pid} | ({lin.root.pid} if lin.root is not None else set())
                left = [m for m in lin.members() if m.pid not in skip]
            finally:
                fwd.target = None
                report: Any = None
                survivors: list[Any] = []
                try:
                    report = lin.terminate(grace=grace, kill_timeout=kill_timeout)
                except TeardownError as exc:
                    survivors = list(exc.survivors)
                    print(f"proctable run: {exc}", file=sys.stderr)
            if status is None:  # interrupted and not obeyed: ended by the teardown
                try:
                    status = ExitStatus.from_returncode(lin.process.wait(timeout=1.0))
                except subprocess.TimeoutExpired:
                    status = None
            if left:
                print(f"proctable run: {_describe(left)}", file=sys.stderr)
            code = _exit_code(status)
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
                break
            counters = d.counters
            print(f"proctable run: restarting: {d.reason}", file=sys.stderr)
    if json_report is not None:
        with open(json_report, "w") as f:
            json.dump({"exit_code": code, "runs": runs}, f, indent=2)
    return code


def _wait_root(lin: Lineage, fwd: _Forwarder, grace: float) -> Optional[ExitStatus]:
    """Wait for the command to end, or for an interrupt it does not obey.

    After a forwarded signal the command has ``grace`` seconds to end on its own;
    a second signal, or the end of the grace, returns None and the caller tears
    the lineage down (SIGTERM, then SIGKILL): an interrupt always ends the run.
    """
    proc = lin.process
    while True:
        try:
            return ExitStatus.from_returncode(proc.wait(timeout=0.05))
        except subprocess.TimeoutExpired:
            pass
        if fwd.first_at is not None and (
                fwd.count > 1 or time.monotonic() - fwd.first_at >= grace):
            return None


def _cmd_run(args: argparse.Namespace) -> int:
    argv = list(args.cmd)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("proctable run: no command given (proctable run -- CMD ARGS...)", file=sys.stderr)
        return 2
    return run_command(argv, grace=args.grace, mode=args.mode, restart=args.restart,
                       json_report=args.json_report)


def register(sub: Any) -> None:
    """Add ``proctable run`` to the command line's subparsers."""
    p = sub.add_parser(
        "run",
        help="run a command as a lineage; end and report what it leaves behind",
        description="Run CMD with its whole lineage tracked (escapes included). When it "
        "ends, or is interrupted, every process it started is torn down, and those that "
        "outlived it are named on stderr. Exits with the command's code (128+N for signal N).",
    )
    p.add_argument("--grace", type=seconds_arg, default=5.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL at teardown (default 5)")
    p.add_argument("--mode", choices=["auto", "cgroup", "subreaper", "scan"], default="auto",
                   help="lineage backend (default: the strongest this host allows)")
    p.add_argument("--restart", choices=["on-crash", "always", "never"], default="never",
                   help="run it again after a crash, after any exit, or never (default)")
    p.add_argument("--json-report", metavar="FILE", default=None,
                   help="write what happened (exits, escapes, teardown) as JSON to FILE")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...")
    p.set_defaults(func=_cmd_run)
