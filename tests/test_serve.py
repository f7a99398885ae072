"""``proctable serve`` over stdio and over a socket, with real processes."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

import proctable
import proctable.supervise  # for proctable.supervise.KINDS: imported, not an attribute

from ._lineage import assert_all_dead, kill_identity
from ._serve import Peer, Sidecar, kill
from ._supervise import LeftJobs
from .conftest import PY, wait_until

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the sidecar's lineages are Linux's")

ESCAPE = "setsid sleep 300 & exec sleep 300"  # a root and a setsid'd tool job


@pytest.fixture(params=["stdio", "socket"])
def side(request: pytest.FixtureRequest) -> Iterator[Sidecar]:
    s = Sidecar(request.param)
    try:
        yield s
    finally:
        s.close()


def test_hello_names_the_protocol_and_the_host(side: Sidecar) -> None:
    r = side.peer.call("hello")
    assert r["protocol"] == 1
    assert r["version"] == proctable.__version__
    assert {"start", "stop", "remove", "adopt", "list", "write", "resize", "signal", "tail",
            "members", "ps", "probe", "watch", "close"} <= set(r["methods"])
    caps = r["capabilities"]
    for k in ("pidfds", "bpf", "cgroup", "subreaper", "connector"):
        assert isinstance(caps[k], bool)
    assert caps["pidfds"] == hasattr(os, "pidfd_open")
    assert r["write_timeout"] == 5.0  # without --write-timeout
    assert side.peer.call("version") == r | {"pid": r["pid"]}


def test_start_answers_after_created_and_exit_follows(side: Sidecar) -> None:
    p = side.peer
    i = p.send("start", {"key": "a", "args": ["sh", "-c", "sleep 0.2; exit 3"]})
    resp = p.response(i)
    kinds = [o["params"]["kind"] for o in p.seen if o.get("method") == "event"]
    assert kinds == ["created"], "the response comes after its created"
    res = resp["result"]
    created = p.events("a")[0]
    assert (res["pid"], res["start_time"], res["generation"]) == (
        created["pid"], created["start_time"], created["generation"])
    assert res["generation"] == 1
    ex = p.event("a", "exited")
    assert ex["status"] == "exited" and ex["code"] == 3 and ex["signal"] is None
    assert ex["exit"]["returncode"] == 3
    assert ex["generation"] == 1
    [row] = p.call("list")["keys"]
    assert row["key"] == "a" and row["generation"] == 1 and row["running"] is False


def test_replacement_under_one_key_keeps_generations_apart(side: Sidecar) -> None:
    p = side.peer
    r1 = p.call("start", {"key": "k", "args": ["sh", "-c", ESCAPE]})
    old = p.members("k", 2)
    r2 = p.call("start", {"key": "k", "args": ["sleep", "300"]})
    # The predecessor ended (exited killed, generation 1) before the successor's created.
    ev = [(e["kind"], e["generation"]) for e in p.events("k")]
    assert ev == [("created", 1), ("exited", 1), ("created", 2)]
    assert p.events("k")[1]["status"] == "killed"
    assert r2["generation"] == 2 and r1["generation"] == 1
    assert_all_dead(old)  # the setsid'd job of generation 1 too
    rows = p.call("list")["keys"]
    assert [(x["key"], x["pid"], x["generation"]) for x in rows] == [("k", r2["pid"], 2)]


def test_stop_remove_and_exactly_one_exited(side: Sidecar) -> None:
    p = side.peer
    p.call("start", {"key": "sh", "args": ["sh", "-c", ESCAPE]})
    members = p.members("sh", 2)
    st = p.call("stop", {"key": "sh", "grace": 0.5})
    assert st["signal"] in (signal.SIGTERM, signal.SIGKILL) and st["code"] is None
    assert_all_dead(members)  # gone when stop returns, escape included
    assert [e["kind"] for e in p.events("sh")] == ["created", "exited"]
    p.call("start", {"key": "sh", "args": ["sleep", "300"]})
    p.call("remove", {"key": "sh"})
    kinds = [(e["kind"], e["generation"]) for e in p.events("sh")]
    assert kinds == [("created", 1), ("exited", 1), ("created", 2), ("exited", 2),
                     ("deleted", 2)]
    assert p.call("list")["keys"] == []
    err = p.fails("stop", {"key": "sh"})
    assert err["code"] == -32001 and err["data"]["error"] == "no_such_key"
    err = p.fails("members", {"key": "nope"})
    assert err["data"] == {"error": "no_such_key", "key": "nope"}


def test_seconds_the_timer_cannot_hold_are_invalid_params(side: Sidecar) -> None:
    """A ``start`` with ``timeout: 1e300`` was accepted over the wire and killed the
    supervisor's timer thread: no timeout or restart delay of any key ended after it
    (issue 30, item 2, found by fuzzing the sidecar). It is -32602, as are such a
    restart ``delay`` and a stop's ``grace``, and the sidecar's timers go on."""
    p = side.peer
    for huge in (1e300, 2**70):
        err = p.fails("start", {"key": "a", "args": ["sleep", "60"], "timeout": huge})
        assert err["code"] == -32602 and "timeout" in err["message"]
        err = p.fails("start", {"key": "a", "args": ["sleep", "60"],
                                "restart": {"delay": huge}})
        assert err["code"] == -32602 and "delay" in err["message"]
    p.call("start", {"key": "b", "args": ["sleep", "60"]})
    for method in ("stop", "remove"):
        err = p.fails(method, {"key": "b", "grace": 1e300})
        assert err["code"] == -32602 and "grace" in err["message"], err
    assert [k["key"] for k in p.call("list")["keys"]] == ["b"]
    p.call("start", {"key": "t", "args": ["sleep", "60"], "timeout": 0.5})
    assert p.event("t", "exited")["status"] == "timeout"
    p.call("remove", {"key": "b"})


@pytest.mark.parametrize("output", ["discard", "stderr", "events"])
def test_exited_of_a_natural_exit_comes_after_its_teardown(side: Sidecar, tmp_path: Any,
                                                           output: str) -> None:
    """A provider started with ``output: "discard"`` that leaves ``setsid nohup`` jobs
    and exits: at its ``exited`` notification all four jobs still ran, 25 runs of 25,
    where docs/serve.md says every teardown comes before ``exited`` (issue 30, item
    4, found by the acceptance scenarios in Node). In every output mode, none runs
    when the line arrives (by pid and start time)."""
    p = side.peer
    jobs = LeftJobs(str(tmp_path))
    try:
        p.call("start", {"key": "prov", "args": jobs.args, "output": output})
        assert len(jobs.started()) == 4
        jobs.go()
        ex = p.event("prov", "exited")
        assert jobs.alive() == [], "jobs ran when the exited line came"
        assert ex["status"] == "exited" and ex["code"] == 0
        assert [e["kind"] for e in p.events("prov")] == ["created", "exited"]
    finally:
        jobs.clean()


def test_restart_fresh_on_clean_exit_and_recovery_on_crash(side: Sidecar, tmp_path: Any) -> None:
    p = side.peer
    mark = tmp_path / "ran"
    p.call("start", {"key": "r", "args": ["sh", "-c", f"echo x >> {mark}; exit 0"],
                     "restart": {"max_fast_exits": 3, "fast_exit": 0.0,
                                 "fresh_args": ["sh", "-c", f"echo fresh >> {mark}; exit 0"]}})
    p.until(lambda o: o.get("method") == "event" and o["params"]["key"] == "r"
            and o["params"]["kind"] == "created" and o["params"]["generation"] == 3)
    # Generation 3 is created when launched, before its sh has written its line:
    # a stop at once may kill it first (seen under load).
    wait_until(lambda: len(mark.read_text().splitlines()) >= 3)
    p.call("stop", {"key": "r"})
    assert mark.read_text().splitlines()[:3] == ["x", "fresh", "fresh"]
    p.call("start", {"key": "c", "args": ["sh", "-c", "exit 9"],
                     "restart": {"max_restarts": 2}})
    gave = p.event("c", "gave_up")
    kinds = [e["kind"] for e in p.events("c")]
    assert kinds.count("restarting") == 2 and kinds[-1] == "gave_up"
    assert gave.get("reason")


def test_start_errors_name_themselves(side: Sidecar) -> None:
    p = side.peer
    err = p.fails("start", {"key": "x", "args": ["/no/such/command"]})
    assert err["code"] == -32003 and err["data"]["error"] == "command_not_found"
    err = p.fails("start", {"key": "x", "args": ["/"]})
    assert err["data"]["error"] == "spawn_failed"
    assert p.events() == [], "a command that cannot start emits nothing"
    err = p.fails("start", {"key": "x", "args": ["true"], "restart": {"max_fast_exits": 0}})
    assert err["code"] == -32602


def test_signal_reaches_the_root_only(side: Sidecar) -> None:
    p = side.peer
    p.call("start", {"key": "s", "args": ["sleep", "300"]})
    r = p.call("signal", {"key": "s", "signal": "SIGUSR1"})
    assert r["sent"] is True
    ex = p.event("s", "exited")
    assert ex["status"] == "signaled" and ex["signal"] == signal.SIGUSR1
    err = p.fails("signal", {"key": "s", "signal": 15})
    assert err["data"]["error"] == "no_such_process"


def test_adopt_takes_over_a_running_process(side: Sidecar) -> None:
    p = side.peer
    proc = subprocess.Popen(["sleep", "300"])
    try:
        ident = proctable.identity(proc.pid)
        assert ident is not None
        r = p.call("adopt", {"key": "ad", "pid": ident.pid, "start_time": ident.start_time})
        assert (r["pid"], r["start_time"]) == (ident.pid, ident.start_time)
        p.call("stop", {"key": "ad", "grace": 1})
        assert proc.wait(10) == -signal.SIGTERM
        err = p.fails("adopt", {"key": "ad2", "pid": ident.pid,
                                "start_time": ident.start_time + 1})
        assert err["data"]["error"] == "no_such_process"
    finally:
        kill_identity(proctable.identity(proc.pid))
        proc.wait(10)


def test_ps_probe_and_watch(side: Sidecar) -> None:
    p = side.peer
    me = os.getpid()
    rows = p.call("ps", {"pids": [me, side.proc.pid]})["procs"]
    assert {r["pid"] for r in rows} == {me, side.proc.pid}
    mine = next(r for r in rows if r["pid"] == me)
    assert mine["start_time"] == proctable.identity(me).start_time  # type: ignore[union-attr]
    named = p.call("ps", {"name": "^pytest|^python"})["procs"]
    assert me in {r["pid"] for r in named} or any(r["name"].startswith("py") for r in named)
    err = p.fails("ps", {"name": "("})
    assert err["code"] == -32602
    # A process nobody reaps (its parent execs a sleep): probe and watch see its exit.
    sh = subprocess.Popen(["sh", "-c", "sh -c 'sleep 0.3; exit 7' & echo $!; exec sleep 300"],
                          stdout=subprocess.PIPE)
    try:
        assert sh.stdout is not None
        pid = int(sh.stdout.readline())
        ident = proctable.identity(pid)
        assert ident is not None
        w = p.call("watch", {"pid": pid, "start_time": ident.start_time})
        assert w == {"pid": pid, "start_time": ident.start_time}
        ex = p.until(lambda o: o.get("method") == "exit")["params"]
        assert ex["pid"] == pid and ex["outcome"] == "exited" and ex["code"] == 7
        assert ex["source"] in ("pidfd_info", "waitid", "zombie")
        pr = p.call("probe", {"pid": pid, "start_time": ident.start_time})
        assert pr["state"] == "exited" and pr["status"]["code"] == 7
    finally:
        kill_identity(proctable.identity(sh.pid))
        sh.wait(10)
    # The same pid with another start time is not that process: never its exit.
    other = p.call("watch", {"pid": pid, "start_time": ident.start_time + 1})
    assert other["pid"] == pid
    ex = p.until(lambda o: o.get("method") == "exit")["params"]
    assert ex["outcome"] in ("gone", "reused") and ex["code"] is None


def test_output_methods_say_what_they_need(side: Sidecar) -> None:
    p = side.peer
    p.call("start", {"key": "o", "args": ["sleep", "300"], "output": "discard"})
    err = p.fails("write", {"key": "o", "data_b64": base64.b64encode(b"hi\n").decode()})
    assert err["data"]["error"] in ("no_input", "not_supported")
    err = p.fails("resize", {"key": "o", "rows": 10, "cols": 20})
    assert err["data"]["error"] in ("no_input", "not_supported")
    err = p.fails("write", {"key": "nope", "data_b64": ""})
    assert err["data"]["error"] in ("no_such_key", "not_supported")


def test_close_stops_everything_then_starts_are_refused(side: Sidecar) -> None:
    p = side.peer
    for k in ("c1", "c2", "c3"):
        p.call("start", {"key": k, "args": ["sh", "-c", ESCAPE]})
    members = [m for k in ("c1", "c2", "c3") for m in p.members(k, 2)]
    t0 = time.monotonic()
    p.call("close", {"grace": 1})
    took = time.monotonic() - t0
    assert_all_dead(members)
    for k in ("c1", "c2", "c3"):
        assert [e["kind"] for e in p.events(k)] == ["created", "exited"]
    assert took < 3 * 1 + 10  # side by side: not three graces and more in a row
    err = p.fails("start", {"key": "late", "args": ["true"]})
    assert err["code"] == -32005 and err["data"]["error"] == "closed"
    assert p.call("hello")["protocol"] == 1  # still answering


def test_bad_input_is_answered_and_survived(side: Sidecar) -> None:
    p = side.peer
    p.send_raw(b"{not json\n")
    assert p.read()["error"]["code"] == -32700
    p.send_raw(b"\x00\xff\xfe binary \x80\x81\n")
    assert p.read()["error"]["code"] == -32700
    p.send_raw(b"[" * 200_000 + b"]" * 200_000 + b"\n")
    assert p.read()["error"]["code"] in (-32700, -32600)
    p.send_raw(b'{"jsonrpc":"2.0","id":5,"method":"frobnicate"}\n')
    r = p.read()
    assert r["id"] == 5 and r["error"]["code"] == -32601
    p.send_raw(b'{"jsonrpc":"2.0","id":6,"method":"stop","params":{"key":3}}\n')
    r = p.read()
    assert r["id"] == 6 and r["error"]["code"] == -32602
    p.send_raw(b'{"jsonrpc":"2.0","id":7,"method":"start","params":{"key":"z"}}\n')
    assert p.read()["error"]["code"] == -32602
    big = json.dumps({"jsonrpc": "2.0", "id": 8, "method": "write",
                      "params": {"key": "k", "data_b64": "A" * (4 << 20)}}).encode()
    p.send_raw(big + b"\n")
    r = p.read()
    assert r["error"]["code"] == -32600 and r["error"]["data"]["error"] == "line_too_long"
    assert p.call("hello")["protocol"] == 1
    assert side.proc.poll() is None


def test_200_pipelined_starts_over_50_keys_are_all_answered(side: Sidecar) -> None:
    p = side.peer
    ids = {}
    blob = b""
    for n in range(200):
        i = 1000 + n
        ids[i] = f"k{n % 50}"
        blob += json.dumps({"jsonrpc": "2.0", "id": i, "method": "start", "params": {
            "key": ids[i], "args": ["sleep", "300"]}}).encode() + b"\n"
    p.send_raw(blob)
    answered: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + 240
    while len(answered) < 200:
        o = p.read(max(0.1, deadline - time.monotonic()))
        if "id" in o:
            assert o["id"] in ids and o["id"] not in answered
            answered[o["id"]] = o
    assert all("result" in o for o in answered.values()), [
        o for o in answered.values() if "error" in o][:3]
    rows = p.call("list")["keys"]
    assert len(rows) == 50 and all(r["generation"] == 4 for r in rows)
    # Per key: generation n's created before n's exited, before n+1's created.
    for k in {r["key"] for r in rows}:
        ev = [(e["kind"], e["generation"]) for e in p.events(k)]
        assert ev == [("created", 1), ("exited", 1), ("created", 2), ("exited", 2),
                      ("created", 3), ("exited", 3), ("created", 4)]
    p.call("close", {"grace": 1}, timeout=120)


def test_what_serve_md_says_of_ended_runs_and_removed_keys(side: Sidecar) -> None:
    """docs/serve.md's notes: a command that exits 0 has what it left running torn
    down before its exited; a stop of an ended run stops nothing (exit null);
    generations go on counting after a remove."""
    p = side.peer
    p.call("start", {"key": "j", "args": ["sh", "-c", "sleep 300 & echo $!; exit 0"]})
    ex = p.event("j", "exited")
    assert ex["exit"]["code"] == 0
    text = b"".join(base64.b64decode(o["data_b64"]) for o in _outputs(p, "j"))
    bg = int(text.split()[0])
    row = proctable.read(bg)
    assert row is None or row.state == "Z" or row.name != "sleep"  # gone (or reused)
    assert p.call("stop", {"key": "j"}) == {"exit": None, "code": None, "signal": None}
    p.call("remove", {"key": "j"})
    again = p.call("start", {"key": "j", "args": ["true"]})
    assert again["generation"] == 2
    p.event("j", "exited")


def _escapes(p: Peer, n: int) -> list[proctable.Identity]:
    out = []
    for k in range(n):
        p.call("start", {"key": f"e{k}", "args": ["sh", "-c", ESCAPE]})
    for k in range(n):
        out += p.members(f"e{k}", 2)
    return out


def test_stdin_eof_ends_every_lineage_and_exits_0() -> None:
    s = Sidecar("stdio")
    try:
        members = _escapes(s.peer, 3)
        s.end_input()
        assert s.wait(60) == 0
        assert_all_dead(members)
    finally:
        s.close()


@pytest.mark.parametrize("method", ["hello", "ps"])
def test_serve_answers_a_call_whose_input_ends_right_after_it(method: str) -> None:
    """``proctable serve`` over stdio answered nothing to a ``hello`` (or a ``ps``)
    whose input ends right after it (``echo '{...hello...}' | proctable serve``): the
    answer of a call that runs on a client's worker was dropped at shutdown. Found by an
    outside review of issue 21's changes."""
    line = json.dumps({"jsonrpc": "2.0", "id": 7, "method": method}) + "\n"
    r = subprocess.run([PY, "-m", "proctable", "serve"], input=line, capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    answers = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    ids = [a.get("id") for a in answers if "result" in a or "error" in a]
    assert ids == [7], f"answers to {method} at EOF: {answers!r} (stderr {r.stderr!r})"


@linux_only
def test_serve_answers_a_socket_peer_that_half_closes_after_its_calls(tmp_path: Any) -> None:
    """The same for a socket peer that half-closes after its calls: its answers were
    dropped. Found by an outside review of issue 21's changes."""
    path = str(tmp_path / "pt.sock")
    server = subprocess.Popen([PY, "-m", "proctable", "serve", "--socket", path],
                              stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: os.path.exists(path), 30)
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"hello"}\n'
                      b'{"jsonrpc":"2.0","id":2,"method":"ps"}\n')
            s.shutdown(socket.SHUT_WR)
            s.settimeout(30)
            data = b""
            while True:
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        ids = sorted(json.loads(x)["id"] for x in data.splitlines() if x.strip())
        assert ids == [1, 2]
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert server.returncode == 0, err


