"""``proctable ps``: every process, as a table, a tree or JSON lines."""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, Optional

from ..table import Proc, Table, snapshot
from . import _columns as C
from ._output import Style, Users, fit, terminal_width, zombie_note
from ._protocol import JsonLines, denied_object, proc_object
from .tree import forest

__all__ = [
    "add_row_options", "cells", "column_headers", "column_keys", "columns_help", "register",
    "select_rows",
]

# Columns that need the memory files (statm): without them the table is read
# without, one file read less per process.
_MEMORY = {"rss", "vms"}


def _user_arg(text: str) -> list[int]:
    users = Users()
    out = []
    for name in (w.strip() for w in text.split(",")):
        if not name:
            continue
        uid = users.uid(name)
        if uid is None:
            raise argparse.ArgumentTypeError(f"no such user: {name!r}")
        out.append(uid)
    return out


def _name_arg(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression: {text!r} ({exc})") from None


def select_rows(table: Table, args: argparse.Namespace) -> tuple[list[Proc], int]:
    """The rows the filters keep, and how many kernel threads were hidden."""
    pids = {pid for group in args.pid or [] for pid in group}
    uids = {uid for group in args.user or [] for uid in group}
    kept = []
    hidden = 0
    for p in table:
        if pids and p.pid not in pids:
            continue
        if p.kernel_thread and not args.kernel_threads and not pids:
            hidden += 1
            continue
        if uids and p.uid not in uids:
            continue
        if args.name is not None and not args.name.search(p.name):
            continue
        kept.append(p)
    return kept, hidden


def _asked(args: argparse.Namespace) -> list[tuple[str, Optional[str]]]:
    """The (key, header) pairs of every -o, in order, each key once (a later
    rename wins)."""
    out: dict[str, Optional[str]] = {}
    for group in args.columns or ():
        for key, header in group:
            if header is not None or key not in out:
                out[key] = header
    return list(out.items())


def column_keys(args: argparse.Namespace, default: Sequence[str]) -> list[str]:
    """The columns asked for: -o (or the default), with -f's args in place of name."""
    keys = [k for k, _ in _asked(args)] or list(default)
    if args.full:
        keys = [("args" if k == "name" else k) for k in keys]
        if "args" not in keys:
            keys.append("args")
    return keys


def column_headers(args: argparse.Namespace) -> dict[str, str]:
    """The headers -o renamed (key=HEADER), by key."""
    return {k: h for k, h in _asked(args) if h is not None}


def cells(p: Proc, keys: Sequence[str], view: C.View, prefix: str = "") -> list[str]:
    """The cells of one row; the zombie note (and a tree prefix) go into the last
    column when that holds text."""
    out = [C.COLUMNS[k].cell(p, view) for k in keys]
    if keys[-1] in C.TEXT:
        note = "" if "exit" in keys else zombie_note(p)
        out[-1] = prefix + out[-1] + (f" [{note}]" if note else "")
    return out


def _cmd_ps(args: argparse.Namespace) -> int:
    keys = column_keys(args, C.PS_DEFAULT)
    explicit = {k for k, _ in _asked(args)} | ({"args"} if args.full else set())
    # (the defaults add no derived JSON fields: a reader's objects stay the same)
    sort = args.sort or [("pid", False)]
    memory = args.json or bool(_MEMORY & ({*keys} | {k for k, _ in sort}))
    # One read: loading the BPF program (tens of ms) would cost more than it saves.
    table = snapshot(memory=memory, reader="proc")
    rows, hidden = select_rows(table, args)
    # procps: exit 1 when the filters select no process (`ps -p` of a missing pid)
    rc = 0 if rows else 1
    view = C.View()

    def order(rs: Sequence[Proc]) -> list[Proc]:
        return C.sort_rows(rs, sort, view)

    placed = list(forest(rows, order)) if args.tree else [(p, "", 0) for p in order(rows)]

    if args.json:
        out = JsonLines(sys.stdout)
        derived = [k for k in keys if k in explicit and C.COLUMNS[k].json is not None]
        for p, _prefix, depth in placed:
            extra: dict[str, Any] = {}
            for k in derived:
                fn = C.COLUMNS[k].json
                assert fn is not None
                extra[k] = fn(p, view)
            if args.tree:
                extra["depth"] = depth
            out.emit("proc", proc_object(p, extra))
        for d in table.denied:
            out.emit("denied", denied_object(d))
        return rc

    stream = sys.stdout
    style = Style(stream)
    width = terminal_width(stream)
    rows_cells = [(cells(p, keys, view, prefix), p) for p, prefix, _ in placed]
    layout = C.Layout.of(keys, [c for c, _ in rows_cells], column_headers(args))
    if not layout.headless:
        stream.write(style.bold(fit(layout.header(), width)) + "\n")
    for c, p in rows_cells:
        line = fit(layout.line(c), width)
        if p.state == "Z":
            line = style.red(line)
        elif p.kernel_thread:
            line = style.dim(line)
        stream.write(line + "\n")
    if table.denied:
        n = len(table.denied)
        print(f"proctable ps: {n} process{'es' if n != 1 else ''} not readable by this user "
              "(hidepid or a security module): not shown", file=sys.stderr)
    if hidden and _isatty(stream):
        stream.write(style.dim(f"({hidden} kernel threads hidden; -K shows them)") + "\n")
    return rc


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def columns_help(top: bool = False) -> str:
    """The list of columns for a command's --help epilog (indented: kept as written)."""
    lines = []
    for k in C.names(top):
        c = C.COLUMNS[k]
        wrapped = textwrap.wrap(c.help, 58) or [""]
        lines.append(f"  {k:8} {c.header:8} {wrapped[0]}")
        lines.extend(f"  {'':17} {w}" for w in wrapped[1:])
    return "\n".join(lines)


def add_row_options(p: argparse.ArgumentParser, default: Sequence[str], sort: str,
                    top: bool = False) -> None:
    """The options ps and top share: columns, kernel threads, filters and sort."""
    p.add_argument("-o", "--columns", type=C.columns_arg(default, top), metavar="COLS",
                   action="append",
                   help="the columns to show, comma-separated (see below; may be repeated); a "
                   "leading + adds them to the default: " + ",".join(default) + ". As in "
                   "procps, KEY=HEADER renames the last column's header (the rest of the "
                   "argument is the header): -o pid= -o args= prints no header line")
    p.add_argument("-f", "--full", action="store_true",
                   help="show the command line (args) in place of the name")
    p.add_argument("-K", "--kernel-threads", action="store_true",
                   help="show kernel threads too (hidden by default)")
    p.add_argument("-u", "--user", type=_user_arg, action="append", metavar="USER",
                   help="only processes of these users (names or uids, comma-separated; "
                   "may be repeated)")
    p.add_argument("-p", "--pid", type=C.pid_list, action="append", metavar="PID",
                   help="only these pids (comma-separated; may be repeated); kernel threads "
                   "named here are shown")
    p.add_argument("--name", type=_name_arg, metavar="REGEX",
                   help="only processes whose name matches this regular expression "
                   "(Python re.search, like pgrep)")
    p.add_argument("-s", "--sort", type=C.sort_arg(top), metavar="KEYS",
                   help="sort by these columns, comma-separated, '-' in front for descending "
                   f"(default: {sort}); unknown values sort last. As in procps, the value "
                   "may start with '-' after a space: --sort -rss")


def register(sub: Any, name: str = "ps") -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help="list processes: a table, a tree (--tree) or JSON lines (--json)",
        description="List the processes of the table, read in one pass over /proc. Kernel "
        "threads are hidden unless -K is given. Units are those of ps and top: TIME is CPU "
        "time as [DD-]HH:MM:SS, START follows ps's STIME rule (HH:MM today, MmmDD this year, "
        "else the year), memory is in K/M/G. A value the kernel does not give is '?'. "
        "A zombie's exit status is shown in brackets after its name. Exit code 1 when "
        "the filters select no process (as procps: ps -p of a pid that does not exist).",
        epilog="columns for -o and --sort:\n" + columns_help()
        + "\n\nexamples:\n  proctable ps -o pid,user,rss,args --sort=-rss\n"
        "  proctable ps --user root --name '^sshd'\n  proctable ps --json | jq -c "
        "'select(.state == \"Z\")'",
    )
    add_row_options(p, C.PS_DEFAULT, "pid")
    p.add_argument("--tree", action="store_true",
                   help="order the rows as a tree (children below their parent) and draw it in the "
                   "last column when that is name or args")
    p.add_argument("--json", action="store_true",
                   help="JSON lines: one 'proc' object per process (see docs/protocol.md); "
                   "columns named with -o that derive a value (user, tty, args) add it")
    p.set_defaults(func=_cmd_ps)
    return p  # type: ignore[no-any-return]

