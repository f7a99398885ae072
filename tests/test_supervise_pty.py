"""Keys on a pseudo-terminal: ``start(..., pty=(rows, cols))``, ``write``, ``resize``,
and a ``remove()`` that ends the whole session (jobs that ignore SIGHUP included),
checked by scanning the process table, not by asking the supervisor.

The shell's answers are computed (``echo T$((1+1))`` prints ``T2``), so the
terminal's echo of the typed line never matches what a test waits for.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Hashable
from typing import Optional

import pytest

import proctable
from proctable import NoInput, RestartPolicy, Supervisor
from proctable.supervise import Event

from ._supervise import Recorder, left_running, marked_env, running_marked
from .test_supervise_output import check_order, fds_back_to, output_of, settled_fds


class Screen(Recorder):
    """The events, and what the key's terminal showed so far."""

    def __init__(self) -> None:
        super().__init__()
        self.shown = bytearray()

    def __call__(self, ev: Event) -> None:
        if ev.kind == "output":
            assert ev.stream == "pty", ev
            with self.cond:
                self.shown += ev.data or b""
        super().__call__(ev)

    def wait_shown(self, text: bytes, timeout: float = 30.0) -> None:
        self.wait_for(lambda r: text in self.shown, timeout)


def test_a_shell_on_a_pty_its_size_input_and_ctrl_c() -> None:
    scr = Screen()
    with Supervisor(on_event=scr, grace=2.0) as sup:
        sup.start("sh", ["sh"], pty=(24, 80), env={**os.environ, "PS1": "$ "})
        sup.write("sh", b"test -t 0 && test -t 1 && echo T$((1+1))\n")
        scr.wait_shown(b"T2")
        sup.write("sh", b"echo S$((1+1)) $(stty size)\n")
        scr.wait_shown(b"S2 24 80")
        sup.resize("sh", 40, 120)
        sup.write("sh", b"echo S$((2+1)) $(stty size)\n")
        scr.wait_shown(b"S3 40 120")
        sup.write("sh", b"read line; echo \"got:$line\"\n")
        sup.write("sh", b"hello there\n")
        scr.wait_shown(b"got:hello there")
        # Ctrl-C reaches the foreground job as SIGINT through the line discipline.
        sup.write("sh", b"trap 'exit 42' INT; echo R$((1+1)); while :; do sleep 0.1; done\n")
        scr.wait_shown(b"R2")
        sup.write("sh", b"\x03")
        scr.wait_for(lambda r: r.count("exited", "sh") == 1)
        ev = scr.of("sh")[-1]
        assert ev.kind == "exited" and ev.status == "exited", ev
        assert ev.exit is not None and ev.exit.code == 42
        with pytest.raises(NoInput):
            sup.write("sh", b"echo too late\n")
        with pytest.raises(NoInput):
            sup.resize("sh", 10, 10)
        assert b"R2" in sup.tail("sh")
    check_order(scr.events)
    assert output_of(scr.events, "sh", 1, "pty") == bytes(scr.shown)


def test_resize_sends_sigwinch_to_the_foreground_job() -> None:
    scr = Screen()
    with Supervisor(on_event=scr) as sup:
        sup.start("w", ["sh", "-c", "trap 'echo W$((1+1)) $(stty size)' WINCH; "
                        "echo R$((1+1)); while :; do sleep 0.1; done"], pty=(24, 80))
        scr.wait_shown(b"R2")
        sup.resize("w", 30, 90)
        scr.wait_shown(b"W2 30 90")


def test_close_stdin_on_a_pty_writes_eof() -> None:
    scr = Screen()
    with Supervisor(on_event=scr) as sup:
        sup.start("cat", ["cat"], pty=(24, 80))
        sup.write("cat", b"abc\n")
        scr.wait_shown(b"abc\r\nabc\r\n")  # the echo, then cat's copy (ONLCR: \r\n)
        sup.close_stdin("cat")
        scr.wait_for(lambda r: r.count("exited", "cat") == 1)
        ev = scr.of("cat")[-1]
        assert ev.exit is not None and ev.exit.code == 0


def test_remove_ends_the_whole_session_jobs_that_ignore_sighup_included(
        request: pytest.FixtureRequest) -> None:
    tag = f"pty-session-{os.getpid()}-{request.node.name}"
    scr = Screen()
    # The table reader's fds are all there from here on: reader() loads the BPF
    # reader now where it can (a second snapshot() would start that load during the
    # test, and its fds would count as a leak; it did, alone or in another order).
    proctable.reader()
    assert running_marked(tag) == {}
    before = settled_fds()
    with Supervisor(on_event=scr, grace=1.0) as sup:
        sup.start("sh", ["sh"], pty=(24, 80), env={**marked_env(tag), "PS1": "$ "})
        sup.write("sh", b"nohup sleep 300 >/dev/null 2>&1 &\n")
        sup.write("sh", b"setsid sleep 301 >/dev/null 2>&1 &\n")
        sup.write("sh", b"(trap '' HUP TERM; exec sleep 302) &\n")
        sup.write("sh", b"echo J$((1+1))\n")
        scr.wait_shown(b"J2")
        shell_and_jobs = threading.Event()

        def four() -> bool:
            n = sum(len(p) for p in running_marked(tag).values())
            if n >= 4:
                shell_and_jobs.set()
            return shell_and_jobs.is_set()

        scr.wait_for(lambda r: four(), poll=0.05)  # the table, not the events
        sup.remove("sh")  # the shell's SIGHUP alone would leave all three jobs running
        assert left_running(tag) == {}  # found by scanning the table
        assert sup.flush_events()  # events reach on_event on their own thread
        kinds = [(e.kind, e.status) for e in scr.of("sh") if e.kind != "output"]
        assert kinds == [("created", None), ("exited", "killed"), ("deleted", None)]
    check_order(scr.events)
    assert fds_back_to(before) == before  # the master was closed with the generation


