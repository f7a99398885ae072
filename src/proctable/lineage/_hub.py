"""The shared proc-connector hub: one netlink socket per process, for every lineage.

Each lineage subscribes with its interest; one hub thread reads the socket and
hands each lineage only the events about it, waking only that lineage. (One
socket per lineage would queue every event on the host once per lineage, and
wake every lineage on every fork.)

A subscription's interest:

- ``pids``: tgids whose process forks, exits and setsids concern the lineage (its
  live members). A *following* subscription (the scan backend) also gets the
  forks of every child those pids fork, at once, in event order: the hub adds the
  child to ``pids`` itself, so a chain of forks whose links exit before the
  lineage could look is still followed. A leader's exit event takes its pid out
  (its pid may be reused after that); the lineage puts a member whose main thread
  exited but whose process lives back in (:meth:`Subscription.track`).
- ``ids``: numbers (recorded process-group and session ids) whose reuse concerns
  the lineage: a process forked with that pid is handed over, so that a lineage
  can tell that the number may name another group now.

The kernel drops the rest (a socket filter over the union of all interests), so a
busy host does not wake the hub, except that a following subscription needs every
process fork (a new thread is filtered out) and every exit of a process (a child
followed at its fork may exit before the filter names it: were its exit dropped,
its pid would stay followed after the kernel gave it to an unrelated process).
When the socket overflows (``ENOBUFS``) every subscription's ``overruns`` goes
up: it must look at /proc in full, any proof that rested on an unbroken stream is
void, and the followed children are dropped (their exits may have been lost).

Before the first subscription the hub checks that the events name pids as this
process sees them (in a private pid namespace they carry the initial namespace's
pids, which would be wrong here): where not, it is unavailable, as without the
connector.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Callable, Optional

from .._fdwait import readable
from .._threads import NoThread, start_thread
from ._procconn import EXIT, FORK, SID, Event, Overrun, ProcConnector, switched_off

__all__ = ["Hub", "Subscription", "hub_thread_id", "subscribe"]

log = logging.getLogger("proctable.lineage")

_SELF_TEST_SECONDS = 0.2
FOLLOW_SECONDS = 5.0
COALESCE_SECONDS = 0.01
LINGER_SECONDS = 2.0
"""How long the hub outlives its last subscription (every event dropped by the
filter meanwhile): lineages that follow one another, a harness's tool commands,
share one socket and thread instead of making and joining them each time."""


class Subscription:
    """One lineage's share of the event stream. Every method is thread-safe."""

    def __init__(self, hub: Hub, wake: Callable[[], None], follow_forks: bool) -> None:
        self._hub = hub
        self._wake = wake
        self.follow_forks = follow_forks
        self.tracked: set[int] = set()
        """The lineage's live members, as it last said (:meth:`track`)."""
        self.followed: dict[int, float] = {}
        """Children of tracked or followed pids the hub saw forked (following
        subscriptions only), with when: dropped at their exit event, or after
        FOLLOW_SECONDS (a live one is tracked by then, once recorded)."""
        self.ids: set[int] = set()
        self._queue: deque[Event] = deque()
        self._exits: set[int] = set()
        """Tracked pids whose leader's exit is queued but not taken yet: the lineage
        has not seen it, so a :meth:`track` of them now must not put them back."""
        self.overruns = 0
        """How many times events were lost since the subscription began."""
        self.broken = False
        """The stream failed (its socket gave an error): no more events will come."""
        self.closed = False

    @property
    def pids(self) -> set[int]:
        return self.tracked | set(self.followed)

    def track(self, pids: Iterable[int]) -> None:
        """These are the lineage's live members now: their forks, exits and setsids
        are its events (again, for one whose leader's exit event took it out while
        its other threads live on). Queued events are handed out first."""
        new = set(pids)
        with self._hub._lock:
            if new == self.tracked:
                return  # (no read of the socket: that is the hub thread's work)
            self._hub._pump_locked()
            # A pid whose exit was read but not yet taken is not put back: the
            # lineage's list predates that exit, and once the kernel reuses the pid
            # its new process's forks would be taken for the member's.
            self.tracked = new - self._exits
            self._hub._dirty = True

    def watch(self, ids: Iterable[int]) -> None:
        """Hand over every process forked with one of these pids, from now on
        (the filter lets every process fork in for a following subscription)."""
        with self._hub._lock:
            self._hub._pump_locked()
            self.ids = set(ids)

    def follow(self) -> None:
        """From now on, follow forks of forks too (a lineage whose reaper died:
        an orphan no longer stays below it, so only its fork events find it)."""
        with self._hub._lock:
            if not self.follow_forks:
                self.follow_forks = True
                self._hub._refilter_locked()  # now: the next fork may be the one

    def take(self) -> list[Event]:
        """The events handed to this subscription so far, in order."""
        out = []
        q = self._queue
        with self._hub._lock:
            while q:
                out.append(q.popleft())
            self._exits.clear()
        return out

    def sync(self) -> None:
        """Read the socket now: every event the kernel queued before this call is
        handed out (or counted as an overrun) when it returns."""
        self._hub.pump()

    def close(self) -> None:
        self._hub._unsubscribe(self)


