"""The verbs a supervisor's user reaches for: ``wait(key)``, ``signal(key, sig)``
(and their awaitable forms), and events a type checker narrows by kind."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

import proctable
from proctable import AsyncSupervisor, RestartPolicy, Supervisor
from proctable.supervise import (
    CreatedEvent,
    Event,
    ExitedEvent,
    OutputEvent,
)

from ._supervise import Recorder
from .conftest import wait_until


@pytest.fixture
def sup() -> Iterator[tuple[Supervisor, Recorder]]:
    rec = Recorder()
    s = Supervisor(on_event=rec, grace=1.0, kill_timeout=2.0)
    try:
        yield s, rec
    finally:
        s.close()


# --- wait ---------------------------------------------------------------------------------


def test_wait_gives_the_exit_status_of_the_current_generation(
        sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    s.start("k", ["sh", "-c", "exit 3"])
    status = s.wait("k", timeout=60)
    assert status is not None and status.code == 3
    # the same as its exited event says, and at once once it has ended
    rec.wait_for(lambda r: r.count("exited", "k") == 1)
    (ev,) = [e for e in rec.events if e.kind == "exited"]
    assert ev.exit == status and ev.generation == 1
    assert s.wait("k", timeout=0.01) == status
    with pytest.raises(KeyError):
        s.wait("nobody", timeout=1)


def test_wait_of_a_stopped_generation_gives_what_the_stop_did(
        sup: tuple[Supervisor, Recorder]) -> None:
    s, _rec = sup
    s.start("k", ["sleep", "600"])
    fut = s.submit_wait("k")
    assert not fut.done()
    stopped = s.stop("k")
    assert fut.result(timeout=60) == stopped
    assert stopped is not None and stopped.signal == signal.SIGTERM


def test_wait_is_for_the_generation_current_at_the_call(
        sup: tuple[Supervisor, Recorder], tmp_path: pathlib.Path) -> None:
    # Generation 1 exits 5, the restart (generation 2) runs on: a wait begun during
    # generation 1 answers for it, one begun afterwards waits for generation 2.
    s, rec = sup
    flag = tmp_path / "ran"
    gate = tmp_path / "go"
    cmd = (f'if [ -e {flag} ]; then exec sleep 600; fi; touch {flag}; '
           f'while [ ! -e {gate} ]; do sleep 0.01; done; exit 5')
    s.start("k", ["sh", "-c", cmd], restart=RestartPolicy(max_restarts=3))
    first = s.submit_wait("k")
    gate.touch()
    status = first.result(timeout=60)
    assert status is not None and status.code == 5
    rec.wait_for(lambda r: r.count("created", "k") == 2)
    with pytest.raises(TimeoutError):
        s.wait("k", timeout=0.05)
    assert s._exit_waits.get("k") is None  # a wait that timed out is forgotten


def test_wait_of_a_key_that_never_ran_is_none() -> None:
    with Supervisor() as s:
        with pytest.raises(FileNotFoundError):
            s.start("k", ["/nonexistent/command"])
        with pytest.raises(KeyError):
            s.wait("k")  # a start that failed leaves no key
        with pytest.raises(TypeError):
            s.wait("k", timeout="1")  # type: ignore[arg-type]


# --- signal -------------------------------------------------------------------------------


TRAP = 'trap "echo got; exit 7" USR1; echo ready; while :; do sleep 0.05; done'


def test_signal_reaches_the_keys_process_while_it_runs(
        sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    s.start("k", ["sh", "-c", TRAP], output="events")
    rec.wait_for(lambda r: b"ready" in b"".join(e.data or b"" for e in r.events))
    assert s.signal("k", signal.SIGUSR1) is True
    status = s.wait("k", timeout=60)
    assert status is not None and status.code == 7
    rec.wait_for(lambda r: r.count("exited", "k") == 1)
    assert b"got" in b"".join(e.data or b"" for e in rec.events if e.kind == "output")
    assert s.signal("k", signal.SIGUSR1) is False  # nothing runs under the key now
    with pytest.raises(KeyError):
        s.signal("nobody", signal.SIGTERM)
    with pytest.raises(ValueError):
        s.signal("k", 12345)
    with pytest.raises(TypeError):
        s.signal("k", "TERM")  # type: ignore[arg-type]


def test_signal_goes_to_the_root_not_to_the_rest_of_the_lineage(
        sup: tuple[Supervisor, Recorder]) -> None:
    s, _rec = sup
    s.start("k", ["sh", "-c", "sleep 600 & trap 'exit 0' TERM; wait"])
    lin = s.lineage("k")
    assert lin is not None
    wait_until(lambda: len(lin.members()) == 2)
    child = next(p for p in lin.members() if lin.root is not None and p.pid != lin.root.pid)
    assert s.signal("k", signal.SIGSTOP) is True
    wait_until(lambda: (r := proctable.read(lin.root.pid)) is not None  # type: ignore[union-attr]
               and r.state == "T")
    row = proctable.read(child.pid)
    assert row is not None and row.state != "T"
    assert s.signal("k", signal.SIGCONT) is True


# --- the asyncio face ---------------------------------------------------------------------


def test_async_wait_and_signal() -> None:
    async def main() -> tuple[object, object, bool, bool]:
        async with AsyncSupervisor() as sup:
            await sup.start("k", ["sh", "-c", TRAP])
            try:
                await sup.wait("k", timeout=0.05)
                timed_out = False
            except TimeoutError:
                timed_out = True
            sent = await sup.signal("k", signal.SIGUSR1)
            status = await sup.wait("k", timeout=60)
            again = await sup.wait("k")
            return status, again, sent, timed_out

    status, again, sent, timed_out = asyncio.run(main())
    assert timed_out and sent
    assert isinstance(status, proctable.ExitStatus) and status.code == 7 and again == status


# --- events a type checker narrows -------------------------------------------------------


def test_each_kind_is_its_own_class_and_reads_as_before(
        sup: tuple[Supervisor, Recorder]) -> None:
    s, rec = sup
    s.start("k", ["sh", "-c", "echo hi"], output="events")
    s.wait("k", timeout=60)
    rec.wait_for(lambda r: r.count("exited", "k") == 1)
    kinds = {e.kind: type(e) for e in rec.events}
    assert kinds["created"] is CreatedEvent and kinds["exited"] is ExitedEvent
    assert kinds["output"] is OutputEvent
    for e in rec.events:
        assert isinstance(e, Event)
        # every field still reads on every kind (None where the kind has none)
        assert all(hasattr(e, f.name) for f in dataclasses.fields(Event))
        back = pickle.loads(pickle.dumps(e))
        assert back == e and type(back) is type(e)
    made = Event("output", "k", 1, None, stream="stdout", data=b"x", time=1.0)
    assert type(made) is OutputEvent and made == OutputEvent("output", "k", 1, None,
                                                               stream="stdout", data=b"x",
                                                               time=1.0)
    assert type(dataclasses.replace(made, data=b"y")) is OutputEvent
    assert type(Event("a-kind-of-later", "k", 1, None)) is Event


GOOD = '''
import proctable
from proctable import AnyEvent


def on_event(ev: AnyEvent) -> bytes:
    if ev.kind == "output":
        return ev.data
    if ev.kind == "exited":
        return ev.status.encode()
    return b""


async def consume(sup: proctable.AsyncSupervisor) -> int:
    n = 0
    async for ev in sup.events():
        if ev.kind == "output":
            n += len(ev.data)
    return n


with proctable.Supervisor(on_event=on_event) as sup:
    pass
'''

BAD = '''
from proctable import AnyEvent


def on_event(ev: AnyEvent) -> bytes:
    return ev.data
'''


def test_mypy_strict_narrows_events_by_kind(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("mypy")
    (tmp_path / "good.py").write_text(textwrap.dedent(GOOD))
    (tmp_path / "bad.py").write_text(textwrap.dedent(BAD))
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        "--cache-dir", os.devnull, "good.py", "bad.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    # ev.data is bytes once ev.kind == "output"; not before
    assert [e.split(":")[0] for e in errors] == ["bad.py"], r.stdout + r.stderr
    assert '"bytes | None"' in errors[0] and "return-value" in errors[0]
