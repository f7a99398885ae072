"""``proctable top``: a live view of the table, sorted by CPU, refreshed from a Scanner.

CPU% is the growth of utime + stime between two refreshes over the wall time
between them (100% is one CPU busy), per (pid, start time), so that a reused
pid starts afresh. On a terminal the view redraws in place (the alternate
screen; q or Ctrl-C quits and the terminal is restored); elsewhere, or with
--once / -n N, it prints frames one after another (batch mode).
"""

from __future__ import annotations

import argparse
import os
import resource
import select
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any, Optional, TextIO

from .._argtypes import count_arg, seconds_arg
from ..scanner import Scanner
from ..table import Table
from . import _columns as C
from ._output import Style, fit, fmt_bytes, terminal_width
from .ps import (
    add_row_options,
    cells,
    column_headers,
    column_keys,
    columns_help,
    select_rows,
)

__all__ = ["CpuShares", "frame", "register"]

_MEMORY = {"rss", "vms"}
_KEYS = {"c": "cpu", "m": "rss", "p": "pid", "t": "time"}


class CpuShares:
    """CPU percent of each process between two refreshes, by (pid, start time)."""

    def __init__(self) -> None:
        self._prev: dict[tuple[int, int], float] = {}
        self._at: Optional[float] = None
        self.total = 0.0
        """The sum over every process at the last update, in % of one CPU."""

    def update(self, table: Table, at: float) -> dict[tuple[int, int], float]:
        now: dict[tuple[int, int], float] = {}
        shares: dict[tuple[int, int], float] = {}
        dt = None if self._at is None else at - self._at
        prev = self._prev
        total = 0.0
        for p in table:
            u, s = p.utime, p.stime
            if u is None or s is None:
                continue
            key = (p.pid, p.start_time)
            t = u + s
            now[key] = t
            if dt is not None and dt > 0:
                before = prev.get(key)
                # A process new since the last refresh: its whole CPU time is in this
                # interval only if it started within it, so count it from 0.
                share = max(0.0, (t - (before if before is not None else 0.0)) * 100.0 / dt)
                shares[key] = share
                total += share
        self._prev = now
        self._at = at
        self.total = total
        return shares


def _meminfo() -> Optional[tuple[int, int]]:
    """(total, available) bytes from /proc/meminfo, or None."""
    try:
        with open("/proc/meminfo") as f:
            vals = {}
            for line in f:
                k, _, rest = line.partition(":")
                if k in ("MemTotal", "MemAvailable"):
                    vals[k] = int(rest.split()[0]) * 1024
            return vals["MemTotal"], vals["MemAvailable"]
    except (OSError, KeyError, ValueError, IndexError):
        return None


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def _summary(table: Table, hidden: int, shares: CpuShares,
             interval: float, sort: Sequence[tuple[str, bool]], interactive: bool) -> list[str]:
    states: dict[str, int] = {}
    for p in table:
        states[p.state] = states.get(p.state, 0) + 1
    try:
        load = "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "load ?"
    ncpu = _cpus()
    first = (f"proctable top  {time.strftime('%H:%M:%S')}  {load}  "
             f"CPU {shares.total:.1f}% of {ncpu * 100}%")
    mem = _meminfo()
    if mem is not None:
        first += f"  mem {fmt_bytes(mem[0] - mem[1])} used of {fmt_bytes(mem[0])}"
    second = (f"{len(table):,} processes: {states.get('R', 0)} running, "
              f"{states.get('S', 0) + states.get('I', 0) + states.get('D', 0)} sleeping, "
              f"{states.get('T', 0) + states.get('t', 0)} stopped, {states.get('Z', 0)} zombie")
    if hidden:
        second += f"; {hidden} kernel threads hidden"
    if table.denied:
        second += f"; {len(table.denied)} not readable"
    order = ",".join(("-" if d else "") + k for k, d in sort)
    third = f"every {interval:g}s, sorted by {order}"
    if interactive:
        third += "; keys: q quit, k kernel threads, c/m/t/p sort by cpu/rss/time/pid"
    return [first, second, third, ""]


