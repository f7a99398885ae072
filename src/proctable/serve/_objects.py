"""What the sidecar's results and notifications hold: plain data from the package's objects.

Pure functions (no I/O): a supervisor ``Event`` -> an ``event`` or ``output``
notification's params; a watch's end -> an ``exit`` notification's params; a
lineage's members and suspects; a row of the table. The JSON-lines protocol's
builders (``status_object``, ``proc_object``, ``probe_object``) are shared, so a
row or a status reads the same in ``ps --json`` and in the sidecar.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any, Optional

from .._jsonobjects import proc_object, status_object, text
from .._status import ExitStatus
from ..errors import ExitUnknown, NoSuchProcess
from ..lineage import Suspect
from ..supervise import Event
from ..table import Identity, Proc

__all__ = [
    "event_params",
    "exit_params",
    "identity_result",
    "member_params",
    "output_frame",
    "output_line",
    "output_params",
    "proc_brief",
    "status_fields",
]


def status_fields(st: Optional[ExitStatus]) -> dict[str, Any]:
    """``exit`` (the status object), ``code`` and ``signal``: null where unknown."""
    return {"exit": status_object(st),
            "code": None if st is None else st.code,
            "signal": None if st is None else st.signal}


def _ident(ident: Optional[Identity]) -> dict[str, Any]:
    return {"pid": None if ident is None else ident.pid,
            "start_time": None if ident is None else ident.start_time}


def proc_brief(p: Any) -> dict[str, Any]:
    """pid, start_time and name of a row (a survivor of a teardown)."""
    return {"pid": p.pid, "start_time": p.start_time, "name": text(p.name)}


def event_params(ev: Event) -> dict[str, Any]:
    """The params of an ``event`` notification (every kind but ``output``)."""
    d: dict[str, Any] = {"key": ev.key, "generation": ev.generation, "kind": ev.kind,
                         **_ident(ev.identity), "time": round(ev.time, 6)}
    if ev.kind == "exited":
        d["status"] = ev.status
        d.update(status_fields(ev.exit))
    if ev.reason is not None:
        d["reason"] = ev.reason
    if ev.survivors is not None:
        d["survivors"] = [proc_brief(p) for p in ev.survivors]
    return d


def output_params(ev: Event) -> dict[str, Any]:
    """The params of an ``output`` notification: the exact bytes, base64."""
    data: bytes = getattr(ev, "data", None) or b""
    return {"key": ev.key, "generation": ev.generation,
            "stream": getattr(ev, "stream", None),
            "data_b64": base64.b64encode(data).decode("ascii"),
            "dropped": int(getattr(ev, "dropped", 0) or 0),
            "offset": int(getattr(ev, "offset", 0) or 0)}


def output_line(ev: Event) -> bytes:
    """The ``output`` notification's whole line, built without a JSON pass over the
    data: base64 needs no escaping, so the bytes go in as they are (the same line as
    ``encode`` of ``output_params``, several times faster for large chunks)."""
    data: bytes = getattr(ev, "data", None) or b""
    head = json.dumps({"key": ev.key, "generation": ev.generation,
                       "stream": getattr(ev, "stream", None)},
                      ensure_ascii=True, separators=(",", ":"))
    return b"".join((b'{"jsonrpc":"2.0","method":"output","params":', head[:-1].encode("ascii"),
                     b',"data_b64":"', base64.b64encode(data), b'","dropped":',
                     str(int(getattr(ev, "dropped", 0) or 0)).encode("ascii"), b',"offset":',
                     str(int(getattr(ev, "offset", 0) or 0)).encode("ascii"), b"}}\n"))


def output_frame(ev: Event) -> tuple[bytes, bytes]:
    """The ``output`` notification as a binary frame (a client that asked ``hello``
    for ``output: "binary"``): the notification's line with ``size`` in place of
    ``data_b64``, then exactly ``size`` raw bytes (docs/serve.md, "Binary output"):
    (that line, the bytes), written one after the other without a copy."""
    data: bytes = getattr(ev, "data", None) or b""
    head = json.dumps({"key": ev.key, "generation": ev.generation,
                       "stream": getattr(ev, "stream", None)},
                      ensure_ascii=True, separators=(",", ":"))
    return b"".join((b'{"jsonrpc":"2.0","method":"output","params":', head[:-1].encode("ascii"),
                     b',"size":', str(len(data)).encode("ascii"), b',"dropped":',
                     str(int(getattr(ev, "dropped", 0) or 0)).encode("ascii"), b',"offset":',
                     str(int(getattr(ev, "offset", 0) or 0)).encode("ascii"), b"}}\n")), data


def exit_params(pid: int, start_time: Optional[int], status: Optional[ExitStatus],
                error: Optional[BaseException], source: Optional[str]) -> dict[str, Any]:
    """The params of an ``exit`` notification (the end of a ``watch``).

    ``outcome``: ``exited`` (status known), ``unknown`` (it ended; no source can give
    its status), ``gone`` (there was no such process), ``reused`` (the pid names
    another process)."""
    if error is None:
        outcome = "exited"
    elif isinstance(error, ExitUnknown):
        outcome = "unknown"
    elif isinstance(error, NoSuchProcess) and "another process" in str(error):
        outcome = "reused"
    elif isinstance(error, NoSuchProcess):
        outcome = "gone"
    else:
        outcome = "unknown"
    return {"pid": pid, "start_time": start_time, "outcome": outcome,
            **status_fields(status), "source": source if error is None else None,
            "error": None if error is None else str(error)}


def member_params(members: Iterable[Proc], suspects: Iterable[Suspect]) -> dict[str, Any]:
    """``members``' result: the rows of the members, and the suspects with how they
    would have been claimed (never signalled)."""
    return {"members": [proc_object(p) for p in members],
            "suspects": [{"proc": proc_object(s.proc), "via": s.via, "id": s.id}
                         for s in suspects]}


def identity_result(ident: Identity, generation: int) -> dict[str, Any]:
    """start's and adopt's result."""
    return {"pid": ident.pid, "start_time": ident.start_time, "handle": ident.handle,
            "generation": generation}