@pytest.mark.parametrize("transport", ["stdio", "socket"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_end_every_lineage_and_exit_0(transport: str, sig: int) -> None:
    s = Sidecar(transport)
    try:
        members = _escapes(s.peer, 3)
        s.proc.send_signal(sig)
        assert s.wait(60) == 0
        assert_all_dead(members)
        kinds = [e["kind"] for e in s.peer.events()]
        while True:  # what the sidecar wrote before it ended
            try:
                s.peer.read(1.0)
            except BaseException:
                break
        kinds = [e["kind"] for e in s.peer.events()]
        assert kinds.count("exited") == 3
        if transport == "socket":
            assert not os.path.exists(s.path)
    finally:
        s.close()


@pytest.mark.parametrize("mode", ["auto", "subreaper", "scan"])
def test_sigkill_of_the_sidecar_leaves_nothing(mode: str) -> None:
    s = Sidecar("stdio", "--mode", mode)
    members: list[proctable.Identity] = []
    try:
        members = _escapes(s.peer, 2)
        must_end = members
        if mode == "scan":
            # scan mode's command dies with the sidecar (PR_SET_PDEATHSIG); what it
            # started itself does not inherit that (docs/lineage.md): only the roots.
            roots = {r["pid"] for r in s.peer.call("list")["keys"]}
            must_end = [m for m in members if m.pid in roots]
        os.kill(s.proc.pid, signal.SIGKILL)
        s.wait(10)
        wait_until(lambda: all(not m.alive() for m in must_end), timeout=20)
    finally:
        for m in members:
            kill(m)
        s.close()


def test_two_socket_clients_share_keys_and_events() -> None:
    s = Sidecar("socket")
    try:
        a, b = s.peer, s.connect()
        a.call("start", {"key": "shared", "args": ["sleep", "300"]})
        ev = b.event("shared", "created")
        assert ev["generation"] == 1
        assert [r["key"] for r in b.call("list")["keys"]] == ["shared"]
        b.call("stop", {"key": "shared"})
        assert a.event("shared", "exited")["status"] == "killed"
        # One client leaving changes nothing for the other, nor for the keys.
        a_sock = s.socks[0]
        a_sock.close()
        s.socks.remove(a_sock)
        b.call("start", {"key": "shared", "args": ["sleep", "300"]})
        assert b.call("list")["keys"][0]["running"] is True
    finally:
        s.close()


def test_a_client_that_does_not_read_stalls_nobody() -> None:
    """One client asks for many large answers and reads none of them: its socket and
    its writer fill, while the main loop and the other client go on; later it gets
    every answer (responses are never dropped)."""
    s = Sidecar("socket")
    try:
        lazy = s.connect()
        ids = [lazy.send("ps", {"kernel_threads": True}) for _ in range(200)]  # > its socket's room
        p = s.peer
        for n in range(10):
            t0 = time.monotonic()
            p.call("start", {"key": f"busy{n % 3}", "args": ["sleep", "300"]})
            assert p.call("hello")["protocol"] == 1
            assert time.monotonic() - t0 < 20
        p.call("close", {"grace": 1})
        got = [lazy.response(i, timeout=120) for i in ids]
        assert all(len(r["result"]["procs"]) > 0 for r in got)
        want = [(e["key"], e["kind"], e["generation"]) for e in p.events()]
        while len(lazy.events()) < len(want):  # it gets every event as well, in order
            lazy.read(60)
        assert [(e["key"], e["kind"], e["generation"]) for e in lazy.events()] == want
    finally:
        s.close()


def _other_uid_connects(path: str) -> str:
    """Connect as uid 65534 from a forked child; what it saw."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            import socket as so
            c = so.socket(so.AF_UNIX, so.SOCK_STREAM)
            try:
                c.connect(path)
                c.settimeout(10)
                data = c.recv(4096)
                msg = "read:" + data.decode(errors="replace")
            except OSError as e:
                msg = f"oserror:{e.errno}"
            os.write(w, msg.encode())
        finally:
            os._exit(0)
    os.close(w)
    out = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        out += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return out.decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another uid")
def test_another_uid_is_refused_at_the_socket() -> None:
    s = Sidecar("socket")
    try:
        assert (os.stat(s.path).st_mode & 0o777) == 0o600
        seen = _other_uid_connects(s.path)
        assert seen.startswith("oserror:"), seen  # the file's mode refuses it
        # Opened up by hand: SO_PEERCRED still refuses the other uid.
        os.chmod(s.path, 0o666)
        os.chmod(s.dir, 0o755)
        seen = _other_uid_connects(s.path)
        assert seen.startswith("read:"), seen
        err = json.loads(seen[len("read:"):])
        assert err["error"]["data"]["error"] == "forbidden"
        assert s.peer.call("hello")["protocol"] == 1
    finally:
        s.close()


needs_output = pytest.mark.skipif("output" not in proctable.supervise.KINDS,
                                  reason="no output engine in this build")


def _outputs(p: Peer, key: str) -> list[dict[str, Any]]:
    return [o["params"] for o in p.seen if o.get("method") == "output"
            and o["params"]["key"] == key]


def _text(outs: list[dict[str, Any]], stream: str | None = None) -> bytes:
    return b"".join(base64.b64decode(o["data_b64"]) for o in outs
                    if stream is None or o["stream"] == stream)


def _until_text(p: Peer, key: str, needle: bytes, timeout: float = 30.0) -> None:
    """Read until key's output so far holds needle (it may have come before a response)."""
    deadline = time.monotonic() + timeout
    while needle not in _text(_outputs(p, key)):
        p.read(max(0.01, deadline - time.monotonic()))


@needs_output
def test_output_events_carry_the_exact_bytes_in_order(side: Sidecar) -> None:
    p = side.peer
    p.call("start", {"key": "o", "args": ["sh", "-c", r"printf 'a\000\377b'; printf e >&2"]})
    p.event("o", "exited")
    outs = _outputs(p, "o")
    assert _text(outs, "stdout") == b"a\x00\xffb" and _text(outs, "stderr") == b"e"
    assert all(o["generation"] == 1 and o["dropped"] == 0 for o in outs)
    order = [o["method"] if o["method"] == "output" else o["params"]["kind"]
             for o in p.seen if o.get("method") in ("event", "output")]
    assert order[0] == "created" and order[-1] == "exited" and "output" in order
    tail = base64.b64decode(p.call("tail", {"key": "o"})["data_b64"])
    assert tail.endswith(b"b") or tail.endswith(b"e")


@needs_output
def test_write_to_a_stdin_pipe_and_eof(side: Sidecar) -> None:
    p = side.peer
    p.call("start", {"key": "cat", "args": ["cat"], "stdin": "pipe"})
    r = p.call("write", {"key": "cat", "data_b64": base64.b64encode(b"hello\n").decode(),
                         "eof": True})
    assert r["written"] == 6
    ex = p.event("cat", "exited")
    assert ex["code"] == 0
    assert _text(_outputs(p, "cat")) == b"hello\n"


@needs_output
def test_a_pty_key_resized_and_written(side: Sidecar) -> None:
    p = side.peer
    p.call("start", {"key": "t", "args": ["sh", "-c", "stty size; read x; stty size; echo got:$x"],
                     "pty": {"rows": 24, "cols": 80}})
    _until_text(p, "t", b"24 80")
    p.call("resize", {"key": "t", "rows": 30, "cols": 100})
    p.call("write", {"key": "t", "data_b64": base64.b64encode(b"yes\n").decode()})
    p.event("t", "exited")
    text = _text(_outputs(p, "t"))
    assert b"30 100" in text and b"got:yes" in text
    assert {o["stream"] for o in _outputs(p, "t")} == {"pty"}


@needs_output
def test_a_predecessors_late_output_never_reaches_its_successor(side: Sidecar) -> None:
    p = side.peer
    late = "trap 'echo late; exit 1' TERM; echo early; while :; do sleep 0.05; done"
    p.call("start", {"key": "k", "args": ["sh", "-c", late]})
    _until_text(p, "k", b"early")
    p.call("start", {"key": "k", "args": ["sh", "-c", "echo second; sleep 300"]})
    _until_text(p, "k", b"second")
    seq = [(o["method"], o["params"].get("kind"), o["params"]["generation"])
           for o in p.seen if o.get("method") in ("event", "output")]
    created2 = seq.index(("event", "created", 2))
    assert all(g == 2 for _m, _k, g in seq[created2:])
    assert ("event", "exited", 1) in seq[:created2]
    assert b"late" in _text([o for o in _outputs(p, "k") if o["generation"] == 1])


@needs_output
def test_a_client_that_stops_reading_loses_output_counted_and_told() -> None:
    s = Sidecar("socket")
    try:
        lazy = s.connect()
        lazy.call("hello")
        total = 64 << 20
        p = s.peer
        p.call("start", {"key": "big", "args": ["head", "-c", str(total), "/dev/zero"]})
        ex = p.event("big", "exited", timeout=120)
        assert ex["code"] == 0
        # Every byte the reading client did not get is counted: the supervisor's
        # drops (dropped), and the sidecar's for this client if it fell behind (lost).
        got = _text(_outputs(p, "big"))
        dropped = sum(o["dropped"] for o in _outputs(p, "big"))
        p_lost = sum(o["params"]["bytes"] for o in p.seen if o.get("method") == "lost")
        assert len(got) + dropped + p_lost == total
        assert set(got) <= {0}
        assert p.call("hello")["protocol"] == 1
        # Now the lazy one reads: what it lost is counted, and told before exited.
        lazy.event("big", "exited", timeout=120)
        lost = [o["params"] for o in lazy.seen if o.get("method") == "lost"]
        lazy_got = len(_text(_outputs(lazy, "big")))
        lazy_dropped = sum(o["dropped"] for o in _outputs(lazy, "big"))
        assert lost, "a client that did not read lost output, and is told"
        assert lazy_got + lazy_dropped + sum(x["bytes"] for x in lost) == total
        kinds = [o.get("method") if o.get("method") != "event" else o["params"]["kind"]
                 for o in lazy.seen]
        assert kinds.index("lost") < kinds.index("exited")
    finally:
        s.close()


def test_the_sidecars_log_never_blocks_on_a_stderr_nobody_reads() -> None:
    """Issue 30, item 6: with its stderr a pipe nobody read, the sidecar stopped
    answering once a few tracebacks filled it (the logging thread blocked, and it
    was the main loop). Its log handler never blocks: past its bound, records are
    dropped and counted, and the count is told once the pipe is read again."""
    import logging
    import threading

    from proctable.serve._log import StderrLog

    r, w = os.pipe()
    handler = StderrLog(w, limit=64 << 10)
    logger = logging.getLogger("proctable.test.stderrlog")
    logger.addHandler(handler)
    logger.propagate = False
    n = 5000
    flooded = threading.Event()

    def flood() -> None:
        for i in range(n):
            logger.error("record %d %s", i, "x" * 1000)  # 5 MB in all: 80 pipes full
        flooded.set()
    try:
        threading.Thread(target=flood, daemon=True).start()
        assert flooded.wait(60), "logging blocked on a pipe nobody reads"
        assert handler.dropped > 0
        got = bytearray()
        reader = threading.Thread(target=lambda: got.extend(_read_all(r)), daemon=True)
        reader.start()
        assert handler.flush(60), "the queue was not written once the pipe was read"
    finally:
        handler.close()
        logger.removeHandler(handler)
        os.close(w)
    reader.join(30)
    lines = bytes(got).decode().splitlines()
    records = [ln for ln in lines if ln.startswith("proctable serve: record ")]
    told = [int(ln.split()[2]) for ln in lines if "log record(s) dropped" in ln]
    numbers = [int(ln.split()[3]) for ln in records]
    assert numbers == sorted(numbers)
    assert len(records) + sum(told) == n, (len(records), told)
    assert sum(told) == handler.dropped


def _read_all(fd: int) -> bytes:
    out = bytearray()
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            os.close(fd)
            return bytes(out)
        out += chunk


@needs_output
@pytest.mark.parametrize("transport", ["stdio", "socket"])
def test_a_write_to_a_command_that_does_not_read_gives_up_with_the_count(
        transport: str) -> None:
    """Issue 30, item 12: a write to a command that does not read gives up after the
    sidecar's write timeout with no_input; how much went in was only in the
    message. It is in error.data (``written``, with the ``timeout``). The timeout is
    ``--write-timeout``'s (1 s here: the 5 s default is waited out by nothing else)."""
    side = Sidecar(transport, "--write-timeout", "1")
    try:
        p = side.peer
        assert p.call("hello")["write_timeout"] == 1.0
        p.call("start", {"key": "deaf", "args": ["sleep", "300"], "stdin": "pipe"})
        data = base64.b64encode(b"y" * (512 << 10)).decode()
        t0 = time.monotonic()
        err = p.fails("write", {"key": "deaf", "data_b64": data})
        assert time.monotonic() - t0 >= 1.0
        assert err["code"] == -32007 and err["data"]["error"] == "no_input"
        assert err["data"]["key"] == "deaf" and err["data"]["timeout"] == 1.0
        assert 0 < err["data"]["written"] < (512 << 10)  # what the pipe took
        assert str(err["data"]["written"]) in err["message"]
    finally:
        side.close()


def test_a_write_timeout_of_zero_is_taken() -> None:
    """``--write-timeout 0`` (a write takes what the input holds and never waits) is a
    valid bound, not a refusal; hello says it (the 5 s default: the hello test)."""
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "hello"}) + "\n"
    r = subprocess.run([PY, "-m", "proctable", "serve", "--write-timeout", "0"], input=line,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    [answer] = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    assert answer["result"]["write_timeout"] == 0.0, answer


@pytest.mark.parametrize(("value", "says"), [
    ("-1", "seconds must be >= 0 and finite, not -1"),
    ("nan", "seconds must be >= 0 and finite, not nan"),
    ("inf", "seconds must be >= 0 and finite, not inf"),
    ("soon", "not a number of seconds: 'soon'"),
    ("", "not a number of seconds: ''"),
    ("1e300", "write_timeout must be at most"),
])
def test_a_bad_write_timeout_is_refused_at_start(value: str, says: str) -> None:
    """A ``--write-timeout`` that is no finite number of seconds >= 0, or that no wait
    can hold, ends the sidecar at start with a message naming it, before any client."""
    r = subprocess.run([PY, "-m", "proctable", "serve", "--write-timeout", value],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode != 0 and r.stdout == "", (r.returncode, r.stdout)
    assert says in r.stderr, r.stderr
    if value != "1e300":  # argparse's refusal: exit 2, the option named
        assert r.returncode == 2 and "--write-timeout" in r.stderr, r.stderr


@needs_output
def test_tail_says_how_much_was_asked_and_given(side: Sidecar) -> None:
    """Issue 30, item 12: tail capped at 262,144 bytes silently. Its result says how
    many bytes were asked and given, and the most the sidecar keeps per key
    (``limit``, also in hello as ``tail_limit``)."""
    p = side.peer
    limit = p.call("hello")["tail_limit"]
    assert limit == 262144
    p.call("start", {"key": "t", "args": ["head", "-c", "300000", "/dev/zero"]})
    p.event("t", "exited")
    r = p.call("tail", {"key": "t", "bytes": 1_000_000})
    assert (r["asked"], r["given"], r["limit"]) == (1_000_000, limit, limit)
    assert base64.b64decode(r["data_b64"]) == b"\0" * limit
    r = p.call("tail", {"key": "t", "bytes": 10})
    assert (r["asked"], r["given"]) == (10, 10)
    r = p.call("tail", {"key": "t"})
    assert (r["asked"], r["given"]) == (65536, 65536)


def test_a_watch_sent_as_a_notification_sends_no_exit(side: Sidecar) -> None:
    """Issue 30, item 12: a watch sent without an id (a notification, never answered)
    still sent an exit notification (``"watch": null``) when its process ended."""
    p = side.peer
    sh = subprocess.Popen(["true"])
    sh.wait(10)
    gone = sh.pid  # reaped: the watch ends at once (outcome gone), exit or not
    p.send_raw(json.dumps({"jsonrpc": "2.0", "method": "watch",
                           "params": {"pid": gone}}).encode() + b"\n")
    p.call("hello")
    i = p.send("watch", {"pid": gone})
    ex = p.until(lambda o: o.get("method") == "exit")["params"]
    assert ex["watch"] == i, ex
    p.call("hello")
    assert [o["params"]["watch"] for o in p.seen if o.get("method") == "exit"] == [i]


@needs_output
def test_pipelined_writes_to_one_key_arrive_in_order_after_its_start(side: Sidecar) -> None:
    """docs/serve.md: requests about one key are carried out in the order they were
    read. Writes ran on up to four worker threads each: pipelined, they could reach
    the command out of order (1 run in 3 here), and a write pipelined after its
    key's start was refused (no_input: not running yet)."""
    p = side.peer
    blob = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "start", "params": {
        "key": "cat", "args": ["cat"], "stdin": "pipe"}}).encode() + b"\n"
    n = 400
    for k in range(n):
        blob += json.dumps({"jsonrpc": "2.0", "id": 2 + k, "method": "write", "params": {
            "key": "cat", "data_b64": base64.b64encode(b"%d\n" % k).decode()}}).encode() + b"\n"
    p.next_id = 2 + n
    p.send_raw(blob)
    for k in range(n + 1):
        r = p.response(1 + k)
        assert "error" not in r, r
    p.call("write", {"key": "cat", "data_b64": "", "eof": True})
    assert p.event("cat", "exited")["code"] == 0
    assert _text(_outputs(p, "cat")) == b"".join(b"%d\n" % k for k in range(n))


