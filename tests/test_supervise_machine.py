"""The supervisor's per-key machine alone, with plain data: no processes, no threads.

Every state is reached by feeding inputs from ``gone``; then every input is fed in
every state and the outcome held to the table. A hypothesis run feeds random
calls and answers (a simulated runtime) and checks the README's promises on the
actions that come out.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proctable import ExitStatus, Identity, RestartPolicy
from proctable.supervise import _machine as mm
from proctable.supervise._machine import (
    IMPOSSIBLE,
    OUTSTANDING,
    SETTLED,
    TABLE,
    Kind,
    Machine,
    MachineError,
    State,
)

CLEAN = ExitStatus(0, None, False, 0)
CRASH = ExitStatus(1, None, False, 256)
TERM = ExitStatus(None, 15, False, 15)
IDENT = Identity(4242, 1000, 77)
POLICY = RestartPolicy(max_restarts=2, max_fast_exits=2, delay=0.5)
SPEC = mm.Spec(("sleep", "60"), POLICY, timeout=None)
TIMED = mm.Spec(("sleep", "60"), None, timeout=5.0)
FRESH_SPEC = mm.Spec(("true",), RestartPolicy(fresh=lambda key: ["sleep", "60"], delay=0.5))

ANSWERS = {Kind.EXITED: "watch", Kind.TIMER_FIRED: "timer", Kind.LAUNCHED: "launch",
           Kind.LAUNCH_FAILED: "launch", Kind.TEARDOWN_DONE: "teardown",
           Kind.TEARDOWN_FAILED: "teardown", Kind.FRESH: "fresh", Kind.FRESH_FAILED: "fresh"}
CALLS = (Kind.START, Kind.STOP, Kind.REMOVE, Kind.CLOSE)
_tokens = itertools.count(1000)


def make(kind: Kind, m: Machine, *, spec: mm.Spec = SPEC, status: Optional[ExitStatus] = CRASH,
         at: float = 10.0, root: Optional[mm.RootExit] = None) -> mm.Input:
    """An input of kind for m: calls get a fresh token, answers the outstanding ticket."""
    ch = ANSWERS.get(kind)
    t = (m.ticket(ch) if ch is not None else None) or 999_999
    tok = next(_tokens)
    if kind is Kind.START:
        return mm.Start(tok, spec)
    if kind is Kind.STOP:
        return mm.Stop(tok, 0.5)
    if kind is Kind.REMOVE:
        return mm.Remove(tok)
    if kind is Kind.CLOSE:
        return mm.Close(tok)
    if kind is Kind.EXITED:
        return mm.Exited(t, status, at)
    if kind is Kind.TIMER_FIRED:
        return mm.TimerFired(t, at)
    if kind is Kind.LAUNCHED:
        return mm.Launched(t, IDENT, at, ("sleep", "60"))
    if kind is Kind.LAUNCH_FAILED:
        return mm.LaunchFailed(t, "could not start: no such file", FileNotFoundError(2, "x"))
    if kind is Kind.TEARDOWN_DONE:
        return mm.TeardownDone(t, root)
    if kind is Kind.FRESH:
        return mm.Fresh(t, ("sleep", "30"))
    if kind is Kind.FRESH_FAILED:
        return mm.FreshFailed(t, "the fresh factory said stop")
    return mm.TeardownFailed(t, ("survivor",), "1 member could not be proven gone", None, root)


# Inputs that take a fresh machine to each state.
PATHS: dict[State, list[tuple[Kind, dict[str, Any]]]] = {
    State.GONE: [],
    State.STARTING: [(Kind.START, {})],
    State.RUNNING: [(Kind.START, {}), (Kind.LAUNCHED, {})],
    State.STOPPING: [(Kind.START, {}), (Kind.LAUNCHED, {}), (Kind.STOP, {})],
    State.DRAINING: [(Kind.START, {}), (Kind.LAUNCHED, {}), (Kind.EXITED, {})],
    State.RESTART_PENDING: [(Kind.START, {}), (Kind.LAUNCHED, {}), (Kind.EXITED, {}),
                            (Kind.TEARDOWN_DONE, {})],
    State.RELAUNCHING: [(Kind.START, {}), (Kind.LAUNCHED, {}), (Kind.EXITED, {}),
                        (Kind.TEARDOWN_DONE, {}), (Kind.TIMER_FIRED, {})],
    State.FRESHENING: [(Kind.START, {"spec": FRESH_SPEC}), (Kind.LAUNCHED, {}),
                       (Kind.EXITED, {"status": CLEAN}), (Kind.TEARDOWN_DONE, {}),
                       (Kind.TIMER_FIRED, {})],
    State.ABORTING: [(Kind.START, {}), (Kind.LAUNCHED, {}), (Kind.EXITED, {}),
                     (Kind.TEARDOWN_DONE, {}), (Kind.TIMER_FIRED, {}), (Kind.STOP, {})],
    State.STOPPED: [(Kind.START, {}), (Kind.LAUNCHED, {}), (Kind.STOP, {}),
                    (Kind.TEARDOWN_DONE, {})],
    State.GAVE_UP: [(Kind.START, {"spec": FRESH_SPEC}), (Kind.LAUNCHED, {}),
                    (Kind.EXITED, {"status": CLEAN}), (Kind.TEARDOWN_DONE, {}),
                    (Kind.TIMER_FIRED, {}), (Kind.FRESH_FAILED, {})],
    State.FAILED: [(Kind.START, {}), (Kind.LAUNCHED, {}), (Kind.STOP, {}),
                   (Kind.TEARDOWN_FAILED, {})],
    State.FAILED_EXITED: [(Kind.START, {}), (Kind.LAUNCHED, {}), (Kind.STOP, {}),
                          (Kind.TEARDOWN_FAILED, {"root": mm.RootExit(TERM)})],
    State.CLOSED: [(Kind.START, {}), (Kind.LAUNCHED, {}), (Kind.STOP, {}),
                   (Kind.TEARDOWN_DONE, {}), (Kind.CLOSE, {})],
}


def reach(state: State) -> Machine:
    m = Machine("k")
    for kind, kw in PATHS[state]:
        m.feed(make(kind, m, **kw))
    assert m.state is state, (state, m)
    return m


def kinds(actions: list[mm.Action]) -> list[str]:
    return [a.kind for a in actions if isinstance(a, mm.Emit)]


# --- the table's shape ------------------------------------------------------------------


def test_every_state_has_a_cell_for_every_input() -> None:
    assert set(TABLE) == set(State)
    for state, row in TABLE.items():
        assert set(row) == set(Kind), state
        for kind, cell in row.items():
            if kind in CALLS:
                assert cell is not IMPOSSIBLE, (state, kind)  # a call always has an answer
            else:
                # An answer is possible exactly where its action may be outstanding.
                possible = ANSWERS[kind] in OUTSTANDING[state]
                assert (cell is not IMPOSSIBLE) == possible, (state, kind)


def test_paths_reach_every_state_with_its_outstanding_channels() -> None:
    for state in State:
        m = reach(state)
        assert m.outstanding <= OUTSTANDING[state], state


# --- every state against every input ----------------------------------------------------

ALLOWED_BY_RULE = {
    mm._Rule.AFTER: {State.STOPPED, State.GONE, State.CLOSED, State.RESTART_PENDING,
                     State.GAVE_UP},
    mm._Rule.ORIGIN: {State.GONE, State.STOPPED, State.GAVE_UP},
    mm._Rule.ROOT_KNOWN: {State.FAILED, State.FAILED_EXITED},
    mm._Rule.RESTART: {State.FRESHENING, State.RELAUNCHING},
}


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("kind", list(Kind))
def test_every_input_in_every_state(state: State, kind: Kind) -> None:
    m = reach(state)
    before_gen = m.generation
    inp = make(kind, m)
    cell = TABLE[state][kind]
    channel = ANSWERS.get(kind)
    if channel is not None and m.ticket(channel) is None:
        # No such action is outstanding here: the answer is stale and dropped (rule 1),
        # and the table says so: IMPOSSIBLE, or a real cell whose action is not out now.
        assert m.feed(inp) == []
        assert m.state is state
        return
    assert cell is not IMPOSSIBLE
    out = m.feed(inp)
    if isinstance(cell.next, State):
        assert m.state is cell.next
    else:
        assert cell.next is not None
        assert m.state in ALLOWED_BY_RULE[cell.next]
    assert m.outstanding <= OUTSTANDING[m.state]
    assert m.generation in (before_gen, before_gen + 1)
    if m.generation == before_gen + 1:
        assert kinds(out) == ["created"]
    # A call is always answered: at once, when the key settles, or fed again.
    if kind in CALLS:
        replied = [a for a in out if isinstance(a, mm.Reply) and a.token == inp.token]  # type: ignore[union-attr]
        if m.state in SETTLED and state in SETTLED and kind is not Kind.START:
            assert len(replied) == 1


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("kind", list(Kind))
def test_every_exited_is_emitted_during_or_after_its_teardown(state: State, kind: Kind) -> None:
    """What the runtime relies on to put every teardown before its ``exited`` (issue
    30, item 4): an ``exited`` comes out either while a teardown of the key is
    outstanding (a natural exit's drain, a root that ended while a stop tears it
    down: the runtime holds it until that teardown has ended), or with the
    teardown's own answer, or, after a failed teardown, once the root ends (in
    ``failed``: nothing is torn down any more until a stop retries)."""
    m = reach(state)
    inp = make(kind, m)
    channel = ANSWERS.get(kind)
    if TABLE[state][kind] is IMPOSSIBLE or (channel is not None and m.ticket(channel) is None):
        return
    out = m.feed(inp)
    if "exited" not in kinds(out):
        return
    assert (m.ticket("teardown") is not None
            or kind in (Kind.TEARDOWN_DONE, Kind.TEARDOWN_FAILED)
            or (state is State.FAILED and kind is Kind.EXITED)), (state, kind, m.state)


def test_an_impossible_cell_raises() -> None:
    m = Machine("k")
    m._tickets["watch"] = 5  # white-box: an answer the runtime should never give here
    with pytest.raises(MachineError):
        m.feed(mm.Exited(5, CLEAN, 0.0))


@pytest.mark.parametrize("state", list(State))
def test_stale_answers_are_dropped_everywhere(state: State) -> None:
    for kind in ANSWERS:
        m = reach(state)
        inp = make(kind, m)
        stale = type(inp)(**{**inp.__dict__, "ticket": 123_456})  # type: ignore[arg-type]
        assert m.feed(stale) == []
        assert m.state is state


# --- the semantics the issue fixes, with plain data ---------------------------------------


def test_stop_during_restart_delay_cancels_the_timer() -> None:
    m = reach(State.RESTART_PENDING)
    timer = m.ticket("timer")
    out = m.feed(mm.Stop(1))
    assert m.state is State.STOPPED
    assert mm.CancelTimer(timer) in out  # type: ignore[arg-type]
    assert mm.Reply(1, value=None) in out
    assert m.feed(mm.TimerFired(timer, 99.0)) == []  # it fired while being cancelled: stale
    assert m.state is State.STOPPED


def test_stop_during_a_restarts_launch_discards_it_silently() -> None:
    m = reach(State.RELAUNCHING)
    gen = m.generation
    assert m.feed(mm.Stop(1)) == []
    assert m.state is State.ABORTING
    out = m.feed(mm.Launched(m.ticket("launch"), Identity(9, 9), 20.0, ("x",)))  # type: ignore[arg-type]
    assert m.state is State.DRAINING and kinds(out) == []  # no created: nothing starts after stop
    assert any(isinstance(a, mm.Teardown) for a in out)
    out = m.feed(mm.TeardownDone(m.ticket("teardown")))  # type: ignore[arg-type]
    assert m.state is State.STOPPED and kinds(out) == []
    assert mm.Reply(1, value=None) in out
    assert m.generation == gen


def test_a_restart_asks_the_factory_then_launches_its_args() -> None:
    m = Machine("k")
    m.feed(mm.Start(1, FRESH_SPEC))
    m.feed(make(Kind.LAUNCHED, m))
    m.feed(make(Kind.EXITED, m, status=CLEAN))
    m.feed(make(Kind.TEARDOWN_DONE, m))
    assert m.state is State.RESTART_PENDING
    out = m.feed(make(Kind.TIMER_FIRED, m))
    assert m.state is State.FRESHENING
    ask = [a for a in out if isinstance(a, mm.AskFresh)]
    assert len(ask) == 1 and ask[0].factory is FRESH_SPEC.policy.fresh  # type: ignore[union-attr]
    assert not any(isinstance(a, mm.Launch) for a in out)  # not before the factory answered
    out = m.feed(mm.Fresh(ask[0].ticket, ("sleep", "30")))
    launch = [a for a in out if isinstance(a, mm.Launch)]
    assert m.state is State.RELAUNCHING and launch[0].spec.args == ("sleep", "30")
    assert launch[0].restart == "fresh"


@pytest.mark.parametrize(("kind", "end", "events"), [
    (Kind.STOP, State.STOPPED, []),
    (Kind.REMOVE, State.GONE, ["deleted"]),
    (Kind.CLOSE, State.CLOSED, []),
])
def test_a_stop_does_not_wait_for_the_fresh_factory(kind: Kind, end: State,
                                                    events: list[str]) -> None:
    """Rule 6: the factory is user code that may block; a stop answers at once, and
    the factory's late answer is stale."""
    m = reach(State.FRESHENING)
    ask = m.ticket("fresh")
    call = make(kind, m)
    out = m.feed(call)
    assert m.state is end and kinds(out) == events
    assert mm.Reply(call.token, value=None) in out  # type: ignore[union-attr]
    assert m.outstanding == frozenset()
    assert m.feed(mm.Fresh(ask, ("sleep", "30"))) == []  # type: ignore[arg-type]
    assert m.feed(mm.FreshFailed(ask, "late")) == []  # type: ignore[arg-type]
    assert m.state is end


