"""A test client of ``proctable serve``: a real sidecar process, spoken to by the wire only."""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

import pytest

import proctable

from ._lineage import kill_identity

__all__ = ["Peer", "Sidecar", "kill"]


def kill(ident: proctable.Identity) -> None:
    """SIGKILL ident (a test's own process) by pidfd, only while its pid still has that
    start time."""
    now = proctable.identity(ident.pid)
    if now is not None and now.start_time == ident.start_time:
        kill_identity(now)

PY = sys.executable


class Peer:
    """One connection: send requests, read responses and notifications as they come."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd = rfd
        self.wfd = wfd
        self.buf = b""
        self.seen: list[dict[str, Any]] = []  # every object read, in order
        self.keep = True  # False: output notifications are not kept in seen (big streams)
        self.sink: Any = None  # a callable given every object read, as it is read
        self.next_id = 1

    def send_raw(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            _, w, _ = select.select([], [self.wfd], [], 30)
            assert w, "the sidecar does not read"
            n = os.write(self.wfd, view[: 1 << 16])
            view = view[n:]

    def send(self, method: str, params: Optional[dict[str, Any]] = None) -> int:
        i = self.next_id
        self.next_id += 1
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": i, "method": method}
        if params is not None:
            msg["params"] = params
        self.send_raw(json.dumps(msg).encode() + b"\n")
        return i

    def read(self, timeout: float = 30.0) -> dict[str, Any]:
        """The next object (fails after timeout)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no line from the sidecar within {timeout}s (have {self.buf!r})")
            r, _, _ = select.select([self.rfd], [], [], left)
            if r:
                chunk = os.read(self.rfd, 1 << 16)
                if not chunk:
                    pytest.fail(f"the sidecar closed the stream (have {self.buf!r})")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        obj: dict[str, Any] = json.loads(line)
        p = obj.get("params")
        if obj.get("method") == "output" and "size" in p and "data_b64" not in p:
            p["data"] = self._exactly(p["size"], deadline)  # a binary frame's bytes
        if self.keep or obj.get("method") != "output":
            self.seen.append(obj)
        if self.sink is not None:
            self.sink(obj)
        return obj

    def _exactly(self, n: int, deadline: float) -> bytes:
        parts = [self.buf[:n]]
        have = len(parts[0])
        self.buf = self.buf[n:]
        while have < n:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"a binary frame's {n} bytes did not come (have {have})")
            r, _, _ = select.select([self.rfd], [], [], left)
            if r:
                chunk = os.read(self.rfd, 1 << 20)
                if not chunk:
                    pytest.fail(f"the sidecar closed the stream in a frame ({have} of {n})")
                parts.append(chunk[:n - have])
                self.buf = chunk[n - have:]
                have += len(parts[-1])
        return b"".join(parts)

    @staticmethod
    def data(params: dict[str, Any]) -> bytes:
        """An output notification's bytes, whichever form it came in."""
        if "data" in params:
            return bytes(params["data"])
        return base64.b64decode(params["data_b64"])

    def until(self, pred: Any, timeout: float = 30.0) -> dict[str, Any]:
        """Read until an object that pred accepts; that object."""
        deadline = time.monotonic() + timeout
        while True:
            obj = self.read(max(0.01, deadline - time.monotonic()))
            if pred(obj):
                return obj

    def response(self, i: int, timeout: float = 30.0) -> dict[str, Any]:
        """The response to request i (read already, or the next one that comes)."""
        for o in self.seen:
            if o.get("id") == i and "method" not in o:
                return o
        return self.until(lambda o: o.get("id") == i and "method" not in o, timeout)

    def call(self, method: str, params: Optional[dict[str, Any]] = None,
             timeout: float = 30.0) -> Any:
        """The result (fails the test on an error response)."""
        r = self.response(self.send(method, params), timeout)
        assert "error" not in r, r
        return r["result"]

    def fails(self, method: str, params: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        r = self.response(self.send(method, params))
        assert "error" in r, r
        err: dict[str, Any] = r["error"]
        return err

    def events(self, key: Optional[str] = None) -> list[dict[str, Any]]:
        return [o["params"] for o in self.seen if o.get("method") == "event"
                and (key is None or o["params"]["key"] == key)]

    def event(self, key: str, kind: str, timeout: float = 30.0) -> dict[str, Any]:
        for p in self.events(key):
            if p["kind"] == kind:
                return p
        obj = self.until(lambda o: o.get("method") == "event" and o["params"]["key"] == key
                         and o["params"]["kind"] == kind, timeout)
        params: dict[str, Any] = obj["params"]
        return params

    def members(self, key: str, n: int, timeout: float = 15.0) -> list[proctable.Identity]:
        """Wait until key's lineage has at least n members; their identities."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.call("members", {"key": key})["members"]
            if len(rows) >= n:
                return [proctable.Identity(r["pid"], r["start_time"]) for r in rows]
            if time.monotonic() > deadline:
                pytest.fail(f"key {key} has {len(rows)} members, wanted {n}")
            time.sleep(0.02)


class Sidecar:
    """``proctable serve`` as a child: over its stdio, or on a socket in a 0700 dir."""

    def __init__(self, transport: str = "stdio", *args: str) -> None:
        self.transport = transport
        self.dir = tempfile.mkdtemp(prefix="pt-serve-")
        self.path = os.path.join(self.dir, "s.sock")
        cmd = [PY, "-m", "proctable", "serve", "--grace", "1", *args]
        if transport == "socket":
            cmd += ["--socket", self.path]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.ident = proctable.identity(self.proc.pid)
        self.socks: list[socket.socket] = []
        if transport == "stdio":
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.peer = Peer(self.proc.stdout.fileno(), self.proc.stdin.fileno())
        else:
            self.peer = self.connect()

    def connect(self) -> Peer:
        deadline = time.monotonic() + 30
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                s.close()
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"no socket: {self.proc.stderr.read() if self.proc.stderr else ''}")
                time.sleep(0.02)
        self.socks.append(s)
        return Peer(s.fileno(), s.fileno())

    def end_input(self) -> None:
        """stdio: close its stdin (EOF)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        """Clean up: SIGTERM (it closes every key), then SIGKILL as a last resort."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                kill_identity(self.ident)
                self.proc.wait(10)
        for s in self.socks:
            s.close()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.rmdir(self.dir)
