"""The sidecar's wire protocol: JSON-RPC 2.0, one object a line, as a pure object.

Nothing here reads a socket, starts a thread or looks at a clock: bytes go in
(:meth:`Protocol.receive`) and come out as :class:`Request` objects to carry out
and :class:`Answer` lines (ready error responses for input that is no request);
results, errors and notifications go in and come out as bytes (``response``,
``error``, ``notification``). The server is a loop around it, and every rule of
the framing is tested with plain data (as h11 and wsproto do for HTTP and
WebSocket). docs/serve.md documents each rule; the parameter table of every
method is here, so that a wrong parameter is answered before any method runs.

The framing: UTF-8 JSON, one object per line, ended by ``\\n`` (a ``\\r`` before
it is allowed); empty lines are ignored. A line longer than ``max_line`` bytes is
answered with -32600 (``data.error`` ``"line_too_long"``) as soon as it passes the
limit, and skipped up to its end. Batches (a JSON array) are refused with one
-32600 (``"batch_not_supported"``): JSON-RPC 2.0 lets a server answer a batch in any
order, and the ordering rules of this protocol are per request.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import signal
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Optional, Union

__all__ = [
    "APP_ERRORS",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_LINE",
    "METHODS",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "STANDARD_ERRORS",
    "VERSION",
    "Answer",
    "Protocol",
    "Request",
    "RpcError",
    "encode",
]

VERSION = 1
"""The protocol's version (``hello``'s ``protocol``): it changes only when a change
could mislead a client written for the old one (a field removed, renamed, or given
another type or meaning). New methods, fields, notifications and error names keep it."""

MAX_LINE = 1 << 20
"""The longest request line accepted, in bytes, its newline left out (1 MiB)."""

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

APP_ERRORS: Mapping[str, int] = {
    "no_such_key": -32001,        # the key is not there (never started, or removed)
    "teardown_failed": -32002,    # a member could not be proven gone; data.survivors
    "command_not_found": -32003,  # the command does not exist (ENOENT)
    "spawn_failed": -32004,       # it exists but could not start (EACCES, ENOEXEC, ...)
    "closed": -32005,             # the supervisor is closed (after `close` or a shutdown)
    "no_such_process": -32006,    # adopt/watch/signal: the pid is gone, or names another process
    "no_input": -32007,           # write/resize: the key has no owned stdin, no pty, or no process
    "forbidden": -32008,          # the socket's peer is another user
    "not_supported": -32009,      # this build or host lacks what the call needs
    "failed": -32010,             # any other failure of the call, with its message
    "cancelled": -32011,          # a start overtaken by a stop, remove or close of its key
    "generation_ended": -32012,   # tail: the generation named is no longer the key's current
}
"""Application errors: ``error.code`` and ``error.data.error`` (the name) go together."""

STANDARD_ERRORS: Mapping[int, str] = {
    PARSE_ERROR: "parse_error",
    INVALID_REQUEST: "invalid_request",
    METHOD_NOT_FOUND: "method_not_found",
    INVALID_PARAMS: "invalid_params",
    INTERNAL_ERROR: "internal_error",
}
"""The names of JSON-RPC's standard codes, in ``data.error`` where no more precise name
(``line_too_long``, ``not_utf8``, ...) says more: every error names itself."""


class RpcError(Exception):
    """An error to answer a request with: a standard code, or an application error
    named in ``APP_ERRORS`` (``code`` then comes from the table)."""

    def __init__(self, code: Union[int, str], message: str,
                 data: Optional[dict[str, Any]] = None) -> None:
        super().__init__(message)
        extra = dict(data or {})
        if isinstance(code, str):
            extra = {"error": code, **extra}
            code = APP_ERRORS[code]
        elif "error" not in extra and code in STANDARD_ERRORS:
            extra = {"error": STANDARD_ERRORS[code], **extra}
        self.code = code
        self.message = message
        self.data = extra or None


class Request(NamedTuple):
    """A well-formed call: ``params`` checked against the method's table, defaults filled
    in. ``id`` is None for a notification (no answer is sent for it)."""

    id: Union[int, str, None]
    method: str
    params: dict[str, Any]

    @property
    def notification(self) -> bool:
        return self.id is None


class Answer(NamedTuple):
    """A line to send at once: the error response to input that is no request."""

    line: bytes


class Reply(NamedTuple):
    """A client's response to a request the sidecar sent it (``fresh``): ``result``, or
    ``error`` (an object with ``code`` and ``message``). Never answered."""

    id: Union[int, str]
    result: Any
    error: Optional[dict[str, Any]]


Item = Union[Request, Answer, Reply]


def encode(obj: Any) -> bytes:
    """One protocol line: compact JSON, ASCII (non-ASCII escaped), ``\\n``-ended."""
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":"),
                      allow_nan=False).encode("ascii") + b"\n"


# --- parameter checks ---------------------------------------------------------------------

Check = Callable[[str, Any], Any]


def _bad(name: str, what: str) -> RpcError:
    return RpcError(INVALID_PARAMS, f"{name} must be {what}", {"param": name})


def _str(name: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise _bad(name, "a non-empty string")
    if "\x00" in v:
        raise _bad(name, "a string without NUL")
    return v


def _int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(name, "an integer")
    return v


def _pos_int(name: str, v: Any) -> int:
    if _int(name, v) <= 0:
        raise _bad(name, "an integer > 0")
    return int(v)


def _nonneg_int(name: str, v: Any) -> int:
    if _int(name, v) < 0:
        raise _bad(name, "an integer >= 0")
    return int(v)


PID_MAX = 2**31 - 1
"""The largest pid (pid_t's range); the kernel's own pid_max is at most 4,194,304."""
START_TIME_MAX = 2**64 - 1
"""The largest start time (the kernel's is an unsigned 64-bit count of clock ticks)."""
UID_MAX = 2**32 - 1


def _pid(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= PID_MAX:
        raise _bad(name, f"a pid: an integer from 1 to {PID_MAX}")
    return v


def _start_time(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= START_TIME_MAX:
        raise _bad(name, f"a start time: an integer from 0 to {START_TIME_MAX}")
    return v


def _seconds(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise _bad(name, "a finite number of seconds >= 0")
    return float(v)


def _pos_seconds(name: str, v: Any) -> float:
    if _seconds(name, v) <= 0:
        raise _bad(name, "a number of seconds > 0")
    return float(v)


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _bad(name, "true or false")
    return v


def _args(name: str, v: Any) -> list[str]:
    if not isinstance(v, list) or not v or not all(isinstance(a, str) for a in v):
        raise _bad(name, "a non-empty list of strings")
    if any("\x00" in a for a in v):
        raise _bad(name, "strings without NUL")
    return list(v)


def _env(name: str, v: Any) -> dict[str, str]:
    if not isinstance(v, dict) or not all(
            isinstance(k, str) and k and "=" not in k and "\x00" not in k
            and isinstance(x, str) and "\x00" not in x for k, x in v.items()):
        raise _bad(name, "an object of string to string (names without '=')")
    return dict(v)


def _b64(name: str, v: Any) -> bytes:
    if not isinstance(v, str):
        raise _bad(name, "a base64 string")
    try:
        return base64.b64decode(v.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise _bad(name, "a base64 string") from None


def _signal(name: str, v: Any) -> Union[int, str]:
    if isinstance(v, str):
        s = v.upper()
        if not s.startswith("SIG"):
            s = "SIG" + s
        if s not in signal.Signals.__members__:
            raise _bad(name, "a signal number or name")
        return s
    n = _int(name, v)
    if not 0 <= n <= 64:
        raise _bad(name, "a signal number (0-64) or name")
    return n


def _one_of(*values: str) -> Check:
    def check(name: str, v: Any) -> str:
        if v not in values:
            raise _bad(name, "one of " + ", ".join(repr(x) for x in values))
        return str(v)
    return check


def _obj(fields: Mapping[str, tuple[Check, bool]]) -> Check:
    def check(name: str, v: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise _bad(name, "an object")
        return _check_fields(v, fields, prefix=name + ".")
    return check


def _pid_list(name: str, v: Any) -> list[int]:
    if not isinstance(v, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 < p <= PID_MAX for p in v):
        raise _bad(name, f"a list of pids (integers from 1 to {PID_MAX})")
    return list(v)


def _uid_list(name: str, v: Any) -> list[int]:
    if not isinstance(v, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= UID_MAX for p in v):
        raise _bad(name, f"a list of uids (integers from 0 to {UID_MAX})")
    return list(v)


FRESH_TIMEOUT_MAX = 3600.0


def _fresh_timeout(name: str, v: Any) -> float:
    if _pos_seconds(name, v) > FRESH_TIMEOUT_MAX:
        raise _bad(name, f"a number of seconds > 0, at most {FRESH_TIMEOUT_MAX:g}")
    return float(v)


_RESTART: Mapping[str, tuple[Check, bool]] = {
    "max_restarts": (_nonneg_int, False),
    "reset_after": (_seconds, False),
    "fast_exit": (_seconds, False),
    "max_fast_exits": (_pos_int, False),
    "delay": (_seconds, False),
    "fresh_args": (_args, False),
    "fresh": (_one_of("ask"), False),
    "fresh_timeout": (_fresh_timeout, False),
}

_PTY: Mapping[str, tuple[Check, bool]] = {"rows": (_pos_int, True), "cols": (_pos_int, True)}

METHODS: Mapping[str, Mapping[str, tuple[Check, bool]]] = {
    "hello": {"output": (_one_of("base64", "binary"), False)},
    "version": {"output": (_one_of("base64", "binary"), False)},
    "start": {
        "key": (_str, True), "args": (_args, True), "cwd": (_str, False),
        "env": (_env, False), "restart": (_obj(_RESTART), False),
        "timeout": (_pos_seconds, False),
        "output": (_one_of("events", "discard", "stderr"), False),
        "pty": (_obj(_PTY), False), "stdin": (_one_of("pipe", "null"), False),
        "drop_output": (_bool, False),
    },
    "stop": {"key": (_str, True), "grace": (_seconds, False)},
    "remove": {"key": (_str, True), "grace": (_seconds, False)},
    "adopt": {
        "key": (_str, True), "pid": (_pid, True), "start_time": (_start_time, True),
        "args": (_args, False), "restart": (_obj(_RESTART), False), "cwd": (_str, False),
        "env": (_env, False),
    },
    "list": {},
    "write": {"key": (_str, True), "data_b64": (_b64, True), "eof": (_bool, False)},
    "resize": {"key": (_str, True), "rows": (_pos_int, True), "cols": (_pos_int, True)},
    "signal": {"key": (_str, True), "signal": (_signal, True)},
    "tail": {"key": (_str, True), "bytes": (_pos_int, False), "since": (_start_time, False),
             "generation": (_pos_int, False)},
    "members": {"key": (_str, True)},
    "ps": {"pids": (_pid_list, False), "uids": (_uid_list, False), "name": (_str, False),
           "kernel_threads": (_bool, False)},
    "probe": {"pid": (_pid, True), "start_time": (_start_time, False)},
    "watch": {"pid": (_pid, True), "start_time": (_start_time, False)},
    "close": {"grace": (_seconds, False)},
    "terminate": {"pid": (_pid, True), "start_time": (_start_time, True),
                  "grace": (_seconds, False), "kill_timeout": (_seconds, False)},
    "detach": {},
}
"""Every method and its parameters: name -> (check, required). A parameter not in
the table is refused (-32602): a misspelt option must not be silently ignored."""


def _check_fields(params: dict[str, Any], fields: Mapping[str, tuple[Check, bool]],
                  prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in params:
        if k not in fields:
            raise RpcError(INVALID_PARAMS, f"unknown parameter {prefix}{k}",
                           {"param": prefix + str(k)})
    for k, (check, required) in fields.items():
        if k in params and params[k] is not None:
            out[k] = check(prefix + k, params[k])
        elif required:
            raise RpcError(INVALID_PARAMS, f"missing parameter {prefix}{k}",
                           {"param": prefix + k})
    return out


def check_params(method: str, params: Any) -> dict[str, Any]:
    """params checked against the method's table (RpcError -32601 or -32602)."""
    fields = METHODS.get(method)
    if fields is None:
        raise RpcError(METHOD_NOT_FOUND, f"no method {method!r}", {"method": method})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "params must be an object (by-name parameters)")
    return _check_fields(params, fields)


# --- the object ------------------------------------------------------------------------------


class Protocol:
    """One connection's framing: bytes in -> requests and ready answers; replies -> bytes.

    Holds only the bytes of an unfinished line (at most ``max_line``)."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        if max_line < 32:
            raise ValueError("max_line must be at least 32 bytes")
        self.max_line = max_line
        self._buf = bytearray()
        self._skipping = False  # inside a line that passed the limit: drop up to its end
        self.lines_in = 0
        self.rejected = 0

    def receive(self, data: bytes) -> list[Item]:
        """Feed bytes as they came; the requests and answers of every line they ended."""
        out: list[Item] = []
        start = 0
        n = len(data)
        while start < n:
            nl = data.find(b"\n", start)
            end = n if nl < 0 else nl
            if self._skipping:
                if nl >= 0:
                    self._skipping = False
            else:
                room = self.max_line - len(self._buf)
                if end - start > room:
                    self._buf.clear()
                    self._skipping = nl < 0
                    self.rejected += 1
                    out.append(Answer(self.error(None, RpcError(
                        INVALID_REQUEST, f"line longer than {self.max_line} bytes",
                        {"error": "line_too_long", "limit": self.max_line}))))
                else:
                    self._buf += data[start:end]
                    if nl >= 0:
                        line = bytes(self._buf)
                        self._buf.clear()
                        item = self._line(line)
                        if item is not None:
                            out.append(item)
            if nl < 0:
                break
            start = nl + 1
        return out

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line held (what a closing peer left unended)."""
        return len(self._buf)

    def end(self) -> list[Item]:
        """The peer closed: a last line without its newline is still a line."""
        if self._skipping or not self._buf:
            self._buf.clear()
            self._skipping = False
            return []
        line = bytes(self._buf)
        self._buf.clear()
        item = self._line(line)
        return [] if item is None else [item]

    def _line(self, line: bytes) -> Optional[Item]:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip():
            return None
        self.lines_in += 1
        try:
            text = line.decode("utf-8")
            msg = json.loads(text)
        except UnicodeDecodeError:
            return self._reject(None, RpcError(PARSE_ERROR, "the line is not UTF-8",
                                               {"error": "not_utf8"}))
        except RecursionError:
            return self._reject(None, RpcError(PARSE_ERROR, "JSON nested too deep",
                                               {"error": "too_deep"}))
        except ValueError as exc:
            return self._reject(None, RpcError(PARSE_ERROR, f"not JSON: {exc}"))
        return self._message(msg)

    def _reject(self, id_: Any, err: RpcError) -> Answer:
        self.rejected += 1
        return Answer(self.error(id_, err))

    def _message(self, msg: Any) -> Optional[Item]:
        if isinstance(msg, list):
            return self._reject(None, RpcError(
                INVALID_REQUEST, "batches are not supported: send one request a line",
                {"error": "batch_not_supported"}))
        if not isinstance(msg, dict):
            return self._reject(None, RpcError(INVALID_REQUEST, "a request is a JSON object"))
        id_ = msg.get("id")
        valid_id = id_ is None or isinstance(id_, str) or (
            isinstance(id_, int) and not isinstance(id_, bool))
        answer_id = id_ if valid_id else None
        if msg.get("jsonrpc") != "2.0":
            return self._reject(answer_id, RpcError(INVALID_REQUEST,
                                                    'a request has "jsonrpc": "2.0"'))
        if not valid_id:
            return self._reject(None, RpcError(INVALID_REQUEST,
                                               "id must be a string, an integer or absent"))
        if "method" not in msg and ("result" in msg or "error" in msg):
            return self._reply(msg)
        if "id" in msg and id_ is None:
            return self._reject(None, RpcError(INVALID_REQUEST,
                                               "id null is not accepted: leave it out for "
                                               "a notification"))
        method = msg.get("method")
        if not isinstance(method, str):
            return self._reject(id_, RpcError(INVALID_REQUEST, "method must be a string"))
        extra = set(msg) - {"jsonrpc", "id", "method", "params"}
        err: Optional[RpcError] = None
        if extra:
            err = RpcError(INVALID_REQUEST, "unknown member(s) " + ", ".join(
                sorted(repr(k) for k in extra)))
        else:
            try:
                params = check_params(method, msg.get("params"))
            except RpcError as exc:
                err = exc
        if err is None:
            return Request(id_, method, params)
        if "id" not in msg:
            # A notification is never answered, not even with an error (JSON-RPC 2.0).
            self.rejected += 1
            return None
        return self._reject(id_, err)

    def _reply(self, msg: dict[str, Any]) -> Item:
        """A client's response to a request of ours: a Reply, or -32600 (id null: a
        response is never answered with its own id, which would read as an answer)."""
        id_ = msg.get("id")
        why = None
        if isinstance(id_, bool) or not isinstance(id_, (int, str)):
            why = "a response has the id of the request it answers"
        elif ("result" in msg) == ("error" in msg):
            why = "a response has a result or an error, not both"
        elif set(msg) - {"jsonrpc", "id", "result", "error"}:
            why = "unknown member(s) in a response"
        elif "error" in msg and not (
                isinstance(msg["error"], dict) and isinstance(msg["error"].get("message"), str)
                and isinstance(msg["error"].get("code"), int)
                and not isinstance(msg["error"].get("code"), bool)):
            why = "a response's error is an object with an integer code and a message"
        if why is not None:
            return self._reject(None, RpcError(INVALID_REQUEST, why))
        assert isinstance(id_, (int, str))
        return Reply(id_, msg.get("result"), msg.get("error"))

    # --- out ------------------------------------------------------------------------------

    @staticmethod
    def response(id_: Union[int, str, None], result: Any) -> bytes:
        return encode({"jsonrpc": "2.0", "id": id_, "result": result})

    @staticmethod
    def error(id_: Union[int, str, None], err: RpcError) -> bytes:
        body: dict[str, Any] = {"code": err.code, "message": err.message}
        if err.data is not None:
            body["data"] = err.data
        return encode({"jsonrpc": "2.0", "id": id_, "error": body})

    @staticmethod
    def request(id_: Union[int, str], method: str, params: dict[str, Any]) -> bytes:
        """A request of the sidecar's to a client (``fresh``)."""
        return encode({"jsonrpc": "2.0", "id": id_, "method": method, "params": params})

    @staticmethod
    def notification(method: str, params: dict[str, Any]) -> bytes:
        return encode({"jsonrpc": "2.0", "method": method, "params": params})
