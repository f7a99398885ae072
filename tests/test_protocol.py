"""The JSON-lines protocol, consumed as another runtime would: from a child process,
line by line, while the command runs; every object against docs/protocol.md."""

from __future__ import annotations

import json
import os
import pathlib
import re
import select
import signal
import subprocess
import time
from typing import Any, Optional

import pytest

import proctable

from .conftest import PY, Procs, wait_until, wait_zombie

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "protocol.md"
needs_doc = pytest.mark.skipif(not DOC.exists(), reason="needs docs/ beside tests/")


def documented() -> dict[str, tuple[set[str], set[str]]]:
    """{object: (required fields, optional fields)} from the tables of docs/protocol.md."""
    out: dict[str, tuple[set[str], set[str]]] = {}
    names: list[str] = []
    for line in DOC.read_text().splitlines():
        if line.startswith("### "):
            head = line[4:]
            names = re.findall(r"`(\w+)`", head)
            if not names:  # "The status object", "The member end object"
                names = [re.sub(r"^The | object$", "", head).replace(" ", "_")]
            for n in names:
                out[n] = (set(), set())
            continue
        m = re.match(r"\| `(\w+)` \| ([^|]+) \|", line)
        if m and names:
            field, kind = m.groups()
            for n in names:
                out[n][1 if "optional" in kind else 0].add(field)
    return out


SCHEMA: dict[str, tuple[set[str], set[str]]] = documented() if DOC.exists() else {}


def check(obj: dict[str, Any], kind: Optional[str] = None) -> None:
    """obj has every documented field of its type and no undocumented one."""
    kind = kind or obj["type"]
    assert kind in SCHEMA, f"type {kind!r} is not documented"
    required, optional = SCHEMA[kind]
    keys = set(obj)
    assert required <= keys, f"{kind}: missing {required - keys}"
    assert keys <= required | optional, f"{kind}: undocumented {keys - required - optional}"
    if kind not in ("status", "member_end"):
        assert obj["v"] == 1
    for name in ("status", "exit"):
        if isinstance(obj.get(name), dict):
            check(obj[name], "status")
    if kind == "teardown":
        for m in obj["members"]:
            check(m, "member_end")


