"""The restart decision as a pure function: table-driven and property tests."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proctable import ExitStatus, RestartPolicy
from proctable.supervise._policy import Counters, decide

CLEAN = ExitStatus(0, None, False, 0)
CRASH = ExitStatus(3, None, False, 3 << 8)
KILLED = ExitStatus(None, 9, False, 9)


@pytest.mark.parametrize(
    ("status", "uptime", "before", "action", "after"),
    [
        (CLEAN, 10.0, Counters(), "fresh", Counters(0, 0)),         # slow quit: never counted
        (CLEAN, 0.1, Counters(), "fresh", Counters(0, 1)),          # fast quit: counted
        (CLEAN, 0.1, Counters(0, 4), "give_up", Counters(0, 5)),    # the fifth in a row
        (CLEAN, 5.0, Counters(0, 4), "fresh", Counters(0, 0)),      # a healthy run resets
        (CLEAN, 0.1, Counters(7, 0), "fresh", Counters(7, 1)),      # clean exits use no budget
        (CRASH, 1.0, Counters(), "recover", Counters(1, 0)),
        (KILLED, 1.0, Counters(2, 3), "recover", Counters(3, 0)),   # a crash breaks the row
        (CRASH, 1.0, Counters(50, 0), "give_up", Counters(50, 0)),  # budget spent
        (CRASH, 301.0, Counters(50, 0), "recover", Counters(1, 0)),  # long uptime resets
        (None, 1.0, Counters(), "recover", Counters(1, 0)),         # unknown status: a crash
    ],
)
def test_decisions(status: ExitStatus, uptime: float, before: Counters, action: str,
                   after: Counters) -> None:
    d = decide(RestartPolicy(), before, status, uptime)
    assert d.action == action
    assert d.counters == after
    assert d.reason


def test_give_up_reasons_read_well() -> None:
    d = decide(RestartPolicy(max_fast_exits=2), Counters(0, 1), CLEAN, 0.0)
    assert d.action == "give_up"
    assert "cleanly 2 times in a row" in d.reason
    d = decide(RestartPolicy(max_restarts=0), Counters(), CRASH, 0.0)
    assert d.action == "give_up"
    assert "exit code 3" in d.reason
    assert "budget" in d.reason


def test_policy_validation() -> None:
    with pytest.raises(ValueError):
        RestartPolicy(max_restarts=-1)
    with pytest.raises(ValueError):
        RestartPolicy(max_fast_exits=0)
    with pytest.raises(ValueError):
        RestartPolicy(delay=-1)
    with pytest.raises(TypeError):
        RestartPolicy(fresh="not callable")  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "value", "error"), [
    ("delay", "1", TypeError),                # used to fail inside: '<' not supported
    ("delay", None, TypeError),
    ("delay", True, TypeError),
    ("delay", -0.5, ValueError),
    ("delay", math.nan, ValueError),          # used to pass: nan < 0 is False
    ("delay", math.inf, ValueError),
    ("reset_after", "300", TypeError),
    ("reset_after", math.nan, ValueError),
    ("fast_exit", [2.0], TypeError),
    ("fast_exit", -1, ValueError),
    ("max_restarts", 2.5, TypeError),         # a count is an int
    ("max_restarts", "3", TypeError),
    ("max_restarts", False, TypeError),
    ("max_restarts", -1, ValueError),
    ("max_fast_exits", 1.0, TypeError),
    ("max_fast_exits", 0, ValueError),
    ("fresh", 42, TypeError),
])
def test_every_policy_field_is_checked_with_a_clear_error(field: str, value: object,
                                                          error: type[Exception]) -> None:
    with pytest.raises(error, match=field):
        RestartPolicy(**{field: value})  # type: ignore[arg-type]


def test_good_policy_values_pass() -> None:
    p = RestartPolicy(fresh=None, max_restarts=0, reset_after=0, fast_exit=0.5,
                      max_fast_exits=1, delay=2)
    assert p.delay == 2 and p.max_restarts == 0


def test_the_recovery_reason_claims_no_original_args() -> None:
    """A crash reruns the args that crashed (after a fresh rerun, the fresh ones)."""
    d = decide(RestartPolicy(), Counters(), CRASH, 1.0)
    assert d.action == "recover" and "original" not in d.reason
    assert "the args that crashed" in d.reason


@given(
    exits=st.lists(st.tuples(st.sampled_from([CLEAN, CRASH, KILLED, None]),
                             st.floats(min_value=0, max_value=1000)), max_size=200),
    max_restarts=st.integers(min_value=0, max_value=10),
    max_fast=st.integers(min_value=1, max_value=6),
)
def test_never_restarts_forever(exits: list[tuple[ExitStatus, float]], max_restarts: int,
                                max_fast: int) -> None:
    """Whatever the sequence, fast clean exits and crashes stay within their budgets."""
    policy = RestartPolicy(max_restarts=max_restarts, max_fast_exits=max_fast)
    c = Counters()
    fast_row = 0
    crashes_since_reset = 0
    for status, uptime in exits:
        d = decide(policy, c, status, uptime)
        clean = status is not None and status.code == 0
        if clean:
            fast_row = fast_row + 1 if uptime < policy.fast_exit else 0
            assert (d.action == "give_up") == (fast_row >= max_fast)
        else:
            fast_row = 0
            if uptime >= policy.reset_after:
                crashes_since_reset = 0
            assert (d.action == "give_up") == (crashes_since_reset >= max_restarts)
            crashes_since_reset += 1
        if d.action == "give_up":
            return
        c = d.counters
