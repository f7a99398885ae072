"""The JSON-lines protocol: one object a line, each with "v" and "type".

This module is the protocol's one definition in code: the writer and a
builder for every object. docs/protocol.md documents each object, and a test
holds the two together. The rules that make it safe for other runtimes:

- ``v`` is an int that changes only when a change could break a reader (a field
  removed or its meaning or type changed); new fields, new types and new enum
  values keep it.
- Strings are ASCII on the wire (JSON escapes); bytes that are not UTF-8 in a
  process name or command line arrive as U+FFFD.
- Unknown is ``null``, never 0.
- Every line is flushed as it is written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Optional, TextIO

from .._status import ExitStatus
from ..exits import Probe
from ..table import Denied, Proc

__all__ = [
    "VERSION",
    "JsonLines",
    "denied_object",
    "probe_object",
    "proc_object",
    "status_object",
]

VERSION = 1


def _text(s: str) -> str:
    # Lone surrogates (bytes that were not UTF-8) are not valid in JSON text.
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class JsonLines:
    """Writes protocol objects to a stream, one a line, flushed line by line.

    A reader that goes away (EPIPE) does not stop the command that writes:
    ``broken`` turns true and later objects are dropped.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False

    def emit(self, type_: str, fields: dict[str, Any], stamp: bool = False) -> None:
        """Write {"v", "type", ["time",] **fields} as one line and flush it."""
        if self.broken:
            return
        obj: dict[str, Any] = {"v": VERSION, "type": type_}
        if stamp:
            obj["time"] = round(time.time(), 6)
        obj.update(fields)
        line = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except BrokenPipeError:
            self.broken = True
        except ValueError:  # the stream was closed under us
            self.broken = True


def status_object(st: Optional[ExitStatus]) -> Optional[dict[str, Any]]:
    """An ExitStatus as the protocol's status object; None stays null."""
    if st is None:
        return None
    return {
        "code": st.code,
        "signal": st.signal,
        "signal_name": st.signal_name,
        "core_dumped": st.core_dumped,
        "raw": st.raw,
        "returncode": st.returncode,
    }


def proc_object(p: Proc, extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A table row (ps --json); extra holds the derived columns asked for with -o."""
    d: dict[str, Any] = {
        "pid": p.pid,
        "ppid": p.ppid,
        "pgid": p.pgid,
        "sid": p.sid,
        "start_time": p.start_time,
        "create_time": round(p.create_time, 6),
        "state": p.state,
        "kernel_thread": p.kernel_thread,
        "num_threads": p.num_threads,
        "uid": p.uid,
        "name": _text(p.name),
        "tty_nr": p.tty_nr,
        "utime": p.utime,
        "stime": p.stime,
        "rss": p.rss,
        "vms": p.vms,
        "exit": status_object(p.exit),
        "exit_masked": p.exit_masked,
    }
    if extra:
        d.update(extra)
    return d


def denied_object(d: Denied) -> dict[str, Any]:
    """A pid /proc lists but this caller may not read (ps --json)."""
    return {"pid": d.pid, "uid": d.uid}


def probe_object(pid: int, probe: Probe) -> dict[str, Any]:
    """exit --json: what happened to one pid."""
    p = probe.proc
    return {
        "pid": pid,
        "start_time": None if p is None else p.start_time,
        "name": None if p is None else _text(p.name),
        "state": probe.state.value,
        "status": status_object(probe.status),
    }


def args_list(args: Optional[Sequence[str]]) -> Optional[list[str]]:
    """A command line as a JSON list of strings (null when unknown)."""
    return None if args is None else [_text(a) for a in args]


def text(s: Optional[str]) -> Optional[str]:
    """A string as the protocol carries it (U+FFFD for bytes that were not UTF-8)."""
    return None if s is None else _text(s)