def test_terminate_ends_a_process_under_no_key_with_its_status(side: Sidecar) -> None:
    """Issue 31, item 5: ending one pid that is under no key took adopt + stop +
    remove. ``terminate`` {pid, start_time, grace, kill_timeout} is proctable's
    bounded terminate of that identity, answered with the status it ended with."""
    p = side.peer
    polite = subprocess.Popen(["sleep", "300"])
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; echo ok; exec sleep 300"],
                                stdout=subprocess.PIPE)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ok\n"
        a = proctable.identity(polite.pid)
        b = proctable.identity(stubborn.pid)
        assert a is not None and b is not None
        r = p.call("terminate", {"pid": a.pid, "start_time": a.start_time, "grace": 5})
        assert r["outcome"] == "exited" and r["signal"] == signal.SIGTERM
        assert r["exit"]["returncode"] == -signal.SIGTERM and r["code"] is None
        assert polite.wait(10) == -signal.SIGTERM
        r = p.call("terminate", {"pid": b.pid, "start_time": b.start_time, "grace": 0.2,
                                 "kill_timeout": 5})
        assert r["outcome"] == "exited" and r["signal"] == signal.SIGKILL
        assert stubborn.wait(10) == -signal.SIGKILL
    finally:
        for proc in (polite, stubborn):
            kill_identity(proctable.identity(proc.pid))
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