def test_a_start_while_the_factory_runs_starts_at_once() -> None:
    m = reach(State.FRESHENING)
    ask = m.ticket("fresh")
    out = m.feed(mm.Start(7, SPEC))
    assert m.state is State.STARTING and any(isinstance(a, mm.Launch) for a in out)
    assert m.feed(mm.Fresh(ask, ("sleep", "30"))) == []  # type: ignore[arg-type]


def test_a_factory_that_fails_or_says_stop_gives_up() -> None:
    m = reach(State.FRESHENING)
    out = m.feed(mm.FreshFailed(m.ticket("fresh"), "the fresh factory said stop"))  # type: ignore[arg-type]
    assert m.state is State.GAVE_UP
    emit = [a for a in out if isinstance(a, mm.Emit)]
    assert [(e.kind, e.reason) for e in emit] == [("gave_up", "the fresh factory said stop")]


def test_tickets_come_from_the_count_the_runtime_shares() -> None:
    """A key's next machine (after remove) must never reuse a ticket of the last."""
    count = itertools.count(500).__next__
    first = Machine("k", tickets=count)
    first.feed(mm.Start(1, SPEC))
    t1 = first.ticket("launch")
    second = Machine("k", generation=3, tickets=count)
    second.feed(mm.Start(2, SPEC))
    assert second.ticket("launch") != t1 and second.generation == 3
    second.feed(make(Kind.LAUNCHED, second))
    assert second.generation == 4


