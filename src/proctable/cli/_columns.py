"""The columns that ``ps`` and ``top`` show: one definition each, with its sort key.

A column reads only what it shows: ``args`` opens ``/proc/<pid>/cmdline`` for
the rows shown, and only when the column is asked for (``read_args`` is the
one function that reads it).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable, NamedTuple, Optional

from .._lowlevel import PID_MAX
from ..table import Proc, parse_stat
from ._output import (
    UNKNOWN,
    Users,
    fmt_bytes,
    fmt_cputime,
    fmt_start,
    safe,
    tty_name,
    zombie_note,
)
from ._protocol import args_list

__all__ = [
    "COLUMNS",
    "Column",
    "View",
    "columns_arg",
    "parse_columns",
    "parse_sort",
    "read_args",
    "sort_rows",
]


def read_args(pid: int, start_time: int) -> Optional[list[str]]:
    """The command line of the process (pid, start_time), or None when it has none
    (a kernel thread, a zombie) or it cannot be read (gone, reused, hidden).

    Both files are read through one fd of the /proc/<pid> directory, so the
    command line is never that of a later process that reused the pid.
    """
    try:
        dfd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = _read_at(dfd, "cmdline", 1 << 20)
        stat = _read_at(dfd, "stat", 4096)
    except OSError:
        return None
    finally:
        os.close(dfd)
    try:
        if parse_stat(stat).start_time != start_time:
            return None
    except ValueError:
        return None
    if not raw:
        return None
    return [a.decode("utf-8", "surrogateescape") for a in raw.rstrip(b"\0").split(b"\0")]


def _read_at(dfd: int, name: str, limit: int) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    try:
        chunks = []
        size = 0
        while size < limit:
            b = os.read(fd, 65536)
            if not b:
                break
            chunks.append(b)
            size += len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


class View:
    """What the cells of one rendering share: names, the clock, top's CPU shares.

    (A plain class: ``dataclasses`` would cost a one-shot ``proctable ps`` about
    10 ms of imports.)
    """

    def __init__(self, cpu: Optional[dict[tuple[int, int], float]] = None) -> None:
        self.users = Users()
        self.now = time.time()
        self.cpu: dict[tuple[int, int], float] = {} if cpu is None else cpu
        """CPU percent by (pid, start time), for top; a row without one shows ``?``."""
        self._args: dict[tuple[int, int], Optional[list[str]]] = {}

    def args(self, p: Proc) -> Optional[list[str]]:
        key = (p.pid, p.start_time)
        if key not in self._args:
            self._args[key] = read_args(p.pid, p.start_time)
        return self._args[key]

    def command(self, p: Proc) -> str:
        """The command line as ps shows it: ``[name]`` where there is none."""
        a = self.args(p)
        if not a:
            return f"[{safe(p.name)}]"
        return safe(" ".join(a))


def _opt(v: Optional[object]) -> str:
    return UNKNOWN if v is None else str(v)


def _cpu_time(p: Proc) -> Optional[float]:
    if p.utime is None or p.stime is None:
        return None
    return p.utime + p.stime


def _user_key(p: Proc, v: View) -> Optional[str]:
    return None if p.uid is None else v.users.name(p.uid)


def _cpu_cell(p: Proc, v: View) -> str:
    share = v.cpu.get((p.pid, p.start_time))
    return UNKNOWN if share is None else f"{share:.1f}"


class Column(NamedTuple):
    """One column: its -o key, header, alignment, cell text and sort key."""

    key: str
    header: str
    help: str
    cell: Callable[[Proc, View], str]
    sort: Callable[[Proc, View], Any]
    right: bool = True
    json: Optional[Callable[[Proc, View], Any]] = None
    """The field this column adds to ps --json when named with -o (None: none)."""


COLUMNS: dict[str, Column] = {c.key: c for c in (
    Column("pid", "PID", "process id", lambda p, v: str(p.pid), lambda p, v: p.pid),
    Column("ppid", "PPID", "parent's process id", lambda p, v: str(p.ppid),
           lambda p, v: p.ppid),
    Column("pgid", "PGID", "process group id", lambda p, v: str(p.pgid), lambda p, v: p.pgid),
    Column("sid", "SID", "session id", lambda p, v: _opt(p.sid), lambda p, v: p.sid),
    Column("user", "USER", "the effective user's name (its uid where it has no name)",
           lambda p, v: v.users.name(p.uid), _user_key, right=False,
           json=lambda p, v: None if p.uid is None else v.users.name(p.uid)),
    Column("uid", "UID", "effective user id", lambda p, v: _opt(p.uid), lambda p, v: p.uid),
    Column("state", "S", "the kernel's state letter: R running, S sleeping, D disk wait, "
           "Z zombie, T stopped, I idle", lambda p, v: p.state, lambda p, v: p.state,
           right=False),
    Column("start", "START", "start time: HH:MM today, MmmDD this year, else the year "
           "(ps's STIME)", lambda p, v: fmt_start(p.create_time, v.now),
           lambda p, v: p.create_time),
    Column("time", "TIME", "CPU time, user + system, as [DD-]HH:MM:SS",
           lambda p, v: fmt_cputime(_cpu_time(p)), lambda p, v: _cpu_time(p)),
    Column("cpu", "%CPU", "CPU use since the previous refresh, in % of one CPU (top)",
           _cpu_cell, lambda p, v: v.cpu.get((p.pid, p.start_time)),
           json=lambda p, v: v.cpu.get((p.pid, p.start_time))),
    Column("rss", "RSS", "resident memory, K/M/G (powers of 1024)",
           lambda p, v: fmt_bytes(p.rss), lambda p, v: p.rss),
    Column("vms", "VSZ", "virtual memory size, K/M/G", lambda p, v: fmt_bytes(p.vms),
           lambda p, v: p.vms),
    Column("threads", "THR", "number of threads", lambda p, v: _opt(p.num_threads),
           lambda p, v: p.num_threads),
    Column("tty", "TTY", "controlling terminal (? for none)", lambda p, v: tty_name(p.tty_nr),
           lambda p, v: p.tty_nr, right=False,
           json=lambda p, v: None if p.tty_nr == 0 else tty_name(p.tty_nr)),
    Column("name", "NAME", "the process name (comm; at most 15 characters, kernel threads 64)",
           lambda p, v: safe(p.name), lambda p, v: p.name, right=False),
    Column("args", "COMMAND", "the command line, read only when asked for; [name] where "
           "there is none (kernel threads, zombies)", lambda p, v: v.command(p),
           lambda p, v: v.command(p), right=False,
           json=lambda p, v: args_list(v.args(p))),
    Column("exit", "EXIT", "a zombie's exit status (empty for a live process)",
           lambda p, v: zombie_note(p), lambda p, v: zombie_note(p), right=False),
)}

PS_DEFAULT = ("pid", "ppid", "user", "state", "start", "time", "rss", "tty", "name")
TOP_DEFAULT = ("pid", "user", "state", "cpu", "rss", "time", "threads", "name")
# The columns whose cells hold free text: the zombie note goes after the last of them.
TEXT = ("name", "args")


# Columns that only top can fill (a CPU share needs two refreshes).
TOP_ONLY = ("cpu",)


def names(top: bool) -> list[str]:
    """The column keys a command offers."""
    return [k for k in COLUMNS if top or k not in TOP_ONLY]


Columns = list[tuple[str, Optional[str]]]  # (key, header; None: the column's own)


def parse_columns(text: str, default: Sequence[str], top: bool = False) -> Columns:
    """-o's value: comma-separated keys; a leading + adds them to the default columns.
    As procps has it, ``key=HEADER`` renames the last key's header, and the header
    is the rest of the argument, commas and all (``pid=`` an empty one)."""
    names_part, eq, header = text.partition("=")
    out: Columns = [(k, None) for k in default] if names_part.startswith("+") else []
    offered = names(top)
    keys = [raw.strip().lower() for raw in names_part.lstrip("+").split(",")]
    if eq and not keys[-1]:
        raise argparse.ArgumentTypeError(f"no column before '=' in {text!r}")
    for i, key in enumerate(keys):
        if not key:
            continue
        if key not in offered:
            raise argparse.ArgumentTypeError(f"no column {key!r} (columns: "
                                             f"{', '.join(offered)})")
        named = header if eq and i == len(keys) - 1 else None
        out = [c for c in out if c[0] != key] if named is not None else out
        if all(c[0] != key for c in out):
            out.append((key, named))
    if not out:
        raise argparse.ArgumentTypeError("no columns given")
    return out


def columns_arg(default: Sequence[str], top: bool = False) -> Callable[[str], Columns]:
    """An argparse type for -o (so that a bad column is a usage error, exit 2)."""

    def parse(text: str) -> Columns:
        return parse_columns(text, default, top)

    parse.__name__ = "columns"
    return parse


def parse_sort(text: str, top: bool = False) -> list[tuple[str, bool]]:
    """--sort's value: keys, comma-separated, each with - in front for descending."""
    out = []
    offered = names(top)
    for raw in text.split(","):
        key = raw.strip().lower()
        if not key:
            continue
        desc = key.startswith("-")
        key = key.lstrip("+-")
        if key not in offered:
            raise argparse.ArgumentTypeError(f"cannot sort by {key!r} (columns: "
                                             f"{', '.join(offered)})")
        out.append((key, desc))
    if not out:
        raise argparse.ArgumentTypeError("no sort key given")
    return out