def test_terminate_refuses_a_pid_that_is_gone_or_reused(side: Sidecar) -> None:
    """Issue 31, item 5: a pid that is gone, or that names another process (another
    start time), is refused with no_such_process, and never signalled."""
    p = side.peer
    proc = subprocess.Popen(["sleep", "300"])
    try:
        ident = proctable.identity(proc.pid)
        assert ident is not None
        err = p.fails("terminate", {"pid": ident.pid, "start_time": ident.start_time + 1})
        assert err["code"] == -32006 and err["data"]["error"] == "no_such_process"
        assert err["data"]["pid"] == ident.pid
        assert ident.alive() and proc.poll() is None  # not signalled
        err = p.fails("terminate", {"pid": side.proc.pid, "start_time":
                                    side.ident.start_time})  # type: ignore[union-attr]
        assert err["code"] == -32602 and err["data"]["param"] == "pid"
        assert side.proc.poll() is None
        err = p.fails("terminate", {"pid": ident.pid})
        assert err["code"] == -32602 and err["data"]["param"] == "start_time"
    finally:
        kill_identity(proctable.identity(proc.pid))
        proc.wait(10)
    err = p.fails("terminate", {"pid": ident.pid, "start_time": ident.start_time})
    assert err["data"]["error"] == "no_such_process"


