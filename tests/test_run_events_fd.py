"""``run --events`` to an inherited fd: a pipe, a socketpair, a file, written to as it is."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from typing import Any

import pytest

PY = sys.executable


def _lines(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(x) for x in data.splitlines()]


def _run(target_fd: int, use_flag: bool, code: int = 4) -> subprocess.Popen[bytes]:
    opt = ["--events-fd", str(target_fd)] if use_flag else ["--events", f"/dev/fd/{target_fd}"]
    return subprocess.Popen([PY, "-m", "proctable", "run", *opt, "--", "sh", "-c",
                             f"echo out; exit {code}"], pass_fds=[target_fd],
                            stdout=subprocess.PIPE)


def _read_all(fd: int) -> bytes:
    out = b""
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return out
        out += chunk


@pytest.mark.parametrize("use_flag", [True, False])
@pytest.mark.parametrize("kind", ["socketpair", "pipe", "file"])
def test_events_go_to_the_inherited_fd_whatever_it_is(kind: str, use_flag: bool) -> None:
    if kind == "socketpair":
        a, b = socket.socketpair()
        r, w = a.detach(), b.detach()
    elif kind == "pipe":
        r, w = os.pipe()
    else:
        w = os.open(tempfile.mkdtemp(prefix="pt-ev-") + "/ev", os.O_RDWR | os.O_CREAT, 0o600)
        r = -1
    try:
        p = _run(w, use_flag)
        out, _ = p.communicate(timeout=60)
        if kind == "file":
            os.lseek(w, 0, os.SEEK_SET)
            data = _read_all(w)
        else:
            os.close(w)
            w = -1
            data = _read_all(r)
        objs = _lines(data)
        assert [o["type"] for o in objs] == ["started", "exited", "teardown", "end"]
        assert objs[1]["exit_code"] == 4 and objs[-1]["exit_code"] == 4
        assert p.returncode == 4
        assert out == b"out\n"  # the command's stdout stays where it was
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)


def test_a_bad_fd_is_a_usage_error_before_anything_runs() -> None:
    p = subprocess.run([PY, "-m", "proctable", "run", "--events-fd", "97", "--", "true"],
                       capture_output=True, timeout=60, check=False)
    assert p.returncode == 2
    assert b"--events /dev/fd/97" in p.stderr
    p = subprocess.run([PY, "-m", "proctable", "run", "--events", "-", "--events-fd", "1",
                        "--", "true"], capture_output=True, timeout=60, check=False)
    assert p.returncode == 2


def test_without_end_the_reader_knows_proctable_did_not_finish() -> None:
    """proctable killed mid-run: the stream stops after `started` with no `end`, and
    proctable's own wait status is a signal, which no command's exit code is."""
    r, w = os.pipe()
    try:
        p = subprocess.Popen([PY, "-m", "proctable", "run", "--events-fd", str(w), "--",
                              "sleep", "300"], pass_fds=[w])
        os.close(w)
        w = -1
        first = b""
        while b"\n" not in first:
            first += os.read(r, 4096)
        assert json.loads(first.splitlines()[0])["type"] == "started"
        p.kill()
        assert p.wait(30) == -9
        rest = first + _read_all(r)
        types = [o["type"] for o in _lines(rest)]
        assert "end" not in types and "exited" not in types
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)