class Hub:
    """The one proc-connector socket of this process, and its thread."""

    def __init__(self, conn: ProcConnector) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._subs: list[Subscription] = []
        self._dirty = True
        self._expire_due = 0.0
        self._filter: Optional[tuple[Optional[frozenset[int]], bool]] = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closed = False
        self._freed = False
        self._idle_since: Optional[float] = None  # the last subscription left then
        try:
            self.thread = start_thread(self._run, "proctable-lineage-events")
        except NoThread:
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            raise

    # -- subscriptions --------------------------------------------------------------

    def _subscribe(self, wake: Callable[[], None], follow_forks: bool) -> Subscription:
        sub = Subscription(self, wake, follow_forks)
        with self._lock:
            self._pump_locked()
            self._idle_since = None
            self._subs.append(sub)
            self._dirty = True
            self._refilter_locked()
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with _hub_lock, self._lock:  # the order subscribe() takes them in
            if sub.closed:
                return
            sub.closed = True
            if sub in self._subs:
                self._subs.remove(sub)
            self._dirty = True
            if self._subs:
                return
            if not self._closed:
                # The last one: the hub lingers (LINGER_SECONDS), hearing nothing,
                # and its thread ends it unless a lineage subscribes meanwhile.
                self._idle_since = time.monotonic()
                self._refilter_locked()
                self._poke_locked()
                return
            self._poke_locked()  # its thread ends at once
        # A failed stream (closed by _pump_locked) that nobody uses any more.
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=5.0)
        self._free()

    def _poke_locked(self) -> None:
        if not self._freed:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass  # a wake-up is pending already

    def _retire(self) -> bool:
        """End the hub if it has lingered long enough unused (its thread calls
        this); True when it is closed."""
        global _hub
        with _hub_lock, self._lock:
            if self._closed:
                return True
            idle = self._idle_since
            if self._subs or idle is None or time.monotonic() < idle + LINGER_SECONDS:
                return False
            self._closed = True
            if _hub is self:
                _hub = None
        self._free()
        return True

    def _free(self) -> None:
        """Close the socket and the wake-up pipe, once."""
        with self._lock:
            if self._freed:
                return
            self._freed = True
            self._conn.close()
            _close_quietly(self._wake_r, self._wake_w)

    # -- reading and handing out ----------------------------------------------------

    def pump(self) -> None:
        with self._lock:
            if not self._closed:
                self._pump_locked()

    def _pump_locked(self) -> None:
        try:
            events = self._conn.read()
        except Overrun:
            for sub in self._subs:
                sub.overruns += 1
                # A followed child's exit may be among the lost events: its pid may
                # name an unrelated process by now, whose forks are not ours. Stop
                # following them (the lineage's full looks find what they started).
                if sub.followed:
                    sub.followed.clear()
                    self._dirty = True
                sub._wake()
            self._refilter_locked()
            return
        except OSError as e:
            # The socket itself failed (closed under us, or an error the kernel will
            # keep giving): every lineage loses the stream and says so; a later
            # lineage starts a new hub.
            global _hub
            log.warning("lineage events: the proc connector failed (%s): lineages follow "
                        "by looking at /proc only", e)
            for sub in self._subs:
                sub.overruns += 1
                sub.broken = True
                sub._wake()
            self._closed = True
            if _hub is self:
                _hub = None
            return
        woken: set[int] = set()
        subs = self._subs
        now = time.monotonic()
        for ev in events:
            what, a, b, c, d = ev
            if what == FORK:
                if c != d:
                    continue  # a new thread
                for i, sub in enumerate(subs):
                    if b in sub.tracked or b in sub.followed:
                        if sub.follow_forks:
                            sub.followed[d] = now  # its forks and exit are ours too
                            self._dirty = True
                        sub._queue.append(ev)
                        woken.add(i)
                    elif d in sub.ids:
                        sub._queue.append(ev)
                        woken.add(i)
            elif what == EXIT:
                if a != b:
                    continue  # a thread that is not the leader
                for i, sub in enumerate(subs):
                    if b in sub.tracked or b in sub.followed:
                        # Its pid may be reused from now on. (A member whose main
                        # thread exited lives on: its lineage tracks it again.)
                        if b in sub.tracked:
                            sub.tracked.discard(b)
                            sub._exits.add(b)
                        sub.followed.pop(b, None)
                        sub._queue.append(ev)
                        woken.add(i)
            elif what == SID:
                for i, sub in enumerate(subs):
                    if b in sub.tracked or b in sub.followed:
                        sub._queue.append(ev)
                        woken.add(i)
        for i in woken:
            subs[i]._wake()
        if now >= self._expire_due:
            self._expire_due = now + 1.0
            for sub in subs:
                old = [p for p, t in sub.followed.items() if now - t > FOLLOW_SECONDS]
                for p in old:
                    del sub.followed[p]
                if old:
                    self._dirty = True
        if self._dirty:
            self._refilter_locked()

    def _refilter_locked(self) -> None:
        self._dirty = False
        follow = any(s.follow_forks for s in self._subs)
        pids: set[int] = set()
        for s in self._subs:
            pids |= s.tracked
            pids.update(s.followed)
        want = (frozenset(pids), follow)
        if want == self._filter:
            return
        try:
            self._conn.only_about(pids, follow)
            self._filter = want
        except OSError as e:
            log.debug("lineage events: no socket filter: %s", e)
            self._filter = None

    def _is_closed(self) -> bool:
        return self._closed

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            with self._lock:
                unused = self._closed and not self._subs
            if unused:
                self._free()

    def _loop(self) -> None:
        fds = [self._conn.fileno(), self._wake_r]
        while True:
            with self._lock:
                if self._closed:
                    return
                idle = None if self._subs else self._idle_since
            timeout = 1.0
            if idle is not None:
                left = idle + LINGER_SECONDS - time.monotonic()
                if left <= 0:
                    if self._retire():
                        return
                    continue
                timeout = min(timeout, left)
            try:
                r = readable(fds, timeout)
            except OSError:
                break
            if self._is_closed():  # _unsubscribe() may have run while we waited
                break
            if self._wake_r in r:
                try:
                    while os.read(self._wake_r, 64):
                        pass
                except OSError:
                    pass
            if r:
                self.pump()
            if self._conn.fileno() in r:
                # Events flow: let more queue before the next wake-up, which costs
                # more than reading them. Their order is kept, so a fork chain is
                # followed all the same; a lineage that must see everything now
                # reads the socket itself (Subscription.sync).
                readable([self._wake_r], COALESCE_SECONDS)


