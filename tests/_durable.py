"""Scaffolding for the durable-session tests: a state directory that is swept and
checked at the end, a supervisor in a child process (to SIGKILL it), and the
stitching of one session's output from events and replays by their offsets."""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

import proctable
from proctable import _pidfd
from proctable.supervise._durable import MARKER

PY = sys.executable


def marked(names: Optional[set[str]] = None) -> list[tuple[int, int, str]]:
    """(pid, start time, session name) of every live process carrying a session
    marker (of one of names, when given). A name is a session's own (the same in
    every state directory that has its key and generation) or, as session_names()
    and qualified() give them, "<state directory's id>:<name>", which sets apart
    the sessions of two tests that run at once with the same keys."""
    out = []
    me = os.getpid()
    for p in proctable.snapshot():
        if p.pid == me or p.state in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                data = f.read()
        except OSError:
            continue
        for item in data.split(b"\0"):
            if item.startswith(MARKER.encode() + b"="):
                # (the value: the state directory's id, ":", the session's name)
                value = item.split(b"=", 1)[1].decode()
                name = value.rsplit(":", 1)[-1]
                if names is None or name in names or value in names:
                    again = proctable.read(p.pid)
                    if again is not None and again.start_time == p.start_time:
                        out.append((p.pid, p.start_time, name))
                break
    return out


def _dir_id(state: Path) -> Optional[str]:
    try:
        return (state / "id").read_text().strip() or None
    except OSError:
        return None


def qualified(state: Path, names: set[str]) -> set[str]:
    """names as marked() matches them for this directory's sessions only."""
    ident = _dir_id(state)
    return names if ident is None else {f"{ident}:{n}" for n in names}


def session_names(state: Path) -> set[str]:
    """Every session the directory knows of (its records and its sockets), each as
    "<directory's id>:<name>" (see marked())."""
    names: set[str] = set()
    keys = state / "keys"
    if keys.is_dir():
        for f in keys.iterdir():
            try:
                rec = json.loads(f.read_bytes())
                s = rec.get("session")
                if s:
                    names.add(s["name"])
            except (OSError, ValueError, AttributeError, KeyError, TypeError):
                continue
    sessions = state / "sessions"
    if sessions.is_dir():
        names |= {f.name.rsplit(".", 1)[0] for f in sessions.iterdir()
                  if f.suffix in (".sock", ".end")}
    return qualified(state, names)


def helpers_of(state: Path) -> list[proctable.Identity]:
    """The keepers and guards the records name that still run as such."""
    out = []
    keys = state / "keys"
    if not keys.is_dir():
        return out
    for f in keys.iterdir():
        try:
            s = json.loads(f.read_bytes()).get("session") or {}
        except (OSError, ValueError, AttributeError):
            continue
        for role in ("keeper", "session"):
            v = s.get(role)
            if v:
                row = proctable.read(v[0])
                if row is not None and row.start_time == v[1] and row.state != "Z" \
                        and row.name in ("pt-keeper", "pt-session"):
                    out.append(proctable.Identity(v[0], v[1]))
    return out