def test_remove_during_restart_delay_deletes_at_once() -> None:
    m = reach(State.RESTART_PENDING)
    out = m.feed(mm.Remove(1))
    assert m.state is State.GONE
    assert kinds(out) == ["deleted"]


def test_a_failed_teardown_surfaces_and_keeps_the_key() -> None:
    m = reach(State.RUNNING)
    m.feed(mm.Remove(1))
    out = m.feed(mm.TeardownFailed(m.ticket("teardown"), ("p",), "1 survivor",  # type: ignore[arg-type]
                                   None, mm.RootExit(TERM)))
    assert m.state is State.FAILED_EXITED
    assert kinds(out) == ["exited", "teardown_failed"]  # the root's exit, then the failure
    emit = [a for a in out if isinstance(a, mm.Emit)]
    assert emit[0].status == "killed" and emit[0].exit == TERM
    assert emit[1].survivors == ("p",)
    reply = next(a for a in out if isinstance(a, mm.Reply))
    assert reply.failure is not None and reply.failure.kind == "teardown_failed"
    # start is refused while members may run; a retried remove deletes only once proven
    out = m.feed(mm.Start(2, SPEC))
    assert m.state is State.FAILED_EXITED
    assert next(a for a in out if isinstance(a, mm.Reply)).failure is not None
    m.feed(mm.Remove(3))
    assert m.state is State.DRAINING
    out = m.feed(mm.TeardownDone(m.ticket("teardown")))  # type: ignore[arg-type]
    assert m.state is State.GONE and kinds(out) == ["deleted"]