# -- the one hub of this process ------------------------------------------------------

_hub: Optional[Hub] = None
_hub_lock = threading.Lock()
_usable: Optional[bool] = None  # do events name pids as this process sees them?


def _self_test(conn: ProcConnector) -> bool:
    """Start a thread: its fork event must name our pid and its tid as this process
    sees them. The kernel queues the event before the thread starts running, so it
    is there to read at once (a moment of grace, a retry after an overrun). (A
    thread's event names our parent as the parent, so the connector under test
    lets every event in.)"""
    me = os.getpid()
    tids: list[int] = []
    for _ in range(3):
        t = start_thread(lambda: tids.append(threading.get_native_id()),
                         "proctable-lineage-probe")
        t.join()
        deadline = time.monotonic() + _SELF_TEST_SECONDS
        overrun = False
        while not overrun:
            try:
                events = conn.read()
            except Overrun:
                overrun = True
                continue
            if any(what == FORK and d == me and c in tids for what, _a, _b, c, d in events):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            readable([conn.fileno()], min(left, 0.02))
    return False


def _in_a_child_pid_namespace() -> bool:
    """Is this process in a pid namespace below the initial one? (Its NSpid line
    then names more than one pid; the connector reports the initial one's.)"""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return len(line.split()) > 2
    except OSError:
        pass
    return False  # no NSpid (Linux < 4.1): the self-test decides