@needs_output
def test_list_says_when_each_key_last_got_input_and_its_last_bytes(side: Sidecar) -> None:
    """Issue 31, item 4: ``list`` gives per key the time of its last input and the
    last 16 bytes written to it (``last_input``, null before any), so a client's
    policy can ask whether the last thing typed was a Ctrl-C."""
    p = side.peer
    p.call("start", {"key": "cat", "args": ["cat"], "stdin": "pipe"})
    [row] = p.call("list")["keys"]
    assert row["last_input"] is None
    t0 = time.time()
    for data in (b"x" * 20, b"\x03"):
        p.call("write", {"key": "cat", "data_b64": base64.b64encode(data).decode()})
    [row] = p.call("list")["keys"]
    assert base64.b64decode(row["last_input"]["data_b64"]) == b"x" * 15 + b"\x03"
    assert t0 - 1 <= row["last_input"]["time"] <= time.time() + 1


def _fresh_request(p: Peer, timeout: float = 30.0) -> dict[str, Any]:
    return p.until(lambda o: o.get("method") == "fresh" and "id" in o, timeout)


def _answer(p: Peer, id_: Any, result: Any = None, error: Any = None) -> None:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_}
    if error is None:
        msg["result"] = result
    else:
        msg["error"] = error
    p.send_raw(json.dumps(msg).encode() + b"\n")