def test_a_failed_teardown_before_the_root_ended_reports_the_root_later() -> None:
    m = reach(State.FAILED)
    assert m.ticket("watch") is not None  # the root may still end: its exit is awaited
    out = m.feed(mm.Exited(m.ticket("watch"), TERM, 30.0))  # type: ignore[arg-type]
    assert m.state is State.FAILED_EXITED and kinds(out) == ["exited"]


def test_close_cancels_a_concurrent_start() -> None:
    m = Machine("k")
    m.feed(mm.Start(1, SPEC))
    m.feed(mm.Close(2))
    assert m.state is State.ABORTING
    out = m.feed(mm.Launched(m.ticket("launch"), IDENT, 1.0, ("sleep", "60")))  # type: ignore[arg-type]
    assert kinds(out) == [] and m.state is State.DRAINING
    out = m.feed(mm.TeardownDone(m.ticket("teardown")))  # type: ignore[arg-type]
    assert m.state is State.GONE  # the key never came to be
    start_reply = next(a for a in out if isinstance(a, mm.Reply) and a.token == 1)
    assert start_reply.failure is not None and start_reply.failure.kind == "closed"
    assert mm.Reply(2, value=None) in out
    assert m.generation == 0


@pytest.mark.parametrize(("first", "kind", "end", "events"), [
    (False, Kind.STOP, State.GONE, []),            # a new key: it never came to be
    (False, Kind.REMOVE, State.GONE, []),          # ... nothing to delete either
    (True, Kind.STOP, State.STOPPED, []),          # a key that existed stays, stopped
    (True, Kind.REMOVE, State.GONE, ["deleted"]),
    (True, Kind.CLOSE, State.CLOSED, []),
])
def test_stop_cancels_a_start_being_launched(first: bool, kind: Kind, end: State,
                                             events: list[str]) -> None:
    m = reach(State.STOPPED) if first else Machine("k")
    gen = m.generation
    m.feed(mm.Start(1, SPEC))
    call = make(kind, m)
    assert m.feed(call) == []
    assert m.state is State.ABORTING
    out = m.feed(mm.Launched(m.ticket("launch"), IDENT, 1.0, ("sleep", "60")))  # type: ignore[arg-type]
    assert kinds(out) == []  # no generation starts after a stop
    out = m.feed(mm.TeardownDone(m.ticket("teardown")))  # type: ignore[arg-type]
    assert m.state is end and kinds(out) == events and m.generation == gen
    start = next(a for a in out if isinstance(a, mm.Reply) and a.token == 1)
    assert start.failure is not None
    assert start.failure.kind == ("closed" if kind is Kind.CLOSE else "cancelled")
    assert mm.Reply(call.token, value=None) in out  # type: ignore[union-attr]


