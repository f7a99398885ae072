"""``proctable exit PID...``: what happened to each pid, without reaping it.

Exit code 0 when every pid was found (running, stopped or exited), 1 when one
was gone or names another process now; argparse answers bad pids with 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._argtypes import pid_arg, ticks_arg
from . import _output as O
from ._protocol import JsonLines, probe_object

__all__ = ["register"]

# By ProbeState name: the exit layer (and concurrent.futures with it) is imported
# when this command runs, not by every command of the line.
_TEXT = {
    "RUNNING": "running",
    "STOPPED": "stopped (not an exit: field 52 holds the stop signal)",
    "LEADER_EXITED": "main thread exited, other threads still run (not an exit)",
    "MASKED": O.HIDDEN,
    "GONE": O.GONE,
    "REUSED": O.REUSED,
}
_FAILED = ("GONE", "REUSED")


def _cmd_exit(args: argparse.Namespace) -> int:
    from ..exits import exit_probe  # noqa: PLC0415 - see _TEXT

    rc = 0
    out = JsonLines(sys.stdout) if args.json else None
    for pid in dict.fromkeys(args.pid):
        probe = exit_probe(pid, args.start_time)
        failed = probe.state.name in _FAILED
        if failed:
            rc = 1
        if out is not None:
            out.emit("probe", probe_object(pid, probe))
            continue
        name = probe.proc.name if probe.proc is not None else None
        if probe.status is not None:
            text = O.exited_text(probe.status.describe()) + f" (raw status {probe.status.raw})"
        else:
            text = _TEXT[probe.state.name]
        line = O.pid_line(pid, name, text)
        print(line, file=sys.stderr if failed else sys.stdout, flush=True)
    return rc


def register(sub: Any) -> None:
    p = sub.add_parser(
        "exit",
        help="what happened to PID (running, exited with which status...), without reaping it",
        description="Tell what happened to each PID without reaping it: running, stopped, "
        "exited with its status (read from the zombie's /proc/<pid>/stat), or gone. An "
        "exit whose status the kernel hides from this user is said to be hidden, never "
        "'exit code 0'. Exit code 0 when every pid was found, 1 when one was gone or names "
        "another process now (those lines go to stderr).",
    )
    p.add_argument("pid", nargs="+", type=pid_arg, metavar="PID", help="the processes to probe")
    p.add_argument("--start-time", type=ticks_arg, default=None, metavar="TICKS",
                   help="the start time (clock ticks since boot, as ps --json gives it) the "
                   "pid should have; a process with another one is reported as reused")
    p.add_argument("--json", action="store_true",
                   help="JSON lines: one 'probe' object per pid (see docs/protocol.md)")
    p.set_defaults(func=_cmd_exit)
