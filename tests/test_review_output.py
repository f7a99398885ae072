"""Review of issue 22 (owned output and pseudo-terminals): promises that do not hold.

Each test runs real processes and fails on main as merged.
"""

from __future__ import annotations

import threading
import time

import pytest

from proctable import NoInput, RestartPolicy, Supervisor
from proctable.supervise import Event

from .conftest import PY


def test_output_bound_holds_per_key_across_generations() -> None:
    """docs/supervisor.md: "Per key, output read but not yet delivered is bounded
    (output_buffer)". Each generation gets its own buffer of that size, so a key
    that crash-loops while on_event is busy holds generations x output_buffer."""
    bound = 64 << 10
    events: list[Event] = []
    gate = threading.Event()
    held = threading.Event()

    def on_event(ev: Event) -> None:
        events.append(ev)
        if ev.kind == "output" and not held.is_set():
            held.set()
            gate.wait(60)  # a consumer that falls behind (bounded)

    chatty = [PY, "-c", "import sys; sys.stdout.buffer.write(b'x' * 200000); "
              "sys.stdout.flush(); sys.exit(1)"]
    with Supervisor(on_event=on_event, output_buffer=bound) as sup:
        sup.start("k", chatty, restart=RestartPolicy(max_restarts=9), output="events")
        deadline = time.monotonic() + 60
        while sup.state("k") != "gave_up" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sup.state("k") == "gave_up"
        gate.set()
        assert sup.flush_events(30)
    outs = [e for e in events if e.kind == "output"]
    created = sum(e.kind == "created" for e in events)
    delivered = sum(len(e.data) for e in outs)
    assert created == 10
    assert delivered + sum(e.dropped for e in outs) == 10 * 200000  # nothing silent
    # Waiting while on_event was stuck: at most the bound (plus the one event in hand).
    assert delivered <= 2 * bound, (
        f"{delivered} bytes were held for one key while on_event was stuck, "
        f"output_buffer={bound}")


def test_resize_of_a_key_without_a_pty_says_so() -> None:
    """resize() of an output="events" key (no pty, no stdin) must say it has no
    terminal; it says "its input is closed" (the pty message is unreachable)."""
    with Supervisor() as sup:
        sup.start("k", ["sleep", "30"], output="events")
        with pytest.raises(NoInput, match="pty"):
            sup.resize("k", 10, 10)


def test_write_to_a_stopped_pty_key_says_it_is_not_running() -> None:
    """write() to a pty key after stop() must say it is not running; it says the key
    "has no pty or stdin pipe", which is false."""
    with Supervisor() as sup:
        sup.start("k", ["sh"], pty=(24, 80))
        sup.stop("k")
        with pytest.raises(NoInput, match="not running"):
            sup.write("k", b"echo hi\n")