@needs_output
def test_fresh_ask_gets_each_rerun_its_args_from_the_client(side: Sidecar) -> None:
    """Issue 31, item 3: ``restart.fresh_args`` is one fixed list, so over the wire a
    policy could not mint a new id per clean exit. With ``restart.fresh: "ask"`` the
    sidecar asks the client that started the key (a ``fresh`` request {key,
    generation, args}, after that generation's exited and restarting) and reruns
    what it answers; null ends the key with gave_up."""
    p = side.peer
    p.call("start", {"key": "s", "args": ["sh", "-c", "echo first; exit 0"],
                     "restart": {"fresh": "ask", "fast_exit": 0}})
    args = ["sh", "-c", "echo first; exit 0"]
    for n in range(1, 6):
        req = _fresh_request(p)
        assert req["params"] == {"key": "s", "generation": n, "args": args}, req
        kinds = [(e["kind"], e["generation"]) for e in p.events("s")]
        assert kinds[-2:] == [("exited", n), ("restarting", n)], kinds
        args = ["sh", "-c", f"echo id-{n}; exit 0"]
        _answer(p, req["id"], args)
    req = _fresh_request(p)
    _answer(p, req["id"], None)
    gave = p.event("s", "gave_up")
    assert gave["generation"] == 6 and "stop" in gave["reason"]
    text = _text(_outputs(p, "s")).decode().split()
    assert text == ["first"] + [f"id-{n}" for n in range(1, 6)]
    assert not [o for o in p.seen if "id" in o and o.get("id") == req["id"]
                and "method" not in o], "a response is never answered"


