"""The Supervisor's worker threads (kept for the next launch or teardown) and its
after-events hook (how the sidecar answers after the events a request caused)."""

from __future__ import annotations

import threading
import time
from typing import Any

import proctable
from proctable import Supervisor

from ._reliability import linux_only

pytestmark = linux_only


def _supervisor_threads(before: set[threading.Thread]) -> list[str]:
    """The supervisor threads started since ``before`` (an earlier test's supervisor
    may still be winding down beside this one)."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith("proctable-supervisor-") and t not in before]


def test_close_leaves_no_worker_thread() -> None:
    events: list[Any] = []
    before = set(threading.enumerate())
    sup = Supervisor(on_event=events.append, grace=1.0)
    for k in range(3):
        sup.start(f"k{k}", ["true"])
    sup.start("long", ["sleep", "60"])
    sup.close()
    deadline = time.monotonic() + 10
    while _supervisor_threads(before) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _supervisor_threads(before) == []
    kinds = [e.kind for e in events if e.key == "long"]
    assert kinds == ["created", "exited"]


def test_after_events_runs_after_every_event_emitted_before_it() -> None:
    order: list[str] = []
    got = threading.Event()

    def on_event(ev: proctable.supervise.Event) -> None:
        order.append(f"{ev.kind} {ev.key}")
        time.sleep(0.01)  # a slow consumer: the hook must still wait its turn

    with Supervisor(on_event=on_event, grace=1.0) as sup:
        sup.start("a", ["sleep", "60"])
        sup.start("b", ["sleep", "60"])
        sup._after_events(lambda: (order.append("hook"), got.set()))
        assert got.wait(10.0)
        assert order == ["created a", "created b", "hook"]
        assert threading.current_thread().name not in order


def test_after_events_of_a_closed_supervisor_runs_at_once() -> None:
    sup = Supervisor(grace=1.0)
    sup.start("a", ["true"])
    sup.close()
    ran: list[str] = []
    sup._after_events(lambda: ran.append(threading.current_thread().name))
    assert ran == [threading.current_thread().name]
