"""The supervisor's per-key state machine: plain data in, actions out.

Everything that decides what happens to a key lives in this file, as in h11's
``_state.py``: the states, the inputs, the actions, ONE transition table
(``TABLE``: state -> input -> cell) and, beside it, the few rules that do not fit
a table (``_Rule``). The machine knows nothing of processes, threads or clocks:
times come in as data (``at``), and what should happen goes out as actions for
the runtime (``_runtime.py``) to carry out, which answers with more inputs.

The rules beside the table:

1. **Tickets.** Every action that the runtime answers (launch, watch, teardown,
   timer) carries a fresh ticket; the machine keeps the one outstanding ticket per
   channel. An answer whose ticket is not outstanding is stale (the late exit of
   a superseded generation, a timer that fired while it was being cancelled) and
   is dropped before the table is consulted. So every cell of an answer that
   cannot be outstanding in a state is ``IMPOSSIBLE`` there: reaching one is a bug
   of the runtime, and raises :class:`MachineError`.
2. **After a teardown** (``_Rule.AFTER``) the strongest purpose asked for wins:
   ``settle`` (the root ended on its own: the restart policy decides, through
   the pure ``decide``) < ``stay`` (stop) < ``delete`` (remove) < ``close``. A stop,
   remove or close that comes while a teardown runs raises the purpose, and
   cancels a restart still to be decided: stop always wins.
3. **A start that cannot launch** goes back where it came from
   (``_Rule.ORIGIN``): ``gone`` for a key that did not exist, ``gave_up`` for a
   key whose policy gave up, else ``stopped``; it emits nothing, and its caller
   gets the error. A start of a key that did
   not exist, cancelled by a stop, remove or close, goes back to ``gone`` too
   (rule 2 yields to that: nothing to delete).
4. **A failed teardown** (``_Rule.ROOT_KNOWN``) leaves ``failed_exited`` when the
   root's own exit is known (its ``exited`` is emitted), else ``failed``, where
   the root's exit may still come. A key with leftovers is never restarted: where
   the failed teardown followed a natural exit of a key with a restart policy
   (purpose ``settle``), it emits ``gave_up`` too (``E.NOT_RESTARTED``), so that
   a crash loop never just stops without a word.
5. **Settling.** Entering a state where no call waits for anything in flight
   (``SETTLED``) answers the waiters: the stop/remove/close callers (with the
   exit status they caused, or the teardown failure), and the calls that were
   deferred because the key was busy, which the runtime then feeds again.
6. **A restart asks the fresh factory first** (``_Rule.RESTART``): a clean exit
   whose policy has ``fresh`` waits in ``freshening`` for the factory's answer
   (the runtime calls it on a worker of its own), else the restart launches at
   once. The factory is user code that may block or call back in, so nothing
   waits for it: a stop, remove, close or start in ``freshening`` forgets the
   outstanding ask (its answer comes stale and is dropped, rule 1) and goes on
   at once. A factory that never returns keeps only its own worker.
7. **A resumed session's stop** (a durable session re-adopted by a new supervisor,
   ``Launched.generation``): it is announced ``adopted``, keeping its generation;
   where its stop, remove or timeout was under way when the last supervisor ended
   (``Launched.stop``), that input is fed at once after the adoption, so it ends as
   it would have (exited ``killed`` or ``timeout``, never restarted).

A start while the key runs stops it first (``exited(killed)``) and is deferred
until that teardown ends; a start while something else is in flight is deferred
too, and a stop, remove or close that comes meanwhile cancels it
(``CANCEL_STARTS``), as it cancels a start or restart being launched
(``ABORT``: its process is torn down without a ``created``). Stop always wins.
A generation number is taken only when its process is launched (``created``):
a start that fails or is cancelled does not use one.

The events come out in the key's order. An ``exited`` comes out while a teardown
of the key is outstanding (a natural exit's ``drain``, a root that ended while a
stop tears it down), with the teardown's answer, or, in ``failed``, when the root
ends after a failed teardown: the runtime holds one that comes while a teardown is
outstanding, and everything of the key after it, until that teardown has ended,
so that every teardown comes before its ``exited`` (the tests hold the table to
this).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, NamedTuple, Optional, Union

from .._status import ExitStatus
from ..table import Identity
from ._policy import Counters, RestartPolicy, decide

__all__ = [
    "IMPOSSIBLE",
    "SETTLED",
    "TABLE",
    "After",
    "Cell",
    "Effect",
    "Input",
    "Kind",
    "Machine",
    "MachineError",
    "State",
]


class MachineError(RuntimeError):
    """An input reached a cell the table marks IMPOSSIBLE: a bug of the runtime."""


# --- states, inputs, actions (plain data) ---------------------------------------------


class State(str, enum.Enum):
    GONE = "gone"                         # not in the supervisor: never started, or removed
    STARTING = "starting"                 # a caller's start (or adopt) is launching
    RUNNING = "running"                   # the generation runs; created was emitted
    STOPPING = "stopping"                 # our teardown runs; the root's exited is still due
    DRAINING = "draining"                 # a teardown runs; no exited is due (reported, or none)
    RESTART_PENDING = "restart_pending"   # the restart delay runs
    FRESHENING = "freshening"             # a restart waits for the fresh factory's args
    RELAUNCHING = "relaunching"           # a restart is launching
    ABORTING = "aborting"                 # a launch runs whose process will be discarded
    STOPPED = "stopped"                   # nothing runs; the key stays
    GAVE_UP = "gave_up"                   # nothing runs: the restart policy gave up
    FAILED = "failed"                     # a teardown failed; the root's exit is not known
    FAILED_EXITED = "failed_exited"       # a teardown failed; the root's exited was emitted
    CLOSED = "closed"                     # stopped by close(); terminal

    def __str__(self) -> str:
        return self.value


SETTLED = frozenset({State.GONE, State.RUNNING, State.RESTART_PENDING, State.FRESHENING,
                     State.STOPPED, State.GAVE_UP, State.FAILED, State.FAILED_EXITED,
                     State.CLOSED})
"""States where no call waits for what is in flight: entering one answers the
waiters (rule 5). (In ``freshening`` the factory runs, but no call waits for it:
rule 6.)"""


class Kind(str, enum.Enum):
    """The kinds of input: four calls, and the runtime's answers to actions."""

    START = "start"
    STOP = "stop"
    REMOVE = "remove"
    CLOSE = "close"
    EXITED = "exited"                     # answers Watch
    TIMER_FIRED = "timer_fired"           # answers SetTimer
    LAUNCHED = "launched"                 # answers Launch
    LAUNCH_FAILED = "launch_failed"       # answers Launch
    TEARDOWN_DONE = "teardown_done"       # answers Teardown
    TEARDOWN_FAILED = "teardown_failed"   # answers Teardown
    FRESH = "fresh"                       # answers AskFresh: the factory's args
    FRESH_FAILED = "fresh_failed"         # answers AskFresh: it raised, said stop, or was bad

    def __str__(self) -> str:
        return self.value


