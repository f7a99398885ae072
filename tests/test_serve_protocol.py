"""The sidecar's protocol object with plain data: framing, every error code, the limits."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proctable.serve import APP_ERRORS, Answer, Protocol, Reply, Request, RpcError
from proctable.serve._objects import output_line, output_params
from proctable.serve._protocol import METHODS, encode
from proctable.supervise import KINDS, Event


def _answers(items: list[Any]) -> list[dict[str, Any]]:
    out = []
    for it in items:
        assert isinstance(it, Answer), it
        assert it.line.endswith(b"\n") and it.line.count(b"\n") == 1
        out.append(json.loads(it.line))
    return out


def _req(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def test_a_request_split_anywhere_is_one_request() -> None:
    line = _req({"jsonrpc": "2.0", "id": 7, "method": "stop", "params": {"key": "k"}})
    for cut in range(len(line) + 1):
        p = Protocol()
        items = p.receive(line[:cut]) + p.receive(line[cut:])
        assert items == [Request(7, "stop", {"key": "k"})]


def test_two_requests_in_one_chunk_and_crlf_and_empty_lines() -> None:
    p = Protocol()
    data = (b'{"jsonrpc":"2.0","id":1,"method":"list"}\r\n\n  \n'
            b'{"jsonrpc":"2.0","id":"b","method":"hello"}\n')
    assert p.receive(data) == [Request(1, "list", {}), Request("b", "hello", {})]


def test_a_notification_has_no_id() -> None:
    [r] = Protocol().receive(b'{"jsonrpc":"2.0","method":"list"}\n')
    assert isinstance(r, Request) and r.notification


_MALFORMED = [
    (b"{not json", -32700, None),
    (b"\xff\xfe\x00garbage", -32700, "not_utf8"),
    (b"[" * 100_000 + b"]" * 100_000, -32700, "too_deep"),
    (b"{" + b'"a":{' * 100_000 + b"}" * 100_001, -32700, "too_deep"),
    (b'[{"jsonrpc":"2.0","id":1,"method":"list"}]', -32600, "batch_not_supported"),
    (b"[]", -32600, "batch_not_supported"),
    (b"42", -32600, None),
    (b'{"id":1,"method":"list"}', -32600, None),
    (b'{"jsonrpc":"1.0","id":1,"method":"list"}', -32600, None),
    (b'{"jsonrpc":"2.0","id":1.5,"method":"list"}', -32600, None),
    (b'{"jsonrpc":"2.0","id":null,"method":"list"}', -32600, None),
    (b'{"jsonrpc":"2.0","id":1,"method":7}', -32600, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"list","extra":1}', -32600, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"nope"}', -32601, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"stop","params":[1]}', -32602, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"stop"}', -32602, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"stop","params":{"key":"k","grace":-1}}', -32602, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"stop","params":{"key":"k","bogus":1}}', -32602, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"start","params":{"key":"k","args":[]}}', -32602, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"start","params":{"key":"k","args":["a\\u0000"]}}',
     -32602, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"start","params":{"key":"k","args":["x"],'
     b'"restart":{"max_restarts":"3"}}}', -32602, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"start","params":{"key":"k","args":["x"],'
     b'"pty":{"rows":0,"cols":80}}}', -32602, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"write","params":{"key":"k","data_b64":"!!"}}',
     -32602, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"probe","params":{"pid":true}}', -32602, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"signal","params":{"key":"k","signal":99}}',
     -32602, None),
]


@pytest.mark.parametrize(("line", "code", "name"), _MALFORMED,
                         ids=lambda v: repr(v)[:40] if isinstance(v, bytes) else None)
def test_malformed_input_is_answered_with_its_code(line: bytes, code: int,
                                                   name: str | None) -> None:
    p = Protocol(max_line=1 << 22)
    [a] = _answers(p.receive(line + b"\n"))
    assert a["jsonrpc"] == "2.0"
    assert a["error"]["code"] == code
    assert isinstance(a["error"]["message"], str) and a["error"]["message"]
    if name is not None:
        assert a["error"]["data"]["error"] == name
    if line.startswith(b"{") and b'"id":1,' in line and code != -32700:
        assert a["id"] == 1
    # ... and the connection goes on.
    assert p.receive(b'{"jsonrpc":"2.0","id":2,"method":"list"}\n') == [Request(2, "list", {})]


def test_a_line_over_the_limit_is_answered_once_skipped_and_survived() -> None:
    p = Protocol(max_line=1024)
    items = p.receive(b"x" * 1000)
    assert items == []
    [a] = _answers(p.receive(b"y" * 100))  # passes the limit: answered at once
    assert a["error"]["code"] == -32600 and a["error"]["data"] == {
        "error": "line_too_long", "limit": 1024}
    assert p.receive(b"z" * 100_000) == []  # the rest of that line: skipped
    assert p.pending == 0
    assert p.receive(b'zz\n{"jsonrpc":"2.0","id":3,"method":"list"}\n') == [
        Request(3, "list", {})]


def test_a_4_mib_line_in_one_chunk() -> None:
    p = Protocol()
    big = _req({"jsonrpc": "2.0", "id": 1, "method": "write",
                "params": {"key": "k", "data_b64": "A" * (4 << 20)}})
    items = p.receive(big + b'{"jsonrpc":"2.0","id":2,"method":"list"}\n')
    [a] = _answers(items[:1])
    assert a["error"]["data"]["error"] == "line_too_long"
    assert items[1:] == [Request(2, "list", {})]


def test_a_line_exactly_at_the_limit_is_accepted() -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"list"}'
    p = Protocol(max_line=len(body))
    assert p.receive(body + b"\n") == [Request(1, "list", {})]
    p = Protocol(max_line=len(body) - 1)
    assert isinstance(p.receive(body + b"\n")[0], Answer)


def test_the_last_line_without_newline_counts_at_the_end() -> None:
    p = Protocol()
    assert p.receive(b'{"jsonrpc":"2.0","id":1,"method":"list"}') == []
    assert p.end() == [Request(1, "list", {})]
    assert p.end() == []


def test_params_are_checked_and_defaults_left_out() -> None:
    p = Protocol()
    [r] = p.receive(_req({"jsonrpc": "2.0", "id": 1, "method": "start", "params": {
        "key": "k", "args": ["sleep", "1"], "restart": {"max_restarts": 2, "fresh_args": ["x"]},
        "pty": {"rows": 24, "cols": 80}, "env": {"A": "1"}, "timeout": 5, "cwd": None}}))
    assert isinstance(r, Request)
    assert r.params == {"key": "k", "args": ["sleep", "1"],
                        "restart": {"max_restarts": 2, "fresh_args": ["x"]},
                        "pty": {"rows": 24, "cols": 80}, "env": {"A": "1"}, "timeout": 5.0}
    [r] = p.receive(_req({"jsonrpc": "2.0", "id": 2, "method": "write",
                          "params": {"key": "k", "data_b64": "aGk="}}))
    assert isinstance(r, Request) and r.params["data_b64"] == b"hi"
    [r] = p.receive(_req({"jsonrpc": "2.0", "id": 3, "method": "signal",
                          "params": {"key": "k", "signal": "term"}}))
    assert isinstance(r, Request) and r.params["signal"] == "SIGTERM"


def test_every_application_error_has_its_code_and_names_itself() -> None:
    codes = set()
    for name, code in APP_ERRORS.items():
        line = Protocol.error(5, RpcError(name, "m", {"key": "k"}))
        obj = json.loads(line)
        assert obj == {"jsonrpc": "2.0", "id": 5, "error": {
            "code": code, "message": "m", "data": {"error": name, "key": "k"}}}
        assert -32099 <= code <= -32000  # the range JSON-RPC keeps for servers
        codes.add(code)
    assert len(codes) == len(APP_ERRORS)
    for name in ("no_such_key", "teardown_failed", "command_not_found", "closed"):
        assert name in APP_ERRORS


def test_out_lines_are_ascii_one_line_each() -> None:
    line = Protocol.notification("event", {"key": "k\u00e9\n", "x": [1, None]})
    assert line.count(b"\n") == 1 and line.isascii()
    assert json.loads(line) == {"jsonrpc": "2.0", "method": "event",
                                "params": {"key": "k\u00e9\n", "x": [1, None]}}
    assert Protocol.response("a", {"ok": True}) == encode(
        {"jsonrpc": "2.0", "id": "a", "result": {"ok": True}})
    with pytest.raises(ValueError):
        encode({"x": float("nan")})


def test_every_method_has_a_table() -> None:
    assert set(METHODS) >= {"start", "stop", "remove", "adopt", "list", "write", "resize",
                            "signal", "tail", "members", "ps", "probe", "watch", "close",
                            "hello"}


@given(st.binary(max_size=2000), st.integers(min_value=1, max_value=64))
def test_any_bytes_never_raise_and_every_line_is_answered_or_a_request(
        data: bytes, chunk: int) -> None:
    p = Protocol(max_line=256)
    items = []
    for i in range(0, len(data), chunk):
        items += p.receive(data[i:i + chunk])
    items += p.end()
    for it in items:
        assert isinstance(it, (Answer, Request, Reply))
        if isinstance(it, Answer):
            obj = json.loads(it.line)
            assert obj["error"]["code"] in (-32700, -32600, -32601, -32602)
    assert p.pending == 0


@pytest.mark.skipif("output" not in KINDS, reason="no output engine in this build")
@given(st.text(min_size=1, max_size=20), st.integers(1, 10**6), st.sampled_from(
    ["stdout", "stderr", "pty"]), st.binary(max_size=300), st.integers(0, 10**9))
def test_the_fast_output_line_is_the_json_one(key: str, gen: int, stream: str, data: bytes,
                                              dropped: int) -> None:
    ev = Event("output", key, gen, None, stream=stream, data=data,  # type: ignore[call-arg]
               dropped=dropped)
    assert output_line(ev) == Protocol.notification("output", output_params(ev))


_PID_PARAMS = [("probe", {}, "pid"), ("watch", {}, "pid"),
               ("adopt", {"key": "k", "start_time": 1}, "pid"),
               ("probe", {"pid": 1}, "start_time"), ("watch", {"pid": 1}, "start_time"),
               ("adopt", {"key": "k", "pid": 1}, "start_time")]
_BAD_PIDS = [-1, 0, 2**31, 2**40, 2**63, True, 1.0, 1.5, "1"]
_BAD_START_TIMES = [-1, 2**64, 2**70, True, 1.0, "1"]


@pytest.mark.parametrize(("method", "base", "param"), _PID_PARAMS)
def test_every_pid_and_start_time_param_is_checked_against_its_range(
        method: str, base: dict[str, Any], param: str) -> None:
    """Issue 30, item 6: a pid above pid_t's range (2**31 - 1) reached the package's
    own check and was answered -32603 (internal error) with a traceback on stderr.
    Every pid and start time is checked on the wire: negative, zero (a pid), past the
    range, a bool, a float: -32602 naming the parameter."""
    bad = _BAD_PIDS if param == "pid" else _BAD_START_TIMES
    for v in bad:
        p = Protocol()
        [a] = _answers(p.receive(_req({"jsonrpc": "2.0", "id": 1, "method": method,
                                       "params": {**base, param: v}})))
        assert a["error"]["code"] == -32602, (method, param, v, a)
        assert a["error"]["data"]["param"] == param
    # The edges of the range are accepted.
    good = [1, 2**31 - 1] if param == "pid" else [0, 2**64 - 1]
    for v in good:
        params = {"pid": 1, "start_time": 1, **base, param: v}
        if method != "adopt" and param == "pid":
            params.pop("start_time")
        [r] = Protocol().receive(_req({"jsonrpc": "2.0", "id": 1, "method": method,
                                       "params": params}))
        assert isinstance(r, Request), (method, param, v, r)


def test_ps_filters_are_checked_against_their_ranges() -> None:
    """Issue 30, item 6 (the same rule for lists): pids past pid_t's range and uids
    past uid_t's are -32602, not a silent empty answer."""
    for params in ({"pids": [2**31]}, {"pids": [0]}, {"pids": [1.0]}, {"uids": [2**32]},
                   {"uids": [-1]}, {"uids": [True]}):
        [a] = _answers(Protocol().receive(_req({"jsonrpc": "2.0", "id": 1, "method": "ps",
                                                "params": params})))
        assert a["error"]["code"] == -32602, params
    [r] = Protocol().receive(_req({"jsonrpc": "2.0", "id": 1, "method": "ps",
                                   "params": {"pids": [2**31 - 1], "uids": [2**32 - 1]}}))
    assert isinstance(r, Request)


