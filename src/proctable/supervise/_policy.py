"""Restart decisions: a pure function over plain data (no processes, no clock).

The supervisor feeds it how a run ended and the key's counters; it answers what
to do next. Keeping it pure is what lets every give-up path be tested alike.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Callable, Optional

from .._status import ExitStatus

__all__ = ["MAX_SECONDS", "Counters", "Decision", "FixedArgs", "RestartPolicy", "decide"]

Args = Sequence[str]

MAX_SECONDS = 1e9
"""The longest a supervisor waits on anything it is given (a timeout, a grace, a
restart delay): about 31 years. Longer is refused with ``ValueError``: a wait
that long is a mistake of units, and past ``threading.TIMEOUT_MAX`` (292 years
here) the platform cannot even make it (the timer thread died of it once). For
"no timeout", pass None."""


class FixedArgs:
    """A ``fresh`` factory that gives one fixed list of args each time. It is plain
    data (``fresh_args``), so a durable supervisor records it with the policy and the
    next supervisor's clean reruns run the same (a factory that is code cannot be
    recorded). A factory of another kind may carry ``fresh_args`` too: what a later
    supervisor reruns in its place."""

    def __init__(self, args: Args) -> None:
        if isinstance(args, str) or not args or not all(isinstance(a, str) for a in args):
            raise TypeError("fresh_args must be a non-empty list of strings")
        self.fresh_args = list(args)

    def __call__(self, _key: Hashable) -> list[str]:
        return list(self.fresh_args)

    def __repr__(self) -> str:
        return f"FixedArgs({self.fresh_args!r})"


@dataclass(frozen=True)
class RestartPolicy:
    """When and how a supervised key is started again after its process ends.

    - A deliberate exit (code 0, no signal) reruns the key *fresh*: with
      ``fresh(key)``'s args, or the same args where ``fresh`` is None. It uses
      no restart budget. ``fresh`` returning None means "do not rerun" and
      ends the key with ``gave_up``.
    - A crash (non-zero code) or a death by a signal we did not send reruns
      the args that crashed (recovery): the args the key was started with, or,
      after a fresh rerun, ``fresh(key)``'s. At most ``max_restarts`` times; the
      count is reset once a run has stayed up ``reset_after`` seconds.
    - ``max_fast_exits`` deliberate exits in a row, each within ``fast_exit``
      seconds of its start, end the key with ``gave_up`` (a harness that quits
      at once must not respawn forever).
    - ``delay`` seconds pass before any restart (at most ``MAX_SECONDS``).

    ``fresh`` is called on a worker thread of its own, after the delay. It may
    block or call back into the supervisor: a stop, remove, close or start of the
    key does not wait for it, and its answer is then dropped.

    A process we stopped (``stop``, ``remove``, a ``timeout``) is never restarted.

    Every field is checked here: ``TypeError`` for a value of the wrong type
    (``delay='1'``), ``ValueError`` for a wrong value (negative, NaN, infinite).
    """

    fresh: Optional[Callable[[Hashable], Optional[Args]]] = None
    max_restarts: int = 50
    reset_after: float = 300.0
    fast_exit: float = 2.0
    max_fast_exits: int = 5
    delay: float = 0.0

    def __post_init__(self) -> None:
        if self.fresh is not None and not callable(self.fresh):
            raise TypeError("fresh must be a callable taking the key, or None, "
                            f"not {type(self.fresh).__name__}")
        _count(self.max_restarts, "max_restarts", 0)
        _count(self.max_fast_exits, "max_fast_exits", 1)
        for name in ("reset_after", "fast_exit"):
            _seconds(getattr(self, name), name)
        _seconds(self.delay, "delay", MAX_SECONDS)  # waited on: the timer must hold it


def _count(value: object, name: str, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__} ({value!r})")
    if value < least:
        raise ValueError(f"{name} must be >= {least}, not {value}")


def _seconds(value: object, name: str, most: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__} "
                        f"({value!r})")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, not {value!r}")
    if value > most:
        raise ValueError(f"{name} must be at most {most:g} seconds (about 31 years), not "
                         f"{value!r}")


@dataclass(frozen=True)
class Counters:
    """Per-key counts the policy keeps between runs."""

    restarts: int = 0      # recoveries since the last reset
    fast_exits: int = 0    # deliberate exits in a row, each fast


@dataclass(frozen=True)
class Decision:
    """``action`` is ``"fresh"``, ``"recover"`` or ``"give_up"``; ``reason`` is for people."""

    action: str
    reason: str
    counters: Counters


def decide(policy: RestartPolicy, counters: Counters, status: Optional[ExitStatus],
           uptime: float) -> Decision:
    """What to do after a run that ended on its own (not stopped by us).

    ``status`` None means the exit status could not be read: it counts as a crash.
    """
    clean = status is not None and status.signal is None and status.code == 0
    if clean:
        fast = counters.fast_exits + 1 if uptime < policy.fast_exit else 0
        c = replace(counters, fast_exits=fast)
        if fast >= policy.max_fast_exits:
            return Decision(
                "give_up",
                f"exited cleanly {fast} times in a row, each within {policy.fast_exit:g}s "
                "of starting",
                c,
            )
        return Decision("fresh", "exited cleanly (code 0): rerunning fresh", c)

    restarts = 0 if uptime >= policy.reset_after else counters.restarts
    how = "with an unknown status" if status is None else status.describe()
    c = Counters(restarts=restarts + 1, fast_exits=0)
    if restarts >= policy.max_restarts:
        return Decision(
            "give_up",
            f"crashed ({how}) after {restarts} restarts: the budget of "
            f"{policy.max_restarts} is spent",
            replace(c, restarts=restarts),
        )
    return Decision("recover", f"crashed ({how}): restart {restarts + 1} of "
                    f"{policy.max_restarts} with the args that crashed", c)
