"""``proctable tree [PID]``: the process tree, drawn; and the tree order ps --tree uses."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Optional

from .._argtypes import pid_arg
from ..table import Proc, snapshot
from ._output import Style, fit, safe, terminal_width, zombie_note

__all__ = ["forest", "register"]

Order = Callable[[Sequence[Proc]], list[Proc]]


def forest(rows: Sequence[Proc], order: Order, root: Optional[int] = None,
           ) -> Iterator[tuple[Proc, str, int]]:
    """(row, tree-drawing prefix, depth) for rows in depth-first order.

    A row's parent is the row of its ppid when that started no later than it
    (an older row cannot be the child of a younger one: the pid was reused);
    rows without a parent among rows are roots. Siblings come in ``order``.
    """
    by_pid = {p.pid: p for p in rows}
    kids: dict[int, list[Proc]] = {}
    tops: list[Proc] = []
    for p in rows:
        parent = by_pid.get(p.ppid)
        if parent is None or parent.pid == p.pid or p.start_time < parent.start_time:
            tops.append(p)
        else:
            kids.setdefault(parent.pid, []).append(p)
    if root is not None:
        r = by_pid.get(root)
        tops = [] if r is None else [r]

    def walk(p: Proc, prefix: str, last: bool, depth: int) -> Iterator[tuple[Proc, str, int]]:
        if depth == 0:
            yield p, "", 0
            sub = ""
        else:
            yield p, prefix + ("└─ " if last else "├─ "), depth
            sub = prefix + ("   " if last else "│  ")
        below = order(kids.get(p.pid, []))
        for i, k in enumerate(below):
            yield from walk(k, sub, i == len(below) - 1, depth + 1)

    for t in order(tops):
        yield from walk(t, "", True, 0)


def _by_pid(rows: Sequence[Proc]) -> list[Proc]:
    return sorted(rows, key=lambda p: p.pid)


def _label(p: Proc) -> str:
    note = zombie_note(p)
    return f"{safe(p.name)} ({p.pid}) {p.state}" + (f" [{note}]" if note else "")


def _cmd_tree(args: argparse.Namespace) -> int:
    table = snapshot(memory=False, reader="proc")  # one read: no BPF program load
    if args.pid is not None and args.pid not in table:
        print(f"proctable tree: {args.pid}: no such process", file=sys.stderr)
        return 1
    rows: Sequence[Proc] = table
    if not args.kernel_threads:
        rows = [p for p in table if not p.kernel_thread or p.pid == args.pid]
    out = sys.stdout
    width = terminal_width(out)
    style = Style(out)
    for p, prefix, _depth in forest(rows, _by_pid, args.pid):
        line = fit(prefix + _label(p), width)
        out.write((style.red(line) if p.state == "Z" else line) + "\n")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "tree",
        help="draw the process tree (below PID, or every root)",
        description="Draw the process tree: each process as 'name (pid) state', under its "
        "parent; a zombie with its exit status in brackets. Kernel threads are hidden "
        "unless -K is given.",
    )
    p.add_argument("pid", nargs="?", type=pid_arg, metavar="PID",
                   help="draw only the tree below this process (default: every root)")
    p.add_argument("-K", "--kernel-threads", action="store_true",
                   help="show kernel threads too (hidden by default)")
    p.set_defaults(func=_cmd_tree)