def frame(table: Table, shares: dict[tuple[int, int], float], cpu: CpuShares,
          args: argparse.Namespace, keys: Sequence[str], sort: Sequence[tuple[str, bool]],
          width: Optional[int], limit: Optional[int], style: Style,
          interactive: bool = False) -> list[str]:
    """The lines of one frame: a summary, the header and the busiest rows."""
    rows, hidden = select_rows(table, args)
    view = C.View(cpu=shares)
    ordered = C.sort_rows(rows, sort, view)
    if limit is not None:
        ordered = ordered[:limit]
    lines = [fit(s, width) for s in _summary(table, hidden, cpu, args.interval, sort,
                                               interactive)]
    body = [cells(p, keys, view) for p in ordered]
    layout = C.Layout.of(keys, body, column_headers(args))
    head = fit(layout.header(), width)
    if width is not None and interactive:
        head = head.ljust(width)
    lines.append(style.reverse(head) if interactive else style.bold(head))
    for c, p in zip(body, ordered):
        line = fit(layout.line(c), width)
        lines.append(style.red(line) if p.state == "Z" else
                     style.bold(line) if p.state == "R" else line)
    return lines


def _raise_nofile() -> None:
    """Let the Scanner keep its fds open for thousands of processes (3 each): raise
    the soft RLIMIT_NOFILE of this command toward the hard one (at most 65536)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (OSError, ValueError):
            pass


def _batch(args: argparse.Namespace, scanner: Scanner, keys: list[str],
           sort: list[tuple[str, bool]], out: TextIO) -> int:
    cpu = CpuShares()
    cpu.update(scanner.refresh(), time.monotonic())
    style = Style(out)
    width = terminal_width(out)
    n = args.frames
    shown = 0
    while n is None or shown < n:
        time.sleep(args.interval)
        table = scanner.refresh()
        shares = cpu.update(table, time.monotonic())
        if shown:
            out.write("\n")
        out.write("\n".join(frame(table, shares, cpu, args, keys, sort, width, args.limit,
                                  style)) + "\n")
        out.flush()
        shown += 1
    return 0


class _Terminal:
    """The terminal in cbreak mode on the alternate screen; restored on exit, always."""

    def __init__(self, fd_in: int, out: TextIO) -> None:
        self.fd = fd_in
        self.out = out
        self._saved: Any = None
        self._old_handlers: dict[int, Any] = {}
        self.wake_r, self.wake_w = os.pipe()
        self.resized = False

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        if signum == signal.SIGWINCH:
            self.resized = True
            try:
                os.write(self.wake_w, b"w")
            except OSError:
                pass
            return
        raise SystemExit(128 + signum)  # unwinds through __exit__, which restores

    def __enter__(self) -> _Terminal:
        import termios  # noqa: PLC0415 - POSIX terminals only, and only here
        import tty  # noqa: PLC0415

        self._saved = termios.tcgetattr(self.fd)
        for sig in (signal.SIGWINCH, signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        tty.setcbreak(self.fd)  # keys one by one, no echo; Ctrl-C still interrupts
        self.out.write("\033[?1049h\033[?25l")  # alternate screen, cursor hidden
        self.out.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        import termios  # noqa: PLC0415

        try:
            self.out.write("\033[?25h\033[?1049l")
            self.out.flush()
        finally:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            for sig, old in self._old_handlers.items():
                signal.signal(sig, old)
            os.close(self.wake_r)
            os.close(self.wake_w)

    def key(self, timeout: float) -> Optional[str]:
        """A key pressed within timeout, or None (also when the window was resized)."""
        # poll, not select: the Scanner's fds push ours past select()'s 1024 limit.
        p = select.poll()
        p.register(self.fd, select.POLLIN)
        p.register(self.wake_r, select.POLLIN)
        r = [fd for fd, _ in p.poll(max(0.0, timeout) * 1000.0)]
        if self.wake_r in r:
            os.read(self.wake_r, 64)
        if self.fd in r:
            data = os.read(self.fd, 32)
            if not data:
                return "q"  # the terminal went away
            return data.decode("utf-8", "replace")[:1]
        return None

    def draw(self, lines: Sequence[str]) -> None:
        self.out.write("\033[H" + "".join(line + "\033[K\r\n" for line in lines[:-1])
                       + (lines[-1] + "\033[K" if lines else "") + "\033[J")
        self.out.flush()


def _interactive(args: argparse.Namespace, scanner: Scanner, keys: list[str],
                 sort: list[tuple[str, bool]]) -> int:
    import shutil  # noqa: PLC0415

    out = sys.stdout
    style = Style(out)
    cpu = CpuShares()
    cpu.update(scanner.refresh(), time.monotonic())
    with _Terminal(sys.stdin.fileno(), out) as term:
        next_at = time.monotonic() + min(args.interval, 0.5)
        table = None
        shares: dict[tuple[int, int], float] = {}
        while True:
            k = term.key(next_at - time.monotonic())
            if k in ("q", "Q", "\x04"):
                return 0
            if k == "k":
                args.kernel_threads = not args.kernel_threads
            elif k is not None and k in _KEYS:
                sort = [(_KEYS[k], k != "p")]
            if time.monotonic() >= next_at or table is None:
                table = scanner.refresh()
                shares = cpu.update(table, time.monotonic())
                next_at = time.monotonic() + args.interval
            elif k is None and not term.resized:
                continue
            term.resized = False
            size = shutil.get_terminal_size((80, 24))
            limit = max(1, size.lines - 5)
            if args.limit is not None:
                limit = min(limit, args.limit)
            term.draw(frame(table, shares, cpu, args, keys, sort, size.columns, limit, style,
                            interactive=True))


def _cmd_top(args: argparse.Namespace) -> int:
    keys = column_keys(args, C.TOP_DEFAULT)
    sort = args.sort or [("cpu", True), ("time", True)]
    if args.once:
        args.frames = 1
    _raise_nofile()
    interactive = args.frames is None and sys.stdout.isatty() and sys.stdin.isatty()
    with Scanner(memory=bool(_MEMORY & ({*keys} | {k for k, _ in sort}))) as scanner:
        if interactive:
            return _interactive(args, scanner, keys, sort)
        return _batch(args, scanner, keys, sort, sys.stdout)


def _interval(text: str) -> float:
    value = seconds_arg(text)
    if value < 0.1:
        raise argparse.ArgumentTypeError(f"the interval must be at least 0.1 s, not {text}")
    return value


def _positive(text: str) -> int:
    value = count_arg(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {text}")
    return value


def register(sub: Any) -> None:
    p = sub.add_parser(
        "top",
        help="a live view of the busiest processes, sorted by CPU; q quits",
        description="A live view of the process table, refreshed every interval from a "
        "Scanner (stat files kept open, so a refresh costs little) and sorted by CPU: "
        "%CPU is the CPU time a process used since the previous refresh, in percent of one "
        "CPU. On a terminal it redraws in place: q or Ctrl-C quits (the terminal is "
        "restored), k shows or hides kernel threads, c m t p sort by cpu, rss, time, pid. "
        "Off a terminal, or with --once or -n N, it prints frames one after another "
        "(batch mode). Kernel threads are hidden unless -K is given.",
        epilog="columns for -o and --sort:\n" + columns_help(top=True),
    )
    p.add_argument("-d", "--interval", type=_interval, default=1.0, metavar="S",
                   help="seconds between refreshes (default 1, at least 0.1)")
    p.add_argument("-n", "--frames", type=_positive, default=None, metavar="N",
                   help="batch mode: print N frames, then exit")
    p.add_argument("--once", action="store_true",
                   help="batch mode, one frame (the same as -n 1): CPU%% over one interval")
    p.add_argument("-l", "--limit", type=_positive, default=None, metavar="N",
                   help="show at most N processes a frame (default: the screen's height "
                   "on a terminal, every process in batch mode)")
    add_row_options(p, C.TOP_DEFAULT, "-cpu,-time", top=True)
    p.set_defaults(func=_cmd_top)
