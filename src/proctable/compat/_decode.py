"""psutil's value types and decoding rules on Linux, shared by process_iter and Process.

Every rule here follows what psutil (5.9-7.x) does with the same bytes, so that
both sides give equal values: the named tuples (equal to psutil's field by
field), the status strings, the command line and environment parses (text as
``open()`` reads it: the filesystem encoding with its error handler, universal
newlines), the link targets (``exe``, ``cwd``) and the guesses psutil makes
where the kernel denies one.
"""

from __future__ import annotations

import glob
import os
import pwd
import sys
from typing import NamedTuple, Optional

__all__ = [
    "COMM_TRUNCATED",
    "PF_KTHREAD",
    "STATUS",
    "Denied",
    "Gone",
    "cmdline",
    "environ",
    "guess_exe",
    "link_path",
    "pcputimes",
    "pgids",
    "pmem",
    "puids",
    "terminal",
    "text",
    "username",
]


class puids(NamedTuple):
    """psutil's ``uids()``: the real, effective and saved uid."""

    real: int
    effective: int
    saved: int


class pgids(NamedTuple):
    """psutil's ``gids()``: the real, effective and saved gid."""

    real: int
    effective: int
    saved: int


class pcputimes(NamedTuple):
    """psutil's ``cpu_times()`` on Linux, in seconds."""

    user: float
    system: float
    children_user: float
    children_system: float
    iowait: float


class pmem(NamedTuple):
    """psutil's ``memory_info()`` on Linux: the seven statm fields, in bytes."""

    rss: int
    vms: int
    shared: int
    text: int
    lib: int
    data: int
    dirty: int


class Denied(Exception):
    """psutil would raise AccessDenied (or ZombieProcess) here."""


class Gone(Exception):
    """psutil would raise NoSuchProcess here."""


# psutil's PROC_STATUSES (its _pslinux.py): the state letter -> the status string.
STATUS = {
    "R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped",
    "t": "tracing-stop", "Z": "zombie", "X": "dead", "x": "dead", "K": "wake-kill",
    "W": "waking", "I": "idle", "P": "parked",
}

PF_KTHREAD = 0x00200000  # stat field 9: a kernel thread has no cmdline and no exe
COMM_TRUNCATED = 15  # TASK_COMM_LEN - 1: psutil extends names this long from the cmdline

_ENCODING = sys.getfilesystemencoding()
_ERRORS = sys.getfilesystemencodeerrors()


def text(raw: bytes) -> str:
    """A /proc file's bytes as psutil's text reads give them: the filesystem
    encoding with its error handler, and universal newlines (\\r\\n and \\r read
    as \\n)."""
    data = raw.decode(_ENCODING, _ERRORS)
    if "\r" in data:
        data = data.replace("\r\n", "\n").replace("\r", "\n")
    return data


def cmdline(raw: bytes) -> list[str]:
    """psutil's cmdline() parse: NUL-separated, or space-separated after
    setproctitle() (a single NUL-terminated word holding spaces, too)."""
    data = text(raw)
    sep = "\x00" if data.endswith("\x00") else " "
    if data.endswith(sep):
        data = data[:-1]
    parts = data.split(sep)
    if sep == "\x00" and len(parts) == 1 and " " in data:
        parts = data.split(" ")
    return parts


def environ(raw: bytes) -> dict[str, str]:
    """psutil's parse of an environ block: NUL-terminated ``KEY=value`` entries up
    to the first empty one; an entry without ``=``, or starting with it, is
    skipped, and so is a last entry without its NUL."""
    out: dict[str, str] = {}
    entries = text(raw).split("\x00")
    entries.pop()  # after the last NUL: nothing, or an entry without its NUL
    for entry in entries:
        if not entry:
            break  # an empty entry ends the block
        eq = entry.find("=")
        if eq > 0:
            out[entry[:eq]] = entry[eq + 1:]
    return out


def link_path(raw: bytes) -> str:
    """psutil's readlink(): the target up to a NUL, with ' (deleted)' dropped where
    no file has the name (a PermissionError of that check is Denied, as in psutil)."""
    path = os.fsdecode(raw).split("\x00")[0]
    if path.endswith(" (deleted)"):
        try:
            os.stat(path)
        except PermissionError:
            raise Denied() from None
        except OSError:
            path = path[:-10]
    return path


def guess_exe(argv: Optional[list[str]]) -> Optional[str]:
    """psutil's guess of an exe it may not read: argv[0] where it is an absolute
    path to an executable file."""
    if argv:
        exe = argv[0]
        if os.path.isabs(exe) and os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
    return None


# --- /dev map and user names (psutil's lookups, cached) ------------------------

_tty_map: Optional[dict[int, str]] = None


def _scan_ttys() -> dict[int, str]:
    # psutil's get_terminal_map(): /dev/tty* then /dev/pts/*, in listing order.
    found: dict[int, str] = {}
    for name in glob.glob("/dev/tty*") + glob.glob("/dev/pts/*"):
        try:
            found[os.stat(name).st_rdev] = name
        except FileNotFoundError:
            pass
    return found


def terminal(tty_nr: int, rescan: bool = True) -> tuple[Optional[str], bool]:
    """(the terminal's path or None, whether /dev was scanned again for it).

    The map of /dev is scanned once and kept; a terminal it does not know
    (opened since) has /dev scanned again where ``rescan`` allows it (psutil
    scans once per process lifetime and never sees a later terminal)."""
    global _tty_map
    if _tty_map is None:
        _tty_map = _scan_ttys()
    name = _tty_map.get(tty_nr)
    if name is None and tty_nr != 0 and rescan:
        _tty_map = _scan_ttys()
        return _tty_map.get(tty_nr), True
    return name, False


def username(uid: int) -> str:
    """psutil's username(): the user name of uid, or the uid as a string when no
    user has it."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