def subscribe(wake: Callable[[], None], follow_forks: bool) -> Optional[Subscription]:
    """A subscription to the shared stream, or None where there is none to share
    (PROCTABLE_DISABLE=proc_connector, no permission, or events that name pids of
    another pid namespace)."""
    global _hub, _usable
    if switched_off() or _usable is False:
        return None
    if _usable is None and _in_a_child_pid_namespace():
        log.debug("lineage events: in a child pid namespace, they name other pids")
        _usable = False
        return None
    with _hub_lock:
        hub = _hub
        if hub is None or hub._closed:
            try:
                conn = ProcConnector(pids=None if _usable is None else {os.getpid()})
            except OSError as e:
                log.debug("lineage events: no proc connector: %s", e)
                _usable = False
                return None
            if _usable is None:
                try:
                    _usable = _self_test(conn)
                except NoThread as e:  # no events then; the next lineage asks again
                    log.debug("lineage events: %s", e)
                    conn.close()
                    return None
                if not _usable:
                    log.debug("lineage events: they do not name this process's pids")
                    conn.close()
                    return None
            try:
                hub = _hub = Hub(conn)
            except NoThread as e:  # lineages then sample without events (said at debug)
                log.debug("lineage events: %s", e)
                conn.close()
                return None
        try:
            return hub._subscribe(wake, follow_forks)
        except OSError as e:  # pragma: no cover - setsockopt on a live socket
            log.debug("lineage events: %s", e)
            return None


def hub_thread_id() -> Optional[int]:
    """The native id of the hub's thread while there is one (its CPU time is what
    reading the events costs, shared by every lineage)."""
    hub = _hub
    return None if hub is None else hub.thread.native_id


def _close_quietly(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _after_fork_in_child() -> None:
    # The socket and the thread belong to the parent: start afresh (and check again:
    # a child may have dropped privileges, or entered another pid namespace).
    global _hub, _hub_lock, _usable
    old = _hub
    if old is not None and not old._freed:
        # Its fds came along (a lingering hub too): close the copies, without its
        # lock (its thread, in the parent, may have held it) and without unsubscribing.
        old._freed = True
        old._conn.forget()
        _close_quietly(old._wake_r, old._wake_w)
    _hub = None
    _hub_lock = threading.Lock()
    _usable = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _retire_at_exit() -> None:
    # A program that exits while its hub lingers (a one-shot `proctable run`)
    # unsubscribes as it did when its last lineage ended: the kernel lowers its
    # listener count only then, and every fork of the host pays while it is not 0.
    hub = _hub
    if hub is None:
        return
    with _hub_lock, hub._lock:
        if hub._closed or hub._subs:
            return  # in use: its lineages are still open
        hub._closed = True
        hub._poke_locked()
    if hub.thread is not threading.current_thread():
        hub.thread.join(timeout=1.0)
    hub._free()


atexit.register(_retire_at_exit)