@needs_output
def test_fresh_ask_without_an_answer_falls_back_and_a_late_answer_is_ignored(
        side: Sidecar) -> None:
    """Issue 31, item 3: the client's answer is waited for ``fresh_timeout`` seconds
    at most; without one the rerun is ``fresh_args`` if given, else the same args as
    the run that exited. A late answer changes nothing and is not answered."""
    p = side.peer
    p.call("start", {"key": "f", "args": ["sh", "-c", "echo orig; exit 0"],
                     "restart": {"fresh": "ask", "fresh_timeout": 0.3, "fast_exit": 0,
                                 "fresh_args": ["sh", "-c", "echo fixed; sleep 300"]}})
    late = _fresh_request(p)
    p.until(lambda o: o.get("method") == "event" and o["params"]["key"] == "f"
            and o["params"]["kind"] == "created" and o["params"]["generation"] == 2)
    _answer(p, late["id"], ["sh", "-c", "echo late"])
    _until_text(p, "f", b"fixed")
    p.call("start", {"key": "g", "args": ["sh", "-c", "echo same; exit 0"],
                     "restart": {"fresh": "ask", "fresh_timeout": 0.3, "fast_exit": 0}})
    _fresh_request(p)
    _fresh_request(p)  # the second rerun's: the first fell back to the same args
    p.call("stop", {"key": "g"})
    assert _text(_outputs(p, "g")).split()[:2] == [b"same", b"same"]
    p.call("stop", {"key": "f"})
    assert b"late" not in _text(_outputs(p, "f"))
    assert [o for o in p.seen if "error" in o] == []