_CHANNEL = {Kind.EXITED: "watch", Kind.TIMER_FIRED: "timer", Kind.LAUNCHED: "launch",
            Kind.LAUNCH_FAILED: "launch", Kind.TEARDOWN_DONE: "teardown",
            Kind.TEARDOWN_FAILED: "teardown", Kind.FRESH: "fresh", Kind.FRESH_FAILED: "fresh"}
CHANNELS = ("launch", "watch", "teardown", "timer", "fresh")


@dataclass(frozen=True, eq=False)
class Spec:
    """What to run: args (None only for an adoption without args), the restart
    policy, the per-generation timeout, the Popen keywords; ``adopt`` names a
    running process to take over instead of starting one, and ``resume`` a durable
    session that outlived the supervisor that started it (the runtime's record of
    it: the machine only passes it on). ``output`` and ``pty`` say what the runtime
    opens for each generation (the machine never looks)."""

    args: Optional[tuple[Any, ...]]
    policy: Optional[RestartPolicy] = None
    timeout: Optional[float] = None
    popen_kwargs: Mapping[str, Any] = field(default_factory=dict)
    adopt: Optional[Identity] = None
    output: str = "inherit"
    pty: Optional[tuple[int, int]] = None
    resume: Any = None
    drop_output: bool = False


@dataclass(frozen=True)
class RootExit:
    """The root (the command itself) has ended; ``status`` None where unreadable."""

    status: Optional[ExitStatus]


@dataclass(frozen=True)
class Start:
    token: int
    spec: Spec
    kind: ClassVar[Kind] = Kind.START


@dataclass(frozen=True)
class Stop:
    token: int
    grace: Optional[float] = None
    kind: ClassVar[Kind] = Kind.STOP


@dataclass(frozen=True)
class Remove:
    token: int
    grace: Optional[float] = None
    kind: ClassVar[Kind] = Kind.REMOVE


@dataclass(frozen=True)
class Close:
    token: int
    grace: Optional[float] = None
    kind: ClassVar[Kind] = Kind.CLOSE


@dataclass(frozen=True)
class Exited:
    ticket: int
    status: Optional[ExitStatus]
    at: float
    kind: ClassVar[Kind] = Kind.EXITED


@dataclass(frozen=True)
class TimerFired:
    ticket: int
    at: float
    kind: ClassVar[Kind] = Kind.TIMER_FIRED


@dataclass(frozen=True)
class Launched:
    ticket: int
    identity: Identity
    at: float
    args: Optional[tuple[Any, ...]]  # what was started (a restart's fresh args)
    generation: Optional[int] = None  # a resumed session's own (it keeps its number)
    timeout: Optional[float] = None   # this generation's timeout, where not the spec's
    stop: Optional[str] = None        # a resumed session's stop that was under way
    kind: ClassVar[Kind] = Kind.LAUNCHED