def test_a_start_that_cannot_launch_emits_nothing_and_uses_no_generation() -> None:
    m = Machine("k")
    m.feed(mm.Start(1, SPEC))
    out = m.feed(make(Kind.LAUNCH_FAILED, m))
    assert m.state is State.GONE and m.generation == 0 and kinds(out) == []
    reply = next(a for a in out if isinstance(a, mm.Reply))
    assert reply.failure is not None and isinstance(reply.failure.error, FileNotFoundError)


def test_a_restart_that_cannot_launch_gives_up() -> None:
    m = reach(State.RELAUNCHING)
    out = m.feed(make(Kind.LAUNCH_FAILED, m))
    assert m.state is State.GAVE_UP
    emit = [a for a in out if isinstance(a, mm.Emit)]
    assert [e.kind for e in emit] == ["gave_up"] and "no such file" in (emit[0].reason or "")


def test_start_of_a_running_key_stops_it_then_starts() -> None:
    m = reach(State.RUNNING)
    out = m.feed(mm.Start(5, SPEC))
    assert m.state is State.STOPPING and any(isinstance(a, mm.Teardown) for a in out)
    out = m.feed(mm.TeardownDone(m.ticket("teardown"), mm.RootExit(TERM)))  # type: ignore[arg-type]
    assert m.state is State.STOPPED
    assert kinds(out) == ["exited"]
    assert mm.Reply(5, retry=True) in out  # the runtime feeds the start again
    m.feed(mm.Start(5, SPEC))
    assert m.state is State.STARTING