_STANDARD_NAMES = {-32700: "parse_error", -32600: "invalid_request", -32601: "method_not_found",
                   -32602: "invalid_params", -32603: "internal_error"}


def test_every_error_names_itself() -> None:
    """Issue 30, item 7: an application error carried its name in ``data.error`` and a
    standard one did not (a client's ``resize(-1, 80)`` rejected with no name). Every
    error names itself: a standard code by its JSON-RPC name, unless a more precise
    one says more (``line_too_long``, ``not_utf8``, ...)."""
    for line, code, name in _MALFORMED:
        [a] = _answers(Protocol(max_line=1 << 22).receive(line + b"\n"))
        assert a["error"]["data"]["error"] == (name or _STANDARD_NAMES[code]), line[:60]
    err = json.loads(Protocol.error(1, RpcError(-32603, "internal error: x")))["error"]
    assert err["data"] == {"error": "internal_error"}
    [a] = _answers(Protocol(max_line=64).receive(b"x" * 100))
    assert a["error"]["data"]["error"] == "line_too_long"


def test_a_response_from_the_client_is_a_reply() -> None:
    """Issue 31, item 3: the sidecar asks a client (``fresh``), so a client's line may
    be a response: read as a Reply (never answered), not refused as a request without
    a method. A malformed response is -32600."""
    p = Protocol()
    items = p.receive(b'{"jsonrpc":"2.0","id":"fresh-1","result":["sh","-c","true"]}\n'
                      b'{"jsonrpc":"2.0","id":"fresh-2","result":null}\n'
                      b'{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"no"}}\n')
    assert items == [Reply("fresh-1", ["sh", "-c", "true"], None),
                     Reply("fresh-2", None, None),
                     Reply(7, None, {"code": -32601, "message": "no"})]
    for bad in (b'{"jsonrpc":"2.0","result":1}',                      # no id
                b'{"jsonrpc":"2.0","id":null,"result":1}',            # id null
                b'{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"m"}}',
                b'{"jsonrpc":"2.0","id":1,"error":{"message":"m"}}',   # no code
                b'{"jsonrpc":"2.0","id":1,"error":"m"}',
                b'{"jsonrpc":"2.0","id":1,"result":1,"extra":2}',
                b'{"id":1,"result":1}'):
        [a] = _answers(p.receive(bad + b"\n"))
        assert a["error"]["code"] == -32600, bad


def test_restart_fresh_ask_is_checked() -> None:
    """Issue 31, item 3: ``restart.fresh`` is ``"ask"`` or absent; ``fresh_timeout`` is
    seconds > 0, at most an hour."""
    def start(restart: dict[str, Any]) -> Any:
        [it] = Protocol().receive(_req({"jsonrpc": "2.0", "id": 1, "method": "start", "params": {
            "key": "k", "args": ["true"], "restart": restart}}))
        return it
    assert isinstance(start({"fresh": "ask", "fresh_timeout": 2.5}), Request)
    for bad in ({"fresh": "always"}, {"fresh": True}, {"fresh_timeout": 0},
                {"fresh_timeout": 3601}, {"fresh_timeout": "1"}):
        [a] = _answers([start(bad)])
        assert a["error"]["code"] == -32602, bad
