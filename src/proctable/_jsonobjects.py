"""The objects of proctable's JSON protocols as plain data: rows, probes, statuses.

Shared by the command line's JSON-lines protocol (``cli._protocol``, docs/protocol.md)
and the sidecar (``serve``, docs/serve.md), so that a row or a status reads the same
in ``ps --json`` and over JSON-RPC. Pure functions, no I/O. Strings are made safe
for JSON text (bytes that were not UTF-8 become U+FFFD); unknown stays None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from ._status import ExitStatus
from .table import Denied, Proc

if TYPE_CHECKING:  # the exit layer loads only where a probe is printed
    from .exits import Probe

__all__ = [
    "args_list",
    "denied_object",
    "probe_object",
    "proc_object",
    "status_object",
    "text",
]


def _text(s: str) -> str:
    # Lone surrogates (bytes that were not UTF-8) are not valid in JSON text.
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


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