def helpers_in(state: Path) -> list[proctable.Identity]:
    """Every live pt-keeper and pt-session that holds this directory's sessions/
    folder open (each keeps it as its --dir-fd), whatever the records say: a helper
    no record names any more is found too."""
    try:
        want = os.stat(state / "sessions")
    except OSError:
        return []
    out = []
    for p in proctable.snapshot():
        if p.name not in ("pt-keeper", "pt-session") or p.state in ("Z", "X"):
            continue
        try:
            fds = os.listdir(f"/proc/{p.pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{p.pid}/fd/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
                again = proctable.read(p.pid)
                if again is not None and again.start_time == p.start_time:
                    out.append(proctable.Identity(p.pid, p.start_time))
                break
    return out


def kill_pinned(ident: proctable.Identity) -> None:
    try:
        fd = _pidfd.open_pidfd(ident.pid)
    except ProcessLookupError:
        return
    try:
        _pidfd.signal_pinned(ident.pid, ident.start_time, fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def wait_gone(idents: list[proctable.Identity], timeout: float = 15.0) -> list[int]:
    """Wait until every identity has ended; the pids of those that have not."""
    deadline = time.monotonic() + timeout
    left = list(idents)
    while left and time.monotonic() < deadline:
        left = [i for i in left if (r := proctable.read(i.pid)) is not None
                and r.start_time == i.start_time and r.state not in ("Z", "X")]
        if left:
            time.sleep(0.02)
    return [i.pid for i in left]


def cgroups_of(state: Path) -> list[str]:
    """The lineage cgroups the directory's records name."""
    out = []
    keys = state / "keys"
    if keys.is_dir():
        for f in keys.iterdir():
            try:
                s = json.loads(f.read_bytes()).get("session") or {}
            except (OSError, ValueError, AttributeError):
                continue
            cg = s.get("cgroup")
            if isinstance(cg, str) and os.path.basename(cg).startswith("proctable-"):
                out.append(cg)
    return out


def sweep(state: Path) -> list[str]:
    """End whatever the directory's sessions left (SIGKILL by identity: their helpers
    first, then anything carrying their markers; then the lineage cgroups their
    records name are removed, once empty) and say what there was."""
    found = []
    names = session_names(state)
    cgroups = cgroups_of(state)
    for ident in {*helpers_of(state), *helpers_in(state)}:
        found.append(f"helper {ident.pid}")
        kill_pinned(ident)
    for pid, start, name in marked(names):
        found.append(f"{pid} ({name})")
        kill_pinned(proctable.Identity(pid, start))
    for cg in cgroups:
        for _ in range(100):
            try:
                os.rmdir(cg)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)
    return found


def state_dir(tmp_path: Path) -> Iterator[Path]:
    """The body of the ``state`` fixture: a fresh state directory (0700); at the end,
    nothing of its sessions may run: anything left is killed by identity and fails
    the test."""
    path = tmp_path / "state"
    os.mkdir(path, 0o700)
    yield path
    left = sweep(path)
    deadline = time.monotonic() + 10
    while sweep(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"left running by the test: {left}"


CHILD = r"""
import base64, json, os, sys, time
import proctable
from proctable import Supervisor
state, plan, log = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
out = open(log, "a", buffering=1)
def on_event(ev):
    out.write(json.dumps({"kind": ev.kind, "key": ev.key, "generation": ev.generation,
        "status": ev.status, "stream": ev.stream, "offset": ev.offset,
        "dropped": ev.dropped, "raw": None if ev.exit is None else ev.exit.raw,
        "data": base64.b64encode(ev.data or b"").decode(),
        "pid": None if ev.identity is None else ev.identity.pid}) + "\n")
sup = Supervisor(on_event=on_event, state_dir=state, **plan.get("options", {}))
for s in plan["starts"]:
    kw = dict(s.get("kw", {}))
    if "pty" in kw:
        kw["pty"] = tuple(kw["pty"])
    if "restart" in kw:
        kw["restart"] = proctable.RestartPolicy(**kw["restart"])
    sup.start(s["key"], s["args"], **kw)
for w in plan.get("writes", []):
    sup.write(w["key"], w["data"].encode())
sup.flush_events()
print("ready", flush=True)
time.sleep(3600)
"""


class ChildSupervisor:
    """A durable supervisor in a child process (a session of its own), whose events
    go to a file as JSON lines: SIGKILL it to test what outlives it."""

    def __init__(self, state: Path, plan: dict[str, Any], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen([PY, "-c", CHILD, str(state), json.dumps(plan), str(log)],
                                     stdout=subprocess.PIPE, start_new_session=True)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 120)  # bounded
        line = self.proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self.kill()
            pytest.fail(f"the child supervisor did not start: {line!r}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a line cut by the kill
            ev["data"] = base64.b64decode(ev["data"])
            out.append(ev)
        return out


class Stitch:
    """One session's output, put together from pieces by their offsets, as an app
    that stored its last offset does: a byte is taken once, at its offset; a gap
    is told by ``dropped``."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.dropped = 0
        self.dup_bytes = 0

    @property
    def end(self) -> int:
        return len(self.data) + self.dropped

    def add(self, offset: int, data: bytes, dropped: int = 0) -> None:
        if offset > self.end:
            assert dropped >= offset - self.end or dropped == 0, (offset, self.end, dropped)
            self.dropped += offset - self.end
        skip = self.end - offset
        if skip > 0:
            self.dup_bytes += min(skip, len(data))
        self.data += data[max(0, skip):]