def sort_arg(top: bool = False) -> Callable[[str], list[tuple[str, bool]]]:
    """An argparse type for --sort."""

    def parse(text: str) -> list[tuple[str, bool]]:
        return parse_sort(text, top)

    parse.__name__ = "sort keys"
    return parse


def sort_rows(rows: Sequence[Proc], keys: Sequence[tuple[str, bool]], view: View) -> list[Proc]:
    """rows sorted by keys (stable, pid last); unknown values sort last either way."""
    out = sorted(rows, key=lambda p: p.pid)
    for key, desc in reversed(keys):
        col = COLUMNS[key]
        known = [(col.sort(p, view), p) for p in out]
        have = [t for t in known if t[0] is not None]
        have.sort(key=lambda t: t[0], reverse=desc)
        out = [p for _, p in have] + [p for k, p in known if k is None]
    return out


def pid_list(text: str) -> list[int]:
    """--pid's value: pids, comma-separated."""
    out = []
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        if not word.isdigit() or not 0 < int(word) <= PID_MAX:
            raise argparse.ArgumentTypeError(f"not a pid: {word!r}")
        out.append(int(word))
    return out


class Layout(NamedTuple):
    """Column widths for a set of rows; the last column takes what the line has left."""

    keys: list[str]
    widths: list[int]
    headers: list[str]

    @classmethod
    def of(cls, keys: Sequence[str], cells: Sequence[Sequence[str]],
           headers: Optional[Mapping[str, str]] = None) -> Layout:
        """headers: the renamed ones (-o key=HEADER), by key."""
        heads = [(headers or {}).get(k, COLUMNS[k].header) for k in keys]
        widths = [len(h) for h in heads]
        for row in cells:
            for i, c in enumerate(row[:-1]):
                widths[i] = max(widths[i], len(c))
        return cls(list(keys), widths, heads)

    @property
    def headless(self) -> bool:
        """Every header empty (-o pid= ...): procps prints no header line then."""
        return not any(self.headers)

    def line(self, cells: Sequence[str]) -> str:
        parts = []
        last = len(self.keys) - 1
        for i, (k, c) in enumerate(zip(self.keys, cells)):
            if i == last:
                parts.append(c if not COLUMNS[k].right else c.rjust(self.widths[i]))
            elif COLUMNS[k].right:
                parts.append(c.rjust(self.widths[i]))
            else:
                parts.append(c.ljust(self.widths[i]))
        return " ".join(parts).rstrip()

    def header(self) -> str:
        return self.line(self.headers)
