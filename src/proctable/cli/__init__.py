"""The ``proctable`` command line (also ``python -m proctable``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional, TextIO

from .. import __version__
from .._argtypes import pid_arg
from ..exits import Probe, ProbeState, exit_probe
from ..table import Proc, Table, snapshot

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], int]


def _fmt_status(p: Proc) -> str:
    if p.state != "Z":
        return ""
    if (p.num_threads or 1) > 1:
        return "leader exited, threads run"
    ex = p.exit
    if ex is not None:
        return ex.describe()
    return "status hidden" if p.exit_masked else "status unknown"


def _fmt_time(p: Proc) -> str:
    return time.strftime("%H:%M:%S", time.localtime(p.create_time))


def _safe(s: str) -> str:
    # comm may hold bytes that are not UTF-8 (kept as surrogates) or control chars.
    s = s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return "".join(c if c.isprintable() else "?" for c in s)


def _print_table(rows: Sequence[Proc], out: TextIO) -> None:
    out.write(f"{'PID':>7} {'PPID':>7} {'PGID':>7} {'SID':>7} {'UID':>6} S {'START':>8}  "
              f"{'TIME':>8} {'RSS':>9}  NAME\n")
    for p in rows:
        uid = "?" if p.uid is None else str(p.uid)
        cpu = (p.utime or 0.0) + (p.stime or 0.0)
        status = _fmt_status(p)
        out.write(
            f"{p.pid:>7} {p.ppid:>7} {p.pgid:>7} {p.sid:>7} {uid:>6} {p.state} "
            f"{_fmt_time(p):>8}  {cpu:>8.2f} {(p.rss or 0) // 1024:>7}Ki  {_safe(p.name)}"
            + (f"  [{status}]" if status else "")
            + "\n"
        )


def _tree_lines(table: Table, root: Optional[int]) -> list[str]:
    """Lines of a tree drawing: the subtree of root, or every root of the table."""
    lines: list[str] = []

    def label(p: Proc) -> str:
        status = _fmt_status(p)
        return f"{_safe(p.name)} ({p.pid}) {p.state}" + (f" [{status}]" if status else "")

    def walk(p: Proc, prefix: str, last: bool, top: bool) -> None:
        lines.append(label(p) if top else prefix + ("└─ " if last else "├─ ") + label(p))
        kids = table.children(p.pid)
        sub = "" if top else prefix + ("   " if last else "│  ")
        for i, k in enumerate(kids):
            walk(k, sub, i == len(kids) - 1, False)

    if root is not None:
        p = table.get(root)
        if p is not None:
            walk(p, "", True, True)
        return lines
    for p in _roots(table):
        walk(p, "", True, True)
    return lines


def _roots(table: Table) -> list[Proc]:
    """Rows whose parent is not in the table (or cannot be their parent)."""
    out = []
    for p in table:
        parent = table.get(p.ppid)
        if parent is None or p.start_time < parent.start_time or p.ppid == p.pid:
            out.append(p)
    return out


def _json_forest(table: Table) -> list[dict[str, Any]]:
    def node(p: Proc) -> dict[str, Any]:
        d = p.as_dict()
        d["children"] = [node(k) for k in table.children(p.pid)]
        return d

    return [node(p) for p in _roots(table)]


def _cmd_ps(args: argparse.Namespace) -> int:
    table = snapshot()
    if args.json and args.tree:
        json.dump(_json_forest(table), sys.stdout, indent=None)
        sys.stdout.write("\n")
    elif args.json:
        json.dump([p.as_dict() for p in table], sys.stdout, indent=None)
        sys.stdout.write("\n")
    elif args.tree:
        sys.stdout.write("\n".join(_tree_lines(table, None)) + "\n")
    else:
        _print_table(table, sys.stdout)
    return 0


def _cmd_tree(args: argparse.Namespace) -> int:
    table = snapshot()
    if args.pid is not None and args.pid not in table:
        print(f"proctable tree: no process with pid {args.pid}", file=sys.stderr)
        return 1
    sys.stdout.write("\n".join(_tree_lines(table, args.pid)) + "\n")
    return 0


def _probe_dict(pid: int, probe: Probe) -> dict[str, Any]:
    d: dict[str, Any] = {"pid": pid, "state": probe.state.value, "status": None}
    if probe.status is not None:
        d["status"] = probe.status._asdict()
        d["status"]["returncode"] = probe.status.returncode
    if probe.proc is not None:
        d["start_time"] = probe.proc.start_time
        d["name"] = probe.proc.name
    return d


_PROBE_TEXT = {
    ProbeState.RUNNING: "running",
    ProbeState.STOPPED: "stopped (not an exit: field 52 holds the stop signal)",
    ProbeState.LEADER_EXITED: "main thread exited, other threads still run (not an exit)",
    ProbeState.MASKED: "exited (zombie), but the kernel hides its status from this user",
    ProbeState.GONE: "no such process (gone, or reaped already)",
    ProbeState.REUSED: "the pid names another process now",
}


def _cmd_exit(args: argparse.Namespace) -> int:
    rc = 0
    results = []
    for pid in args.pid:
        probe = exit_probe(pid, args.start_time)
        results.append(_probe_dict(pid, probe))
        if probe.state in (ProbeState.GONE, ProbeState.REUSED):
            rc = 1
        if not args.json:
            if probe.status is not None:
                text = f"exited: {probe.status.describe()} (raw status {probe.status.raw})"
            else:
                text = _PROBE_TEXT[probe.state]
            name = f" {_safe(probe.proc.name)}" if probe.proc is not None else ""
            print(f"{pid}{name}: {text}")
    if args.json:
        json.dump(results if len(results) > 1 else results[0], sys.stdout)
        sys.stdout.write("\n")
    return rc


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="proctable",
        description="A fast process table, exits without reaping, lineage and teardown.",
    )
    ap.add_argument("--version", action="version", version=f"proctable {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    ps = sub.add_parser("ps", help="list every process (one pass over /proc)")
    ps.add_argument("--json", action="store_true",
                    help="a JSON list, one object a process (with --tree: nested 'children')")
    ps.add_argument("--tree", action="store_true", help="draw parent/child trees")
    ps.set_defaults(func=_cmd_ps)

    tree = sub.add_parser("tree", help="draw the tree below PID (default: every root)")
    tree.add_argument("pid", nargs="?", type=pid_arg, metavar="PID")
    tree.set_defaults(func=_cmd_tree)

    ex = sub.add_parser("exit", help="what happened to PID, without reaping it")
    ex.add_argument("pid", nargs="+", type=pid_arg, metavar="PID")
    ex.add_argument("--start-time", type=int, default=None,
                    help="the start time (clock ticks) the pid should have; else REUSED")
    ex.add_argument("--json", action="store_true", help="JSON output")
    ex.set_defaults(func=_cmd_exit)

    for extra in _EXTRA_COMMANDS:
        extra(sub)
    return ap


# Later layers register their subcommands here (watch, run, bench).
_EXTRA_COMMANDS: list[Callable[[Any], None]] = []


def _register_watch(subparsers: Any) -> None:
    from .watch import register_watch  # noqa: PLC0415 - loaded when the parser is built

    register_watch(subparsers)


_EXTRA_COMMANDS.append(_register_watch)


def _register_run(subparsers: Any) -> None:
    from .run import register  # noqa: PLC0415 - loaded when the parser is built

    register(subparsers)


_EXTRA_COMMANDS.append(_register_run)


def _register_bench(subparsers: Any) -> None:
    from ..bench import register  # noqa: PLC0415 - loaded when the parser is built

    register(subparsers)


_EXTRA_COMMANDS.append(_register_bench)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        rc: int = args.func(args)
    except BrokenPipeError:
        # `proctable ps | head`: the reader left; do not print a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    return rc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
