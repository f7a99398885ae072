"""What the commands' human output shares: safe text, units, widths, colour, names.

Units follow ps and top, so that a person who knows those reads these alike:
CPU time as ps's ``[DD-]HH:MM:SS``, a start time by ps's STIME rule, memory in
K/M/G (binary, as top shows it). A value the kernel did not give is ``?``,
never 0.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import textwrap
import time
from typing import Optional, TextIO

from ..table import Proc

__all__ = [
    "UNKNOWN",
    "HelpFormatter",
    "Style",
    "Users",
    "fit",
    "fmt_bytes",
    "fmt_cputime",
    "fmt_start",
    "safe",
    "terminal_width",
    "tty_name",
    "zombie_note",
]

UNKNOWN = "?"


def safe(s: str) -> str:
    """s with bytes that are not UTF-8 and control characters made printable."""
    # A comm or a command line may hold bytes that are not UTF-8 (kept as
    # surrogates), newlines or escape sequences: never let them reach a terminal.
    s = s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return "".join(c if c.isprintable() else "?" for c in s)


def fmt_cputime(seconds: Optional[float]) -> str:
    """CPU time as ps prints TIME: ``HH:MM:SS``, with ``DD-`` in front past a day."""
    if seconds is None:
        return UNKNOWN
    total = int(seconds)
    days, rest = divmod(total, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    hms = f"{h:02d}:{m:02d}:{s:02d}"
    return f"{days}-{hms}" if days else hms


def fmt_start(create_time: float, now: Optional[float] = None) -> str:
    """A start time by ps's STIME rule: ``HH:MM`` today, ``MmmDD`` this year, else the year."""
    if now is None:
        now = time.time()
    t, n = time.localtime(create_time), time.localtime(now)
    if t.tm_year != n.tm_year:
        return time.strftime("%Y", t)
    if t.tm_yday != n.tm_yday:
        return time.strftime("%b%d", t)
    return time.strftime("%H:%M", t)


def fmt_bytes(n: Optional[int]) -> str:
    """Bytes as top shows memory: ``512K``, ``9.8M``, ``123M``, ``1.5G`` (powers of 1024)."""
    if n is None:
        return UNKNOWN
    value = n / 1024.0
    for unit in ("K", "M", "G", "T"):
        if value < 1024.0 or unit == "T":
            if unit == "K" or value >= 10.0:
                return f"{value:.0f}{unit}"
            return f"{value:.1f}{unit}"
        value /= 1024.0
    raise AssertionError("unreachable")  # pragma: no cover


def zombie_note(p: Proc) -> str:
    """What a zombie's row says about its exit, or "" for any other row."""
    if p.state != "Z":
        return ""
    if (p.num_threads or 1) > 1:
        return "leader exited, threads run"
    ex = p.exit
    if ex is not None:
        return ex.describe()
    return "status hidden" if p.exit_masked else "status unknown"


class Users:
    """User names by uid, looked up once each (a uid without a name shows as its number)."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}

    def name(self, uid: Optional[int]) -> str:
        if uid is None:
            return UNKNOWN
        got = self._names.get(uid)
        if got is None:
            try:
                got = pwd.getpwuid(uid).pw_name
            except (KeyError, OverflowError):
                got = str(uid)
            self._names[uid] = got
        return got

    def uid(self, name: str) -> Optional[int]:
        """The uid of a user name or of a number; None when there is no such user."""
        if name.isdigit():
            return int(name)
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            return None


# --- terminals -----------------------------------------------------------------

_drivers: Optional[list[tuple[str, int, int, int]]] = None


def _tty_drivers() -> list[tuple[str, int, int, int]]:
    """(device path prefix, major, first minor, last minor) from /proc/tty/drivers."""
    global _drivers
    if _drivers is None:
        found = []
        try:
            with open("/proc/tty/drivers") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) < 4 or not parts[2].isdigit():
                        continue
                    lo, _, hi = parts[3].partition("-")
                    if lo.isdigit() and (not hi or hi.isdigit()):
                        found.append((parts[1], int(parts[2]), int(lo), int(hi or lo)))
        except OSError:
            pass
        _drivers = found
    return _drivers


def tty_name(tty_nr: int) -> str:
    """The controlling terminal as ps names it (``pts/3``, ``tty1``), ``?`` for none."""
    if tty_nr == 0:
        return UNKNOWN
    major = (tty_nr >> 8) & 0xFFF
    minor = (tty_nr & 0xFF) | ((tty_nr >> 12) & 0xFFF00)
    if 136 <= major <= 143:
        return f"pts/{(major - 136) * 256 + minor}"
    if major == 4:
        return f"tty{minor}" if minor < 64 else f"ttyS{minor - 64}"
    for path, maj, lo, hi in _tty_drivers():
        if maj == major and lo <= minor <= hi:
            name = path[len("/dev/"):] if path.startswith("/dev/") else path
            return name if lo == hi else f"{name}{minor - lo}"
    return f"{major},{minor}"


def terminal_width(stream: TextIO) -> Optional[int]:
    """The width to fit lines to: the terminal's, or $COLUMNS; None (no limit) in a pipe."""
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    try:
        if stream.isatty():
            return shutil.get_terminal_size((80, 24)).columns
    except (AttributeError, ValueError, OSError):
        pass
    return None


def fit(line: str, width: Optional[int]) -> str:
    """line cut to width characters (None: not cut)."""
    if width is None or len(line) <= width:
        return line
    return line[:width]


class Style:
    """ANSI colour, on only for a terminal and never when NO_COLOR is set (no-color.org)."""

    def __init__(self, stream: TextIO, enabled: Optional[bool] = None) -> None:
        if enabled is None:
            try:
                tty = stream.isatty()
            except (AttributeError, ValueError):
                tty = False
            enabled = tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        self.enabled = enabled

    def _wrap(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.enabled and text else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def yellow(self, text: str) -> str:
        return self._wrap("33", text)

    def reverse(self, text: str) -> str:
        return self._wrap("7", text)


# --- what exit and watch say: one wording for both ------------------------------

GONE = "no such process (gone, or reaped already)"
REUSED = "the pid names another process now"
HIDDEN = "exited, but the kernel hides its status from this user"


def exited_text(describe: str) -> str:
    """The answer for an exit whose status is known: ``exited, exit code 7``."""
    return f"exited, {describe}"


def unknown_text(detail: str) -> str:
    """The answer for an exit whose status no source can give."""
    return f"exited, but its status cannot be known ({detail})"


def pid_line(pid: int, name: Optional[str], text: str) -> str:
    """``PID NAME: text`` (without the name where it is not known)."""
    return f"{pid} {safe(name)}: {text}" if name else f"{pid}: {text}"


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter that wraps each paragraph of a description or epilog on
    its own and keeps indented lines (examples, lists) as they are written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in text.split("\n\n"):
            lines = para.splitlines()
            if any(line.startswith("  ") for line in lines):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(textwrap.fill(" ".join(lines), width, initial_indent=indent,
                                         subsequent_indent=indent))
        return "\n\n".join(out)