def test_timeout_then_late_exit_is_one_exited() -> None:
    m = Machine("k")
    m.feed(mm.Start(1, TIMED))
    out = m.feed(make(Kind.LAUNCHED, m))
    timer = next(a for a in out if isinstance(a, mm.SetTimer))
    assert timer.delay == 5.0 and timer.purpose == "timeout"
    m.feed(mm.TimerFired(timer.ticket, 15.0))
    assert m.state is State.STOPPING and m.reason == "timeout"
    watch = m.ticket("watch")
    out = m.feed(mm.TeardownDone(m.ticket("teardown"), mm.RootExit(TERM)))  # type: ignore[arg-type]
    assert kinds(out) == ["exited"]
    assert next(a for a in out if isinstance(a, mm.Emit)).status == "timeout"
    assert m.feed(mm.Exited(watch, TERM, 16.0)) == []  # type: ignore[arg-type]


def test_natural_exit_decides_with_uptime_from_the_inputs() -> None:
    m = Machine("k")
    m.feed(mm.Start(1, mm.Spec(("true",), RestartPolicy(max_fast_exits=1, fast_exit=2.0))))
    m.feed(mm.Launched(m.ticket("launch"), IDENT, 100.0, ("true",)))  # type: ignore[arg-type]
    m.feed(mm.Exited(m.ticket("watch"), CLEAN, 100.5))  # type: ignore[arg-type]
    out = m.feed(mm.TeardownDone(m.ticket("teardown")))  # type: ignore[arg-type]
    assert kinds(out) == ["gave_up"] and m.state is State.GAVE_UP  # fast: 0.5 s < 2 s


# --- issue 24: the end of a crash loop is never silent, and it is a state of its own ----


def _crashed_and_draining(policy: Optional[RestartPolicy]) -> Machine:
    m = Machine("k")
    m.feed(mm.Start(1, mm.Spec(("sh", "-c", "exit 1"), policy)))
    m.feed(make(Kind.LAUNCHED, m))
    m.feed(mm.Exited(m.ticket("watch"), CRASH, 20.0))  # type: ignore[arg-type]
    assert m.state is State.DRAINING
    return m


def test_a_crash_whose_teardown_fails_gives_up_loudly() -> None:
    """RLIMIT_NPROC: the teardown after a crash cannot even start its worker. The
    key keeps its leftovers (failed_exited, a stop retries) and is not restarted,
    and says so: teardown_failed, then gave_up with the reason."""
    m = _crashed_and_draining(POLICY)
    out = m.feed(mm.TeardownFailed(m.ticket("teardown"), (), "could not start a worker "  # type: ignore[arg-type]
                                   "thread"))
    assert m.state is State.FAILED_EXITED
    emit = [a for a in out if isinstance(a, mm.Emit)]
    assert [e.kind for e in emit] == ["teardown_failed", "gave_up"]
    assert "could not start a worker thread" in (emit[1].reason or "")
    assert "not restarting" in (emit[1].reason or "")
    assert not any(isinstance(a, (mm.Launch, mm.SetTimer)) for a in out)
    m.feed(mm.Stop(2))  # the retry: once proven gone, the key is stopped
    out = m.feed(mm.TeardownDone(m.ticket("teardown")))  # type: ignore[arg-type]
    assert m.state is State.STOPPED and kinds(out) == []


def test_a_failed_teardown_without_a_policy_gives_nothing_up() -> None:
    m = _crashed_and_draining(None)  # no restart would have come: nothing to give up
    out = m.feed(mm.TeardownFailed(m.ticket("teardown"), (), "1 survivor"))  # type: ignore[arg-type]
    assert m.state is State.FAILED_EXITED and kinds(out) == ["teardown_failed"]


def test_a_stopped_key_and_a_given_up_key_read_differently() -> None:
    m = Machine("k")
    m.feed(mm.Start(1, mm.Spec(("sh", "-c", "exit 1"), RestartPolicy(max_restarts=0))))
    m.feed(make(Kind.LAUNCHED, m))
    m.feed(mm.Exited(m.ticket("watch"), CRASH, 20.0))  # type: ignore[arg-type]
    out = m.feed(mm.TeardownDone(m.ticket("teardown")))  # type: ignore[arg-type]
    assert kinds(out) == ["gave_up"] and m.state is State.GAVE_UP
    m.feed(mm.Stop(2))  # nothing runs: the key keeps saying why
    assert m.state is State.GAVE_UP
    m.feed(mm.Start(3, SPEC))  # a start that cannot launch leaves it as it was
    m.feed(make(Kind.LAUNCH_FAILED, m))
    assert m.state is State.GAVE_UP
    m.feed(mm.Start(4, SPEC))
    m.feed(make(Kind.LAUNCHED, m))
    m.feed(mm.Stop(5))
    m.feed(mm.TeardownDone(m.ticket("teardown"), mm.RootExit(TERM)))  # type: ignore[arg-type]
    assert m.state is State.STOPPED  # a deliberate stop