class Lines:
    """A child's stream read line by line, each read bounded, as a sidecar's reader would."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.eof = False

    def next(self, timeout: float = 60.0) -> Optional[bytes]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            if self.eof:
                return None
            left = deadline - time.monotonic()
            assert left > 0, f"no line within {timeout}s (have {self.buf!r})"
            r, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if r:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    self.eof = True
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def obj(self, timeout: float = 60.0) -> Optional[dict[str, Any]]:
        line = self.next(timeout)
        if line is None:
            return None
        o: dict[str, Any] = json.loads(line)
        check(o)
        return o

    def until(self, pred: Any, timeout: float = 60.0,
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Objects up to the first that pred accepts: (that one, those before it)."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            o = self.obj(max(0.1, deadline - time.monotonic()))
            assert o is not None, f"the stream ended first: {seen}"
            if pred(o):
                return o, seen
            seen.append(o)


def alive(pid: int, start: int) -> bool:
    row = proctable.read(pid)
    return row is not None and row.start_time == start and row.state != "Z"


# --- the schema itself -------------------------------------------------------------------


@needs_doc
def test_the_protocol_page_documents_every_object() -> None:
    for kind in ("proc", "denied", "probe", "exit", "started", "joined", "escaped", "left",
                 "signal", "exited", "teardown", "restarting", "gave_up", "end", "status",
                 "member_end"):
        assert kind in SCHEMA and SCHEMA[kind][0], kind
    for kind, (required, _) in SCHEMA.items():
        if kind not in ("status", "member_end"):
            assert {"v", "type"} <= required, kind


@needs_doc
def test_ps_and_exit_objects_match_the_page(procs: Procs) -> None:
    z = procs.py("import os; os._exit(4)")
    wait_zombie(z.pid)
    r = subprocess.run([PY, "-m", "proctable", "ps", "--json", "--tree", "-K", "-o",
                        "pid,user,tty,args"], capture_output=True, text=True, timeout=60,
                       check=True)
    objs = [json.loads(x) for x in r.stdout.splitlines()]
    for o in objs:
        check(o)
    (zo,) = [o for o in objs if o["type"] == "proc" and o["pid"] == z.pid]
    assert zo["exit"]["code"] == 4 and zo["args"] is None  # a zombie has no command line
    r = subprocess.run([PY, "-m", "proctable", "exit", "--json", str(z.pid), str(os.getpid())],
                       capture_output=True, text=True, timeout=60, check=False)
    assert [json.loads(x)["state"] for x in r.stdout.splitlines()] == ["exited", "running"]
    for x in r.stdout.splitlines():
        check(json.loads(x))
    assert z.wait(timeout=10) == 4


# --- watch --json, consumed while it runs --------------------------------------------------


@needs_doc
def test_watch_json_is_read_line_by_line_as_exits_happen(procs: Procs) -> None:
    a = procs.popen(["sleep", "71"])
    b = procs.py("import os, sys; sys.stdin.readline(); os._exit(3)", stdin=subprocess.PIPE)
    gone = procs.py("pass")
    gone.wait(timeout=30)
    watch = procs.popen([PY, "-m", "proctable", "watch", "--json", "--timeout", "120",
                         str(a.pid), str(b.pid), str(gone.pid)], stdout=subprocess.PIPE)
    assert watch.stdout is not None and b.stdin is not None
    lines = Lines(watch.stdout.fileno())
    if proctable.read(gone.pid) is None:  # (unless the pid was reused at once)
        first = lines.obj()
        assert first is not None and first["pid"] == gone.pid and first["outcome"] == "gone"
    a.kill()
    got = lines.obj()
    assert got is not None and got["pid"] == a.pid and got["name"] == "sleep"
    assert got["outcome"] == "exited" and got["status"]["signal_name"] == "SIGKILL"
    # a's line came while b still runs: it was written when a exited, not at the end.
    assert b.poll() is None
    b.stdin.write(b"\n")
    b.stdin.flush()
    got = lines.obj()
    assert got is not None and got["pid"] == b.pid and got["status"]["returncode"] == 3
    assert got["time"] >= time.time() - 120
    assert lines.obj() is None  # and then the stream ends
    assert watch.wait(timeout=30) == 1  # one pid was gone already
    a.wait(timeout=10)
    b.wait(timeout=10)


# --- run --events, consumed while it runs --------------------------------------------------

_CONTROLLED = r"""
import subprocess, sys
print("ready", flush=True)
for line in sys.stdin:
    word = line.strip()
    if word == "escape":
        p = subprocess.Popen(["sleep", "300"], start_new_session=True)
        print("escaped", p.pid, flush=True)
    elif word == "child":
        p = subprocess.Popen(["sleep", "301"])
        print("child", p.pid, flush=True)
    elif word == "exit":
        sys.exit(5)