@dataclass(frozen=True)
class LaunchFailed:
    ticket: int
    reason: str
    error: Optional[BaseException] = None
    kind: ClassVar[Kind] = Kind.LAUNCH_FAILED


@dataclass(frozen=True)
class TeardownDone:
    ticket: int
    root: Optional[RootExit] = None
    kind: ClassVar[Kind] = Kind.TEARDOWN_DONE


@dataclass(frozen=True)
class TeardownFailed:
    ticket: int
    survivors: tuple[Any, ...]
    reason: str
    error: Optional[BaseException] = None
    root: Optional[RootExit] = None
    kind: ClassVar[Kind] = Kind.TEARDOWN_FAILED


@dataclass(frozen=True)
class Fresh:
    ticket: int
    args: tuple[Any, ...]  # what the factory answered (checked by the runtime)
    kind: ClassVar[Kind] = Kind.FRESH


@dataclass(frozen=True)
class FreshFailed:
    ticket: int
    reason: str
    error: Optional[BaseException] = None
    kind: ClassVar[Kind] = Kind.FRESH_FAILED


Input = Union[Start, Stop, Remove, Close, Exited, TimerFired, Launched, LaunchFailed,
              TeardownDone, TeardownFailed, Fresh, FreshFailed]


@dataclass(frozen=True)
class AskFresh:
    """Call ``factory(key)`` where a blocking factory holds nothing else (a worker);
    answer Fresh with its args, or FreshFailed."""

    ticket: int
    factory: Callable[[Hashable], Any]


@dataclass(frozen=True)
class Launch:
    """Start spec (or attach to ``spec.adopt``); ``restart`` is None for a caller's
    start, else ``fresh`` or ``recover`` (for people: the args are in spec)."""

    ticket: int
    spec: Spec
    restart: Optional[str] = None


@dataclass(frozen=True)
class Watch:
    """Watch the launched root's exit; answer Exited."""

    ticket: int


@dataclass(frozen=True)
class Teardown:
    """Tear down the key's lineage (grace None: the supervisor's default). ``purpose``
    says why, for the runtime's records (a durable key's stop is recorded before it
    begins): ``stop``, ``remove``, ``close``, ``timeout``, ``settle`` (the root ended
    on its own) or ``discard`` (a launch that was cancelled)."""

    ticket: int
    grace: Optional[float] = None
    purpose: str = "stop"


@dataclass(frozen=True)
class SetTimer:
    ticket: int
    delay: float
    purpose: str  # "restart" or "timeout", for people


@dataclass(frozen=True)
class CancelTimer:
    ticket: int


@dataclass(frozen=True)
class Emit:
    """An event of the key (see proctable.supervise.Event)."""

    kind: str
    generation: int
    identity: Optional[Identity]
    status: Optional[str] = None
    exit: Optional[ExitStatus] = None
    reason: Optional[str] = None
    survivors: Optional[tuple[Any, ...]] = None


@dataclass(frozen=True)
class Failure:
    """Why a call failed: ``unknown_key``, ``closed``, ``cancelled`` (a stop-like call
    came first), ``launch_failed`` (``error``
    is the exception the launch raised) or ``teardown_failed`` (``survivors``)."""

    kind: str
    message: str
    error: Optional[BaseException] = None
    survivors: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Reply:
    """Answer a call: its value, or its failure, or ``retry`` (feed it again)."""

    token: int
    value: Any = None
    failure: Optional[Failure] = None
    retry: bool = False


Action = Union[AskFresh, Launch, Watch, Teardown, SetTimer, CancelTimer, Emit, Reply]


class After(enum.IntEnum):
    """What a teardown is for; the strongest asked for wins (rule 2)."""

    SETTLE = 0   # the root ended on its own: let the restart policy decide
    STAY = 1     # stop: keep the key
    DELETE = 2   # remove: delete the key
    CLOSE = 3    # close: the key is closed


_LEVEL = {Kind.START: After.STAY, Kind.STOP: After.STAY, Kind.REMOVE: After.DELETE,
          Kind.CLOSE: After.CLOSE}

KILLED = "killed"
TIMEOUT = "timeout"
_PURPOSE = {After.SETTLE: "settle", After.STAY: "stop", After.DELETE: "remove",
            After.CLOSE: "close"}


# --- the table -------------------------------------------------------------------------