def test_fresh_ask_answered_with_an_error_gives_up_saying_why(side: Sidecar) -> None:
    """Issue 31, item 3: an error answer (the client's handler failed) ends the key
    with gave_up, its reason carrying the client's message, as a Python fresh
    factory that raises does."""
    p = side.peer
    p.call("start", {"key": "e", "args": ["true"], "restart": {"fresh": "ask", "fast_exit": 0}})
    req = _fresh_request(p)
    _answer(p, req["id"], error={"code": -32000, "message": "no more ids"})
    gave = p.event("e", "gave_up")
    assert "no more ids" in gave["reason"]


def test_the_key_order_runs_steps_in_turn_after_their_start_and_forgets_what_is_done() -> None:
    """The per-key order of write, resize, signal, tail and members (docs/serve.md,
    "Ordering"), with plain futures: a step waits for the start read before it and
    holds no thread meanwhile; steps of one key run one at a time, in order; a key
    whose starts are done and whose steps ran holds nothing."""
    import concurrent.futures
    import threading

    from proctable.serve._order import _KeyOrder

    order = _KeyOrder()
    ran: list[str] = []
    pool = concurrent.futures.ThreadPoolExecutor(4)
    everything = threading.Event()

    b_ran = threading.Event()

    def step(name: str) -> Any:
        def run() -> None:
            ran.append(name)
            if name == "b0":
                b_ran.set()
            if len(ran) == 6:
                everything.set()
        return run
    try:
        submit = pool.submit
        started: concurrent.futures.Future[Any] = concurrent.futures.Future()
        order.gate("a", started)
        for n in range(3):
            order.run("a", step(f"a{n}"), submit, lambda exc: None)
        order.run("b", step("b0"), submit, lambda exc: None)  # another key: not held
        assert b_ran.wait(30)
        assert ran == ["b0"]  # a's wait for their start (they cannot have run)
        started.set_result(None)  # a's start answered: its steps go, in order
        order.run("a", step("a3"), submit, lambda exc: None)
        order.gate("c", started)  # done already: nothing to wait for, nothing kept
        order.run("c", step("c0"), submit, lambda exc: None)
        assert everything.wait(30)
        assert [r for r in ran if r.startswith("a")] == ["a0", "a1", "a2", "a3"]
        deadline = time.monotonic() + 30  # (the last step's turn ends after it ran)
        while (order._queues or order._busy) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert order._queues == {} and order._busy == set()
        idle: concurrent.futures.Future[Any] = concurrent.futures.Future()
        order.gate("d", idle)  # started, never written to
        idle.set_result(None)
        assert order._queues == {}
    finally:
        pool.shutdown()


@pytest.mark.parametrize("kind", ["file", "devnull"])
def test_requests_from_a_file_or_dev_null_on_stdin_are_served(tmp_path: Any, kind: str) -> None:
    """``proctable serve < requests.jsonl`` (stdin a regular file, or /dev/null)
    crashed with PermissionError: epoll refuses a regular file or a character
    device. Found by the review of issue 33's test timings; every request of the
    file is answered, then the end of the file ends the sidecar, cleanly."""
    if kind == "file":
        src = tmp_path / "requests.jsonl"
        src.write_text(
            '{"jsonrpc":"2.0","id":1,"method":"hello"}\n'
            '{"jsonrpc":"2.0","id":2,"method":"probe","params":{"pid":1}}\n'
            '{"jsonrpc":"2.0","id":3,"method":"nosuch"}\n')
        path = str(src)
    else:
        path = os.devnull
    with open(path, "rb") as stdin:
        r = subprocess.run([PY, "-m", "proctable", "serve"], stdin=stdin, capture_output=True,
                           timeout=60, check=False)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    answers = {m["id"]: m for m in map(json.loads, r.stdout.splitlines()) if "id" in m}
    if kind == "devnull":
        assert answers == {}
        return
    assert answers[1]["result"]["protocol"], answers[1]
    assert answers[2]["result"]["pid"] == 1, answers[2]
    assert answers[3]["error"]["code"] == -32601, answers[3]


@linux_only
def test_the_socket_path_appears_only_once_it_accepts(tmp_path: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that waits for the socket file and connects at once was refused
    (ECONNREFUSED) when it came between the sidecar's bind and its listen (once in a
    loaded run of the suite). The path is now linked in place once the socket listens;
    here a listen made slow shows it: the file is not there before."""
    import threading

    from proctable.serve._transport import bind_socket

    real_listen = socket.socket.listen

    def slow_listen(self: socket.socket, *args: Any) -> None:
        time.sleep(0.5)
        real_listen(self, *args)

    monkeypatch.setattr(socket.socket, "listen", slow_listen)
    path = str(tmp_path / "s.sock")
    made: list[socket.socket] = []
    t = threading.Thread(target=lambda: made.append(bind_socket(path)))
    t.start()
    try:
        assert wait_until(lambda: os.path.exists(path), 30)
        with socket.socket(socket.AF_UNIX) as c:
            c.connect(path)  # refused before: the file was there from bind on
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert [n for n in os.listdir(tmp_path) if n != "s.sock"] == []  # no temporary
    finally:
        t.join(30)
        for s in made:
            s.close()