"""


@needs_doc
@pytest.mark.parametrize("mode", ["auto", "subreaper"])
def test_run_events_are_read_line_by_line_while_the_command_runs(procs: Procs,
                                                                  mode: str) -> None:
    run = procs.popen([PY, "-m", "proctable", "run", "--grace", "2", "--mode", mode,
                       "--events", "-", "--", PY, "-c", _CONTROLLED],
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert run.stdin is not None and run.stdout is not None and run.stderr is not None
    events = Lines(run.stdout.fileno())
    said = Lines(run.stderr.fileno())  # with --events -, the command's stdout is here

    def tell(word: str) -> list[str]:
        assert run.stdin is not None
        run.stdin.write(word.encode() + b"\n")
        run.stdin.flush()
        line = said.next()
        assert line is not None
        return line.decode().split()

    started = events.obj()
    assert started is not None and started["type"] == "started" and started["run"] == 1
    command = (started["pid"], started["start_time"])
    assert said.next() == b"ready"

    # A plain child: joined, escaped nothing.
    _, child = tell("child")
    joined, _ = events.until(lambda o: o["type"] == "joined" and o["pid"] == int(child))
    assert joined["escaped"] == [] and joined["sid"] is not None
    # A setsid escape: joined in another session (or joined, then escaped).
    _, esc = tell("escape")
    out, _ = events.until(lambda o: o["pid"] == int(esc) and "session" in o.get(
        "escaped", []))
    esc_id = (int(esc), out["start_time"])
    assert out["type"] in ("joined", "escaped")
    # Both lines came while the command still runs: before we ask it to exit.
    assert alive(*command) and alive(*esc_id)

    run.stdin.write(b"exit\n")
    run.stdin.flush()
    exited, _ = events.until(lambda o: o["type"] == "exited")
    assert exited["exit_code"] == 5 and exited["status"]["code"] == 5
    assert exited["forced"] is False and (exited["pid"], exited["start_time"]) == command
    teardown = events.obj()
    assert teardown is not None and teardown["type"] == "teardown", teardown
    ends = {(m["pid"], m["start_time"]): m for m in teardown["members"]}
    assert ends[esc_id]["ended"] == "term" and ends[esc_id]["outlived"] is True
    assert ends[esc_id]["status"] is None or ends[esc_id]["status"]["signal_name"] == "SIGTERM"
    assert teardown["error"] is None and teardown["time"] >= exited["time"]
    end = events.obj()
    assert end is not None and end["type"] == "end" and end["exit_code"] == 5
    assert events.obj() is None
    assert run.wait(timeout=60) == 5
    wait_until(lambda: not alive(*esc_id), timeout=10)


@needs_doc
def test_run_events_to_a_file_keep_stdout_for_the_command(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "events.jsonl"
    r = subprocess.run([PY, "-m", "proctable", "run", "--events", str(path), "--", "sh", "-c",
                        "echo hello; exit 0"], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hello\n"
    objs = [json.loads(x) for x in path.read_text().splitlines()]
    for o in objs:
        check(o)
    assert objs[0]["type"] == "started"
    assert [o["type"] for o in objs][-3:] == ["exited", "teardown", "end"]


@needs_doc
def test_run_events_end_even_when_the_command_cannot_start(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "events.jsonl"
    r = subprocess.run([PY, "-m", "proctable", "run", "--events", str(path), "--",
                        "/nonexistent/cmd"], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 127
    (end,) = [json.loads(x) for x in path.read_text().splitlines()]
    check(end)
    assert end["type"] == "end" and end["exit_code"] == 127 and "no such file" in end["error"]
    assert end["runs"] == 0


_STUBBORN = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(300)
"""


@needs_doc
def test_run_events_an_interrupt_not_obeyed(procs: Procs) -> None:
    run = procs.popen([PY, "-m", "proctable", "run", "--grace", "0.5", "--events", "-", "--",
                       PY, "-c", _STUBBORN], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert run.stdout is not None and run.stderr is not None
    events = Lines(run.stdout.fileno())
    assert Lines(run.stderr.fileno()).next() == b"ready"
    started = events.obj()
    assert started is not None and started["type"] == "started"
    run.send_signal(signal.SIGTERM)
    sig, _ = events.until(lambda o: o["type"] == "signal")
    assert sig["signal_name"] == "SIGTERM" and sig["forwarded"] is True
    teardown, _ = events.until(lambda o: o["type"] == "teardown")
    ends = {m["pid"]: m for m in teardown["members"]}
    assert ends[started["pid"]]["ended"] == "kill"
    exited = events.obj()  # forced: the teardown ended it, so exited comes after
    assert exited is not None and exited["type"] == "exited" and exited["forced"] is True
    assert exited["status"]["signal_name"] == "SIGKILL" and exited["exit_code"] == 137
    end = events.obj()
    assert end is not None and end["type"] == "end"
    assert run.wait(timeout=60) == end["exit_code"]


@needs_doc
def test_run_events_restarting_and_gave_up() -> None:
    r = subprocess.run([PY, "-m", "proctable", "run", "--restart", "always", "--events", "-",
                        "--", "true"], capture_output=True, text=True, timeout=120, check=False)
    objs = [json.loads(x) for x in r.stdout.splitlines()]
    for o in objs:
        check(o)
    kinds = [o["type"] for o in objs]
    assert kinds.count("started") == 5 and kinds.count("restarting") == 4
    assert kinds[-2:] == ["gave_up", "end"]
    assert [o["run"] for o in objs if o["type"] == "started"] == [1, 2, 3, 4, 5]
    assert objs[-1]["runs"] == 5 and objs[-1]["exit_code"] == r.returncode == 0