class Effect(str, enum.Enum):
    """The recipes a cell runs, in order (see Machine._effect)."""

    CANCEL_TIMER = "cancel_timer"      # cancel the outstanding timer (restart or timeout)
    LAUNCH = "launch"                  # launch the caller's spec; the caller waits for it
    RELAUNCH = "relaunch"              # the restart the policy decided: ask fresh, or launch
    CANCEL_FRESH = "cancel_fresh"      # forget the outstanding ask (its answer comes stale)
    LAUNCH_FRESH = "launch_fresh"      # launch the restart with the factory's args
    CREATED = "created"                # a caller's launch worked: a new generation
    RECREATED = "recreated"            # a restart's launch worked: a new generation
    NOT_STARTED = "not_started"        # a caller's launch failed: the caller gets the error
    GAVE_UP = "gave_up"                # a restart's factory or launch failed: gave_up
    NOT_RESTARTED = "not_restarted"    # a natural exit's teardown failed: gave_up (rule 4)
    DISCARD = "discard"                # a launch that was cancelled worked: tear it down
    TEAR_DOWN = "tear_down"            # tear the running generation down (reason killed)
    TIME_OUT = "time_out"              # its timeout ran out: tear it down (reason timeout)
    DRAIN = "drain"                    # the root ended on its own: exited, tear down the rest
    REPORT_EXIT = "report_exit"        # the root ended while we stop it: exited(reason)
    REPORT_ROOT = "report_root"        # the teardown answered: exited(reason), root known gone
    FAILURE = "failure"                # the teardown failed: teardown_failed(survivors)
    RETRY = "retry"                    # tear down again after a failure
    ABORT = "abort"                    # a launch runs: discard what it starts
    RAISE = "raise"                    # raise the teardown's purpose (rule 2)
    JOIN = "join"                      # the caller waits for the key to settle
    DEFER = "defer"                    # the call is fed again once the key settles
    CANCEL_STARTS = "cancel_starts"    # a stop-like call cancels the starts still deferred
    DELETE = "delete"                  # deleted
    REFUSE_UNKNOWN = "refuse_unknown"  # KeyError
    REFUSE_CLOSED = "refuse_closed"    # the supervisor is closed
    REFUSE_FAILED = "refuse_failed"    # survivors of a failed teardown: stop() it first


class _Rule(str, enum.Enum):
    AFTER = "after"            # rule 2
    ORIGIN = "origin"          # rule 3
    ROOT_KNOWN = "root_known"  # rule 4
    RESTART = "restart"        # rule 6


class Cell(NamedTuple):
    next: Union[State, _Rule, None]   # None: IMPOSSIBLE
    effects: tuple[Effect, ...] = ()


IMPOSSIBLE = Cell(None)

S, K, E = State, Kind, Effect
_X = IMPOSSIBLE
_STOPS = (K.STOP, K.REMOVE, K.CLOSE)


def _row(start: Cell, stop: Cell, remove: Cell, close: Cell, exited: Cell = _X,
         timer_fired: Cell = _X, launched: Cell = _X, launch_failed: Cell = _X,
         teardown_done: Cell = _X, teardown_failed: Cell = _X, fresh: Cell = _X,
         fresh_failed: Cell = _X) -> dict[Kind, Cell]:
    """One state's cells, every input named (the answers default to IMPOSSIBLE)."""
    return {K.START: start, K.STOP: stop, K.REMOVE: remove, K.CLOSE: close,
            K.EXITED: exited, K.TIMER_FIRED: timer_fired, K.LAUNCHED: launched,
            K.LAUNCH_FAILED: launch_failed, K.TEARDOWN_DONE: teardown_done,
            K.TEARDOWN_FAILED: teardown_failed, K.FRESH: fresh, K.FRESH_FAILED: fresh_failed}


_teardown_stop = Cell(S.STOPPING, (E.CANCEL_TIMER, E.TEAR_DOWN, E.JOIN))
_abort_stop = Cell(S.ABORTING, (E.CANCEL_STARTS, E.ABORT, E.JOIN))

