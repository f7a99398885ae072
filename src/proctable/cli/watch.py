"""``proctable watch [--json] [--timeout S] PID...``: print each exit as it happens.

Exit code 0 when every pid exited (with a known status or not), 1 when one was
gone already or the timeout came first; argparse answers bad pids with 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, cast

from .._argtypes import pid_arg, seconds_arg
from ..errors import ExitUnknown, NoSuchProcess
from ..table import Identity, identity, read
from . import _output as O
from ._protocol import JsonLines, status_object, text

if TYPE_CHECKING:  # the exit watcher loads when watch runs, not with every command
    from ..exits import ExitFuture, ExitStatus

__all__ = ["register"]


class _Target(NamedTuple):
    pid: int
    ident: Optional[Identity]
    name: Optional[str]


def _pin(pid: int) -> _Target:
    """The process pid names now, with its name (None, None when there is none)."""
    try:
        ident = identity(pid)
    except (OSError, ValueError):
        ident = None
    if ident is None:
        return _Target(pid, None, None)
    row = read(pid, memory=False)
    name = row.name if row is not None and row.start_time == ident.start_time else None
    return _Target(pid, ident, name)


class _Answer(NamedTuple):
    outcome: str  # exited, unknown, gone, reused, timeout
    status: Optional[ExitStatus]
    source: Optional[str]
    text: str

    @property
    def failed(self) -> bool:
        return self.outcome in ("gone", "reused", "timeout")


def _answer(fut: Optional[ExitFuture]) -> _Answer:
    if fut is None:
        return _Answer("gone", None, None, O.GONE)
    exc = fut.exception()
    if exc is None:
        status = fut.result()
        return _Answer("exited", status, fut.source,
                       O.exited_text(status.describe()) + f" (seen by {fut.source})")
    if isinstance(exc, ExitUnknown):
        msg = str(exc)
        return _Answer("unknown", None, None,
                       O.HIDDEN if "hidden" in msg else O.unknown_text(msg))
    if isinstance(exc, NoSuchProcess) and "another process" in str(exc):
        return _Answer("reused", None, None, O.REUSED)
    if isinstance(exc, NoSuchProcess):
        return _Answer("gone", None, None, O.GONE)
    return _Answer("unknown", None, None, O.unknown_text(str(exc)))


class _Report:
    """Writes one answer per target, as text or as a JSON line, flushed."""

    def __init__(self, json_lines: bool) -> None:
        self.out = JsonLines(sys.stdout) if json_lines else None

    def __call__(self, t: _Target, a: _Answer) -> None:
        if self.out is not None:
            self.out.emit("exit", {
                "pid": t.pid,
                "start_time": None if t.ident is None else t.ident.start_time,
                "name": text(t.name),
                "outcome": a.outcome,
                "status": status_object(a.status),
                "source": a.source,
                "error": a.text if a.failed or a.outcome == "unknown" else None,
            }, stamp=True)
            return
        stream = sys.stderr if a.failed else sys.stdout
        stream.write(O.pid_line(t.pid, t.name, a.text) + "\n")
        stream.flush()


def _cmd_watch(args: argparse.Namespace) -> int:
    import concurrent.futures  # noqa: PLC0415 - see the imports above

    from ..exits import ExitFuture, ExitWatcher  # noqa: PLC0415

    rc = 0
    timeout: Optional[float] = args.timeout
    deadline = None if timeout is None else time.monotonic() + timeout
    report = _Report(args.json)
    with ExitWatcher() as watcher:
        futs: dict[concurrent.futures.Future[ExitStatus], _Target] = {}
        for pid in dict.fromkeys(args.pid):
            t = _pin(pid)
            if t.ident is None:
                rc = 1
                report(t, _answer(None))
                continue
            futs[watcher.watch(t.ident)] = t
        waiting: set[concurrent.futures.Future[ExitStatus]] = set(futs)
        while waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, waiting = concurrent.futures.wait(
                waiting, left, return_when=concurrent.futures.FIRST_COMPLETED)
            if not done:
                break
            for fut in sorted((cast(ExitFuture, f) for f in done), key=lambda f: f.pid):
                a = _answer(fut)
                if a.failed:
                    rc = 1  # gone or reused already: not an exit we saw
                report(futs[fut], a)
        for t in sorted((futs[f] for f in waiting), key=lambda t: t.pid):
            rc = 1
            report(t, _Answer("timeout", None, None, f"still running after {timeout:g}s"))
    return rc


def register(subparsers: Any) -> None:
    """Add ``watch`` to the ``proctable`` command's subparsers."""
    p = subparsers.add_parser(
        "watch",
        help="wait for PIDs to exit; print each exit (name, status, source) as it happens",
        description="Wait for each PID to exit and print its exit as it happens: the "
        "process name, its status and the source that saw it (pidfd exit info, the "
        "zombie's stat line, waitid), without reaping it. Exit code 0 when every pid "
        "exited, 1 when one was gone already or the timeout came first (those lines go "
        "to stderr).",
    )
    p.add_argument("pid", nargs="+", type=pid_arg, metavar="PID",
                   help="the processes to wait for")
    p.add_argument("--json", action="store_true",
                   help="JSON lines: one 'exit' object per pid, written as it happens "
                   "(see docs/protocol.md)")
    p.add_argument("--timeout", type=seconds_arg, default=None, metavar="S",
                   help="give up after S seconds (exit code 1)")
    p.set_defaults(func=_cmd_watch)