def test_the_restarting_reason_names_the_args_that_rerun() -> None:
    """A crash of a fresh rerun reruns the fresh args: the reason says those, never
    'the original args'."""
    m = Machine("k")
    m.feed(mm.Start(1, FRESH_SPEC))
    m.feed(make(Kind.LAUNCHED, m))
    m.feed(make(Kind.EXITED, m, status=CLEAN))
    m.feed(make(Kind.TEARDOWN_DONE, m))
    m.feed(make(Kind.TIMER_FIRED, m))
    m.feed(mm.Fresh(m.ticket("fresh"), ("sleep", "30")))  # type: ignore[arg-type]
    m.feed(mm.Launched(m.ticket("launch"), IDENT, 30.0, ("sleep", "30")))  # type: ignore[arg-type]
    m.feed(mm.Exited(m.ticket("watch"), CRASH, 31.0))  # type: ignore[arg-type]
    out = m.feed(mm.TeardownDone(m.ticket("teardown")))  # type: ignore[arg-type]
    emit = [a for a in out if isinstance(a, mm.Emit)]
    assert [e.kind for e in emit] == ["restarting"]
    reason = emit[0].reason or ""
    assert "['sleep', '30']" in reason and "original" not in reason
    launch = next(a for a in m.feed(make(Kind.TIMER_FIRED, m)) if isinstance(a, mm.Launch))
    assert launch.spec.args == ("sleep", "30") and launch.restart == "recover"


# --- random sequences: the promises, on the actions -----------------------------------------

_statuses = st.sampled_from([CLEAN, CRASH, TERM, None])


@settings(max_examples=1000, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(list(Kind)), _statuses, st.booleans(),
                                st.sampled_from([SPEC, TIMED, FRESH_SPEC, mm.Spec(("x",))])),
                      max_size=60))
def test_random_sequences_keep_the_promises(
        steps: list[tuple[Kind, Optional[ExitStatus], bool, mm.Spec]]) -> None:
    m = Machine("k")
    tokens = itertools.count(1)
    waiting: dict[int, mm.Input] = {}  # calls not answered yet
    created: list[int] = []
    exited: dict[int, int] = {}
    deleted_since_created = True
    start_since_stop = True
    clock = 0.0
    for kind, status, flag, spec in steps:
        clock += 1.0
        if kind in CALLS:
            inp = make(kind, m, spec=spec)
            inp = type(inp)(**{**inp.__dict__, "token": next(tokens)})  # type: ignore[arg-type]
            waiting[inp.token] = inp  # type: ignore[union-attr]
        else:
            ch = ANSWERS[kind]
            if m.ticket(ch) is None:
                continue  # the runtime only answers what is outstanding
            root = mm.RootExit(status) if flag else None
            inp = make(kind, m, status=status, at=clock, root=root)
        queue = [inp]
        while queue:
            i = queue.pop(0)
            if isinstance(i, mm.Start):
                start_since_stop = True
            elif isinstance(i, (mm.Stop, mm.Remove, mm.Close)):
                start_since_stop = False
            out = m.feed(i)  # never MachineError
            assert m.outstanding <= OUTSTANDING[m.state]
            for a in out:
                if isinstance(a, mm.Emit):
                    if a.kind == "created":
                        assert not created or a.generation == created[-1] + 1
                        assert start_since_stop, "a generation started after a stop"
                        created.append(a.generation)
                        deleted_since_created = False
                    elif a.kind == "exited":
                        assert created and a.generation == created[-1]
                        exited[a.generation] = exited.get(a.generation, 0) + 1
                        assert exited[a.generation] == 1, "two exited for one generation"
                    elif a.kind == "deleted":
                        assert not created or exited.get(created[-1]) == 1, \
                            "deleted before exited"
                        assert not deleted_since_created
                        deleted_since_created = True
                        assert m.state is State.GONE
                if isinstance(a, mm.Reply):
                    assert a.token in waiting, "answered twice"
                    if a.retry:
                        queue.append(waiting[a.token])
                    else:
                        del waiting[a.token]
    # A call is never left without an answer while nothing is in flight.
    if not m.busy:
        assert not waiting