TABLE: dict[State, dict[Kind, Cell]] = {
    S.GONE: _row(
        start=Cell(S.STARTING, (E.LAUNCH,)),
        stop=Cell(S.GONE, (E.REFUSE_UNKNOWN,)),
        remove=Cell(S.GONE, (E.REFUSE_UNKNOWN,)),
        close=Cell(S.GONE, (E.JOIN,)),
    ),
    S.STARTING: _row(
        start=Cell(S.STARTING, (E.DEFER,)),
        stop=_abort_stop,                         # the start fails: no generation after a stop
        remove=_abort_stop,
        close=_abort_stop,                        # close makes a concurrent start fail
        launched=Cell(S.RUNNING, (E.CREATED,)),
        launch_failed=Cell(_Rule.ORIGIN, (E.NOT_STARTED,)),
    ),
    S.RUNNING: _row(
        start=Cell(S.STOPPING, (E.CANCEL_TIMER, E.TEAR_DOWN, E.DEFER)),
        stop=_teardown_stop,
        remove=_teardown_stop,
        close=_teardown_stop,
        exited=Cell(S.DRAINING, (E.CANCEL_TIMER, E.DRAIN)),
        timer_fired=Cell(S.STOPPING, (E.TIME_OUT,)),
    ),
    S.STOPPING: _row(
        start=Cell(S.STOPPING, (E.DEFER,)),
        stop=Cell(S.STOPPING, (E.CANCEL_STARTS, E.JOIN)),
        remove=Cell(S.STOPPING, (E.CANCEL_STARTS, E.JOIN)),
        close=Cell(S.STOPPING, (E.CANCEL_STARTS, E.JOIN)),
        exited=Cell(S.DRAINING, (E.REPORT_EXIT,)),
        teardown_done=Cell(_Rule.AFTER, (E.REPORT_ROOT,)),
        teardown_failed=Cell(_Rule.ROOT_KNOWN, (E.REPORT_ROOT, E.FAILURE)),
    ),
    S.DRAINING: _row(
        start=Cell(S.DRAINING, (E.RAISE, E.DEFER)),   # a start cancels the restart decision
        stop=Cell(S.DRAINING, (E.CANCEL_STARTS, E.JOIN)),
        remove=Cell(S.DRAINING, (E.CANCEL_STARTS, E.JOIN)),
        close=Cell(S.DRAINING, (E.CANCEL_STARTS, E.JOIN)),
        teardown_done=Cell(_Rule.AFTER),
        teardown_failed=Cell(S.FAILED_EXITED, (E.FAILURE, E.NOT_RESTARTED)),
    ),
    S.RESTART_PENDING: _row(
        start=Cell(S.STARTING, (E.CANCEL_TIMER, E.LAUNCH)),
        stop=Cell(S.STOPPED, (E.CANCEL_TIMER, E.JOIN)),
        remove=Cell(S.GONE, (E.CANCEL_TIMER, E.DELETE, E.JOIN)),
        close=Cell(S.CLOSED, (E.CANCEL_TIMER, E.JOIN)),
        timer_fired=Cell(_Rule.RESTART, (E.RELAUNCH,)),
    ),
    S.FRESHENING: _row(                           # nothing waits for the factory (rule 6)
        start=Cell(S.STARTING, (E.CANCEL_FRESH, E.LAUNCH)),
        stop=Cell(S.STOPPED, (E.CANCEL_FRESH, E.JOIN)),
        remove=Cell(S.GONE, (E.CANCEL_FRESH, E.DELETE, E.JOIN)),
        close=Cell(S.CLOSED, (E.CANCEL_FRESH, E.JOIN)),
        fresh=Cell(S.RELAUNCHING, (E.LAUNCH_FRESH,)),
        fresh_failed=Cell(S.GAVE_UP, (E.GAVE_UP,)),
    ),
    S.RELAUNCHING: _row(
        start=Cell(S.ABORTING, (E.ABORT, E.DEFER)),
        stop=_abort_stop,                         # no generation starts after a stop
        remove=_abort_stop,
        close=_abort_stop,
        launched=Cell(S.RUNNING, (E.RECREATED,)),
        launch_failed=Cell(S.GAVE_UP, (E.GAVE_UP,)),
    ),
    S.ABORTING: _row(
        start=Cell(S.ABORTING, (E.RAISE, E.DEFER)),
        stop=Cell(S.ABORTING, (E.CANCEL_STARTS, E.JOIN)),
        remove=Cell(S.ABORTING, (E.CANCEL_STARTS, E.JOIN)),
        close=Cell(S.ABORTING, (E.CANCEL_STARTS, E.JOIN)),
        launched=Cell(S.DRAINING, (E.DISCARD,)),
        launch_failed=Cell(_Rule.AFTER),
    ),
    S.STOPPED: _row(
        start=Cell(S.STARTING, (E.LAUNCH,)),
        stop=Cell(S.STOPPED, (E.JOIN,)),
        remove=Cell(S.GONE, (E.DELETE, E.JOIN)),
        close=Cell(S.CLOSED, (E.JOIN,)),
    ),
    S.GAVE_UP: _row(                              # as stopped; the state tells why
        start=Cell(S.STARTING, (E.LAUNCH,)),
        stop=Cell(S.GAVE_UP, (E.JOIN,)),
        remove=Cell(S.GONE, (E.DELETE, E.JOIN)),
        close=Cell(S.CLOSED, (E.JOIN,)),
    ),
    S.FAILED: _row(
        start=Cell(S.FAILED, (E.REFUSE_FAILED,)),
        stop=Cell(S.STOPPING, (E.RETRY, E.JOIN)),
        remove=Cell(S.STOPPING, (E.RETRY, E.JOIN)),
        close=Cell(S.STOPPING, (E.RETRY, E.JOIN)),
        exited=Cell(S.FAILED_EXITED, (E.REPORT_EXIT,)),
    ),
    S.FAILED_EXITED: _row(
        start=Cell(S.FAILED_EXITED, (E.REFUSE_FAILED,)),
        stop=Cell(S.DRAINING, (E.RETRY, E.JOIN)),
        remove=Cell(S.DRAINING, (E.RETRY, E.JOIN)),
        close=Cell(S.DRAINING, (E.RETRY, E.JOIN)),
    ),
    S.CLOSED: _row(
        start=Cell(S.CLOSED, (E.REFUSE_CLOSED,)),
        stop=Cell(S.CLOSED, (E.JOIN,)),
        remove=Cell(S.CLOSED, (E.JOIN,)),
        close=Cell(S.CLOSED, (E.JOIN,)),
    ),
}