def test_async_pty_write_and_resize_do_not_block_the_loop() -> None:
    import asyncio

    from proctable import AsyncSupervisor

    async def main() -> bytes:
        shown = bytearray()
        async with AsyncSupervisor() as sup:
            await sup.start("sh", ["sh"], pty=(24, 80))
            await sup.resize("sh", 30, 100)
            await sup.write("sh", b"echo S$((1+1)) $(stty size); exit 5\n")
            async for ev in sup.events():
                if ev.kind == "output":
                    shown += ev.data or b""
                elif ev.kind == "exited":
                    assert ev.exit is not None and ev.exit.code == 5
                    break
        return bytes(shown)

    assert b"S2 30 100" in asyncio.run(main())


def test_output_events_with_a_pty_is_taken_as_over_the_wire() -> None:
    """Python refused ``pty=`` with ``output="events"`` where the sidecar takes it
    (issue 30, item 13, found by writing the same client in both): a pty's output
    is events anyway, so both agree now; what makes no sense beside a pty (another
    stdout, stderr or stdin) is still refused, in Python as before."""
    screen = Screen()
    with Supervisor(on_event=screen, grace=1.0) as sup:
        sup.start("t", ["sh", "-c", "echo T$((20+22)); sleep 60"], pty=(24, 80),
                  output="events")
        screen.wait_shown(b"T42")
        for bad in ({"stdout": subprocess.DEVNULL}, {"stderr": subprocess.DEVNULL},
                    {"stdin": subprocess.PIPE}):
            with pytest.raises(ValueError, match="pty="):
                sup.start("u", ["true"], pty=(24, 80), output="events", **bad)
        assert "u" not in sup


def test_last_input_tells_a_ctrl_c_from_a_typed_quit() -> None:
    """Issue 31, item 4 (the double-Ctrl-C seed): a command that exits 0 on Ctrl-C
    and on a typed "quit" looks the same to a restart policy. ``last_input(key)``
    gives the time of the key's last input and its last 16 bytes (over every write,
    across the key's generations), so a fresh factory can ask what the user typed."""
    scr = Screen()
    asked: list[object] = []
    quits = "trap 'exit 0' INT; echo R$((1+1)); read line; exit 0"

    def fresh(key: Hashable) -> Optional[list[str]]:
        asked.append(sup.last_input(key))
        return None  # do not rerun: the user quit

    with Supervisor(on_event=scr) as sup:
        with pytest.raises(KeyError):
            sup.last_input("c")
        for key, typed in (("c", [b"a" * 20, b"\x03"]), ("q", [b"qu", b"it\n"])):
            sup.start(key, ["sh", "-c", quits], pty=(24, 80),
                      restart=RestartPolicy(fresh=fresh))
            assert sup.last_input(key) is None
            scr.wait_for(lambda r, key=key: b"R2" in sup.tail(key), poll=0.05)
            t0 = time.time()
            for data in typed:
                sup.write(key, data)
            scr.wait_for(lambda r, key=key: r.count("gave_up", key) == 1)
            assert [e.exit.code for e in scr.of(key) if e.kind == "exited"] == [0]  # type: ignore[union-attr]
            t, last = sup.last_input(key)  # type: ignore[misc]
            assert t0 <= t <= time.time()
            assert last == b"".join(typed)[-16:]
        assert [a[1] for a in asked] == [b"a" * 15 + b"\x03", b"quit\n"]  # type: ignore[index]
        sup.remove("c")
        with pytest.raises(KeyError):
            sup.last_input("c")


def test_resize_of_a_key_without_a_pty_says_so() -> None:
    """resize() of an output="events" key (no pty, no stdin) must say it has no
    terminal; it says "its input is closed" (the pty message is unreachable).

    Found by a review of issue 22 (owned output and pseudo-terminals) with real
    processes."""
    with Supervisor() as sup:
        sup.start("k", ["sleep", "30"], output="events")
        with pytest.raises(NoInput, match="pty"):
            sup.resize("k", 10, 10)


def test_write_to_a_stopped_pty_key_says_it_is_not_running() -> None:
    """write() to a pty key after stop() must say it is not running; it says the key
    "has no pty or stdin pipe", which is false.

    Found by a review of issue 22 (owned output and pseudo-terminals) with real
    processes."""
    with Supervisor(grace=0.2) as sup:  # an interactive sh ignores SIGTERM
        sup.start("k", ["sh"], pty=(24, 80))
        sup.stop("k")
        with pytest.raises(NoInput, match="not running"):
            sup.write("k", b"echo hi\n")
