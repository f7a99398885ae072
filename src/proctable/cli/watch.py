"""``proctable watch [--json] [--timeout S] PID...``: print each exit as it happens.

Exit code 0 when every pid exited (with a known status or not), 1 when one was
gone already or the timeout came first; argparse answers bad pids with 2.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time
from typing import Any, Optional, cast

from .._argtypes import pid_arg, seconds_arg
from ..errors import ExitUnknown
from ..exits import ExitFuture, ExitStatus, ExitWatcher

__all__ = ["register_watch"]


def _record(fut: ExitFuture) -> dict[str, Any]:
    """What one resolved watch says, as a JSON-ready dict."""
    d: dict[str, Any] = {"pid": fut.pid, "exited": False, "status": None, "source": None,
                         "error": None}
    if fut.identity is not None:
        d["start_time"] = fut.identity.start_time
    exc = fut.exception()
    if exc is None:
        status = fut.result()
        d.update(exited=True, source=fut.source,
                 status=dict(status._asdict(), returncode=status.returncode))
    else:
        d["exited"] = isinstance(exc, ExitUnknown)
        d["error"] = str(exc)
    return d


def _text(fut: ExitFuture) -> str:
    exc = fut.exception()
    if exc is None:
        status = fut.result()
        return f"{fut.pid}: {status.describe()} (seen by {fut.source})"
    if isinstance(exc, ExitUnknown):
        return f"{fut.pid}: exited, status unknown ({exc})"
    return f"{fut.pid}: {exc}"


def _emit(line: str, err: bool = False) -> None:
    out = sys.stderr if err else sys.stdout
    out.write(line + "\n")
    out.flush()


def _cmd_watch(args: argparse.Namespace) -> int:
    rc = 0
    timeout: Optional[float] = args.timeout
    deadline = None if timeout is None else time.monotonic() + timeout
    with ExitWatcher() as watcher:
        futs = {watcher.watch(pid): pid for pid in dict.fromkeys(args.pid)}
        waiting: set[concurrent.futures.Future[ExitStatus]] = set(futs)
        while waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, waiting = concurrent.futures.wait(
                waiting, left, return_when=concurrent.futures.FIRST_COMPLETED)
            if not done:
                break
            for fut in sorted((cast(ExitFuture, f) for f in done), key=lambda f: f.pid):
                exc = fut.exception()
                failed = exc is not None and not isinstance(exc, ExitUnknown)
                if failed:
                    rc = 1  # gone or reused already: not an exit we saw
                if args.json:
                    _emit(json.dumps(_record(fut)))
                else:
                    _emit(_text(fut), err=failed)
        for pid in sorted(futs[cast(ExitFuture, f)] for f in waiting):
            rc = 1
            if args.json:
                _emit(json.dumps({"pid": pid, "exited": False, "status": None,
                                  "source": None, "error": "timeout"}))
            else:
                _emit(f"{pid}: still running after {timeout:g}s", err=True)
    return rc


def register_watch(subparsers: Any) -> None:
    """Add ``watch`` to the ``proctable`` command's subparsers."""
    p = subparsers.add_parser(
        "watch", help="wait for PIDs to exit; print each exit as it happens")
    p.add_argument("pid", nargs="+", type=pid_arg, metavar="PID")
    p.add_argument("--json", action="store_true", help="one JSON object a line, as they happen")
    p.add_argument("--timeout", type=seconds_arg, default=None, metavar="S",
                   help="give up after S seconds (exit code 1)")
    p.set_defaults(func=_cmd_watch)