OUTSTANDING: dict[State, frozenset[str]] = {
    S.GONE: frozenset(),
    S.STARTING: frozenset({"launch"}),
    S.RUNNING: frozenset({"watch", "timer"}),
    S.STOPPING: frozenset({"watch", "teardown"}),
    S.DRAINING: frozenset({"teardown"}),
    S.RESTART_PENDING: frozenset({"timer"}),
    S.FRESHENING: frozenset({"fresh"}),
    S.RELAUNCHING: frozenset({"launch"}),
    S.ABORTING: frozenset({"launch"}),
    S.STOPPED: frozenset(),
    S.GAVE_UP: frozenset(),
    S.FAILED: frozenset({"watch"}),
    S.FAILED_EXITED: frozenset(),
    S.CLOSED: frozenset(),
}
"""The channels whose answer may be outstanding in each state (at most these;
RUNNING has a timer only with a timeout). An answer on any other channel is
IMPOSSIBLE in that state's row, and the tests hold the table to that."""


# --- the machine -----------------------------------------------------------------------


class Machine:
    """One key's state and the data its transitions need; ``feed`` is the only way in."""

    def __init__(self, key: Hashable, generation: int = 0,
                 tickets: Optional[Callable[[], int]] = None) -> None:
        self.key = key
        self.state = State.GONE
        self.generation = generation      # of the last process launched (created)
        self.identity: Optional[Identity] = None
        self.spec: Optional[Spec] = None  # what that generation runs
        self.counters = Counters()
        self.started_at = 0.0
        self.reason = KILLED              # the exited status of a generation we stop
        self.after = After.STAY
        self.restart: Optional[str] = None  # "fresh" or "recover" while restart_pending
        self.failure: Optional[Failure] = None
        self._exit: Optional[ExitStatus] = None  # the natural exit the policy decides on
        self._uptime = 0.0
        self._launching: Optional[Spec] = None
        self._origin = State.GONE
        self._tearing: Optional[Identity] = None  # whose lineage the teardown in flight ends
        self._tickets: dict[str, Optional[int]] = dict.fromkeys(CHANNELS)
        # Where tickets come from: the runtime shares one count between a key's
        # machines, so that a late answer to a machine it dropped (a removed key)
        # can never match a ticket of the key's next machine.
        self._next_ticket = tickets if tickets is not None else itertools.count(1).__next__
        self._start_waiters: list[int] = []
        self._stop_waiters: list[int] = []
        self._deferred: list[tuple[int, Kind]] = []
        self._stop_exit: Optional[ExitStatus] = None

    def __repr__(self) -> str:
        return f"<Machine {self.key!r} {self.state} generation={self.generation}>"

    @property
    def outstanding(self) -> frozenset[str]:
        """The channels with an answer outstanding."""
        return frozenset(ch for ch, t in self._tickets.items() if t is not None)

    def ticket(self, channel: str) -> Optional[int]:
        """The outstanding ticket of channel (for tests and the runtime's logs)."""
        return self._tickets[channel]

    @property
    def busy(self) -> bool:
        return self.state not in SETTLED

    def feed(self, inp: Input) -> list[Action]:
        """Take one input; the actions to carry out, in order."""
        channel = _CHANNEL.get(inp.kind)
        if channel is not None:
            ticket = getattr(inp, "ticket", None)
            if ticket is None or self._tickets[channel] != ticket:
                return []  # rule 1: stale
            self._tickets[channel] = None
        cell = TABLE[self.state][inp.kind]
        if cell.next is None:
            raise MachineError(f"{inp.kind} cannot happen in state {self.state} (key {self.key!r})")
        out: list[Action] = []
        for effect in cell.effects:
            self._effect(effect, inp, out)
        target = cell.next if isinstance(cell.next, State) else self._resolve(cell.next, out)
        self.state = target
        if target in SETTLED:
            self._settle(out)
        if isinstance(inp, Launched) and inp.stop is not None and target is State.RUNNING:
            # Rule 7: a resumed session whose stop (or timeout) was under way when its
            # supervisor ended is stopped at once, as its own stop would have: adopted,
            # then exited with the stop's status, never a restart.
            out += self.feed(Remove(0) if inp.stop == "remove" else Stop(0))
            if inp.stop == "timeout":
                self.reason = TIMEOUT
        return out

    # -- rules 2-5 ------------------------------------------------------------------

    def _resolve(self, rule: _Rule, out: list[Action]) -> State:
        if rule is _Rule.ORIGIN:
            return self._origin
        if rule is _Rule.ROOT_KNOWN:
            return State.FAILED if self._tickets["watch"] is not None else State.FAILED_EXITED
        if rule is _Rule.RESTART:
            return State.FRESHENING if self._tickets["fresh"] is not None else State.RELAUNCHING
        # AFTER
        if self._origin is State.GONE:
            return State.GONE  # a start from nothing was cancelled: the key never came to be
        if self.after is After.CLOSE:
            return State.CLOSED
        if self.after is After.DELETE:
            self._emit(out, "deleted")
            return State.GONE
        if self.after is After.STAY:
            return State.STOPPED
        return self._decide(out)

    def _decide(self, out: list[Action]) -> State:
        """The root ended on its own and its lineage is gone: restart or not."""
        spec = self.spec
        policy = None if spec is None else spec.policy
        if spec is None or policy is None:
            return State.STOPPED
        d = decide(policy, self.counters, self._exit, self._uptime)
        self.counters = d.counters
        if d.action == "give_up":
            self._emit(out, "gave_up", reason=d.reason)
            return State.GAVE_UP
        if spec.args is None and (d.action == "recover" or policy.fresh is None):
            self._emit(out, "gave_up", reason=f"{d.reason}, but the args to run are unknown "
                       "(adopted without args)")
            return State.GAVE_UP
        reason = d.reason
        if d.action == "recover":  # say what reruns: after a fresh rerun, the fresh args
            reason = f"{reason}, {list(spec.args or ())!r}"
        self._emit(out, "restarting", reason=reason)
        self.restart = d.action
        out.append(SetTimer(self._issue("timer"), policy.delay, "restart"))
        return State.RESTART_PENDING

    def _settle(self, out: list[Action]) -> None:
        failed = self.failure if self.state in (State.FAILED, State.FAILED_EXITED) else None
        for t in self._stop_waiters:
            out.append(Reply(t, value=self._stop_exit, failure=failed))
        for t in self._start_waiters:  # a start that was cancelled, or whose teardown failed
            out.append(Reply(t, failure=failed or (
                Failure("closed", "the supervisor was closed while this start ran")
                if self.after is After.CLOSE else
                Failure("cancelled", f"a stop or remove of key {self.key!r} came while this "
                        "start ran: stop always wins"))))
        for t, _kind in self._deferred:
            out.append(Reply(t, retry=True))
        self._stop_waiters, self._start_waiters, self._deferred = [], [], []
        self._stop_exit = None

    # -- the effects --------------------------------------------------------------------

    def _issue(self, channel: str) -> int:
        t = self._next_ticket()
        self._tickets[channel] = t
        return t

    def _emit(self, out: list[Action], kind: str, identity: Optional[Identity] = None,
              **fields: Any) -> None:
        out.append(Emit(kind, self.generation, identity or self.identity, **fields))

    def _effect(self, effect: Effect, inp: Input, out: list[Action]) -> None:
        grace = getattr(inp, "grace", None)
        token = getattr(inp, "token", 0)
        if effect is E.CANCEL_TIMER:
            t = self._tickets["timer"]
            if t is not None:
                self._tickets["timer"] = None
                out.append(CancelTimer(t))
        elif effect is E.LAUNCH:
            assert isinstance(inp, Start)
            self._origin = (self.state if self.state in (State.GONE, State.GAVE_UP)
                            else State.STOPPED)
            self._launching = inp.spec
            self._start_waiters.append(token)
            out.append(Launch(self._issue("launch"), inp.spec))
        elif effect is E.RELAUNCH:
            assert self.spec is not None
            self._launching = replace(self.spec, adopt=None, resume=None)
            policy = self.spec.policy
            if self.restart == "fresh" and policy is not None and policy.fresh is not None:
                out.append(AskFresh(self._issue("fresh"), policy.fresh))
            else:
                out.append(Launch(self._issue("launch"), self._launching, self.restart))
        elif effect is E.CANCEL_FRESH:
            self._tickets["fresh"] = None  # the factory runs on; its answer is stale now
        elif effect is E.LAUNCH_FRESH:
            assert isinstance(inp, Fresh) and self._launching is not None
            self._launching = replace(self._launching, args=inp.args)
            out.append(Launch(self._issue("launch"), self._launching, self.restart))
        elif effect in (E.CREATED, E.RECREATED):
            assert isinstance(inp, Launched) and self._launching is not None
            # A resumed session keeps the generation it had: announced as adopted.
            self.generation = self.generation + 1 if inp.generation is None else inp.generation
            self.identity = inp.identity
            self.spec = replace(self._launching, args=inp.args)
            self.started_at = inp.at
            self._origin = State.STOPPED  # the key exists now
            self.restart = None
            self.failure = None
            if effect is E.CREATED:
                self.counters = Counters()  # budgets start afresh with every start and adoption
                for t in self._start_waiters:
                    out.append(Reply(t, value=inp.identity))
                self._start_waiters = []
            self._emit(out, "created" if inp.generation is None else "adopted")
            out.append(Watch(self._issue("watch")))
            timeout = inp.timeout if inp.timeout is not None else self.spec.timeout
            if timeout is not None and inp.stop is None:
                out.append(SetTimer(self._issue("timer"), timeout, "timeout"))
        elif effect is E.NOT_STARTED:
            assert isinstance(inp, LaunchFailed)
            failure = Failure("launch_failed", inp.reason, inp.error)
            for t in self._start_waiters:
                out.append(Reply(t, failure=failure))
            self._start_waiters = []
        elif effect is E.GAVE_UP:
            assert isinstance(inp, (LaunchFailed, FreshFailed))
            self._emit(out, "gave_up", reason=inp.reason)
        elif effect is E.NOT_RESTARTED:
            assert isinstance(inp, TeardownFailed)
            policy = None if self.spec is None else self.spec.policy
            if self.after is After.SETTLE and policy is not None:
                self._emit(out, "gave_up", reason=(
                    "not restarting: the lineage of the run that ended could not be proven "
                    f"gone ({inp.reason}); stop() the key to retry its teardown"))
        elif effect is E.DISCARD:
            assert isinstance(inp, Launched)
            self._tearing = inp.identity
            out.append(Teardown(self._issue("teardown"), purpose="discard"))
        elif effect is E.TEAR_DOWN:
            self.reason = KILLED
            self.after = _LEVEL[inp.kind]
            self._tearing = self.identity
            out.append(Teardown(self._issue("teardown"), grace, _PURPOSE[self.after]))
        elif effect is E.TIME_OUT:
            self.reason = TIMEOUT
            self.after = After.STAY
            self._tearing = self.identity
            out.append(Teardown(self._issue("teardown"), purpose="timeout"))
        elif effect is E.DRAIN:
            assert isinstance(inp, Exited)
            self._exit = inp.status
            self._uptime = max(0.0, inp.at - self.started_at)
            signaled = inp.status is not None and inp.status.signal is not None
            self._emit(out, "exited", status="signaled" if signaled else "exited",
                       exit=inp.status)
            self.after = After.SETTLE
            self._tearing = self.identity
            out.append(Teardown(self._issue("teardown"), purpose="settle"))
        elif effect is E.REPORT_EXIT:
            assert isinstance(inp, Exited)
            self._stop_exit = inp.status
            self._emit(out, "exited", status=self.reason, exit=inp.status)
        elif effect is E.REPORT_ROOT:
            assert isinstance(inp, (TeardownDone, TeardownFailed))
            if isinstance(inp, TeardownDone) or inp.root is not None:
                status = None if inp.root is None else inp.root.status
                self._stop_exit = status
                self._emit(out, "exited", status=self.reason, exit=status)
                self._tickets["watch"] = None  # proven gone: a later exit notice is stale
        elif effect is E.FAILURE:
            assert isinstance(inp, TeardownFailed)
            self.failure = Failure("teardown_failed", inp.reason, inp.error, inp.survivors)
            self._emit(out, "teardown_failed", identity=self._tearing, reason=inp.reason,
                       survivors=inp.survivors)
        elif effect is E.RETRY:
            self.after = _LEVEL[inp.kind]
            self._tearing = self.identity
            out.append(Teardown(self._issue("teardown"), grace, _PURPOSE[self.after]))
        elif effect is E.ABORT:
            self.after = _LEVEL[inp.kind]
        elif effect is E.RAISE:
            self.after = max(self.after, _LEVEL[inp.kind])
        elif effect is E.JOIN:
            if self.busy:
                self.after = max(self.after, _LEVEL[inp.kind])
            self._stop_waiters.append(token)
        elif effect is E.DEFER:
            self._deferred.append((token, inp.kind))
        elif effect is E.CANCEL_STARTS:
            closed = inp.kind is Kind.CLOSE
            failure = Failure("closed" if closed else "cancelled",
                              "the supervisor was closed" if closed else
                              f"a {inp.kind} of key {self.key!r} came first: stop always wins")
            for t, kind in self._deferred:
                if kind is Kind.START:
                    out.append(Reply(t, failure=failure))
            self._deferred = [(t, k) for t, k in self._deferred if k is not Kind.START]
        elif effect is E.DELETE:
            self._emit(out, "deleted")
        elif effect is E.REFUSE_UNKNOWN:
            out.append(Reply(token, failure=Failure("unknown_key", f"no key {self.key!r}")))
        elif effect is E.REFUSE_CLOSED:
            out.append(Reply(token, failure=Failure("closed", "this Supervisor is closed")))
        elif effect is E.REFUSE_FAILED:
            f = self.failure
            out.append(Reply(token, failure=Failure(
                "teardown_failed",
                f"key {self.key!r} still has members from a failed teardown; stop() it first"
                + (f" ({f.message})" if f is not None else ""),
                None if f is None else f.error, () if f is None else f.survivors)))
        else:  # pragma: no cover - every Effect has a branch above
            raise AssertionError(effect)
