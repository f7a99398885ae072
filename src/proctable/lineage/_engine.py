"""The Engine behind a Lineage: the membership core, the recorded members, one
backend, the proc-connector subscription and the sampler thread, and the teardown
that proves every member gone. The thread holds the engine, never the Lineage.

An engine whose teardown failed keeps what a retry needs (pidfds, fds, its
cgroup). If the interpreter exits without a retry, an ``atexit`` handler gives
each such engine one last teardown (SIGKILL, bounded) and releases it, so its
cgroup does not outlive the process where its members are gone by then.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import select
import signal
import subprocess
import threading
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Optional

from .. import _ended
from .._fdwait import readable
from .._threads import start_thread
from ..errors import NoSuchProcess, OutOfFds, TeardownError
from ..table import Identity, Proc
from . import _helper, _hub
from ._backend import Backend
from ._core import Claim, Membership, as_row
from ._members import (
    Member,
    Registry,
    handle_of,
    pidfd_open,
    read_safe,
    relieve_fds,
    stat_of,
)
from ._procconn import EXIT, FORK, SID
from ._report import Ended, LineageClosed, MemberEnd, Suspect, TeardownReport
from .subreaper import SubreaperBackend

if TYPE_CHECKING:
    pass
from ._spawned import SpawnedProcess

log = logging.getLogger("proctable.lineage")

CHAIN_SECONDS = 2.0
EXIT_KILL_SECONDS = 1.0
"""At interpreter exit, how long each lineage kept for a retry may take to be proven gone."""
EXIT_TOTAL_SECONDS = 5.0
"""... and all of them together."""

# Engines whose teardown failed and that keep their fds and cgroup for a retry.
_kept: weakref.WeakSet[Engine] = weakref.WeakSet()


class Engine:
    """Everything a lineage holds, and every decision's I/O (see the module)."""

    def __init__(self, backend_cls: type[Backend], interval: float) -> None:
        self.interval = interval
        self.owner = os.getpid()  # a forked copy of this engine owns nothing
        self.mode = backend_cls.mode
        self.core = Membership(0, {os.getpid()})
        self.reg = Registry(self.core)
        self.reg.on_end = self._member_ended
        self.backend = backend_cls(self)
        self.lock = threading.RLock()
        self.state = "open"  # open -> tearing -> done; failed (terminate may retry); closed
        self.released = False
        self.process: Optional[subprocess.Popen[Any]] = None  # spawn's, or the attached Popen
        self.given: Optional[object] = None  # an asyncio Process given to attach
        self.spawned = False
        self.spawn_failed = False
        self.root: Optional[Identity] = None
        self.report: Optional[TeardownReport] = None
        self.suspects: list[tuple[Claim, Proc]] = []
        self.samples = 0
        self.error: Optional[BaseException] = None
        self.t0: Optional[float] = None  # the first teardown attempt's start
        self.sub: Optional[_hub.Subscription] = None
        self.refused = False  # the hub gave no stream (not merely: released since)
        self._stream_end: Optional[tuple[int, bool]] = None  # (overruns, broken) at release
        self._overruns = 0
        self._need_full = False
        # Pids whose forks the stream reports as ours though they are not live members:
        # children it reported that are not (yet) recorded, and members seen ended
        # (their last forks may be read after that). A dead one's forks are reported
        # within moments: an entry is dropped at its exit event, or after CHAIN_SECONDS.
        self.chain: dict[int, float] = {}
        self.thread: Optional[threading.Thread] = None
        self._go = threading.Event()  # start() ran: the sampler may look
        self._stop = threading.Event()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    # -- construction -------------------------------------------------------------------

    def subscribe(self) -> None:
        self.sub = _hub.subscribe(self._wake, self.backend.follows_forks)
        self.refused = self.sub is None
        if self.sub is not None:
            self._overruns = self.sub.overruns

    def _wake(self) -> None:
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass  # a wake-up is pending already (or we are closing)

    def popen(self, argv: list[Any], kw: dict[str, Any],
              exit_fd: Optional[int] = None) -> SpawnedProcess:
        """Start argv as spawn's Popen (the command itself, or the reaper's mirror)."""
        try:
            proc = SpawnedProcess(argv, **kw)
        except BaseException as exc:
            if exit_fd is not None:
                os.close(exit_fd)
            if isinstance(exc, OSError) and exc.errno == errno.E2BIG and "--" in argv:
                # The helper's argv carries the command's: it is the command that is
                # too long, so name the command, as subprocess would.
                raise OSError(errno.E2BIG, exc.strerror or os.strerror(errno.E2BIG),
                              _helper.command_of(argv)) from None
            raise
        if exit_fd is not None:
            proc._attach_exit_pipe(exit_fd)
        self.process = proc
        self.spawned = True
        return proc

    def pin(self, pid: int, start: Optional[int], handle: Optional[int]) -> Member:
        """Record the root, pidfd first; NoSuchProcess when pid is gone or names
        another process than (start, handle) say. A root that has ended already
        (an unreaped zombie) is kept as an anchor: it still holds its group's and
        session's numbers."""
        try:
            fd = pidfd_open(pid)
        except ProcessLookupError:
            raise NoSuchProcess(pid, f"no such process: pid {pid} (gone, or reaped already)"
                                ) from None
        # The pidfd is asked before the row is read: a process that ends between
        # the two then reads as ended (ours), never as another process.
        fd_ended = fd is not None and _ended.pidfd_ended(fd)
        row = read_safe(pid)
        ino = handle_of(fd)
        what = None
        if handle is not None and ino is not None and ino != handle:
            what = "names another process now"
        elif row is None:
            what = "is gone (or reaped already)"
        elif fd_ended and not _ended.row_ended(row.state, row.num_threads):
            what = "is gone (its pid names another process now)"
        elif start is not None and row.start_time != start:
            what = "names another process now"
        if what is not None or row is None:
            if fd is not None:
                os.close(fd)
            raise NoSuchProcess(pid, f"no such process: pid {pid} {what}")
        m = Member(pid, row.start_time, fd, row)
        if _ended.ended(fd, row):
            self.reg.anchor(m)
        else:
            self.reg.add(m)
        if isinstance(self.process, SpawnedProcess) and fd is not None:
            if self.process.pid == pid:
                self.process._attach_pidfd(os.dup(fd))  # scan: the Popen is the command
            elif self.process._exit_box is not None:
                self.process._attach_command(os.dup(fd))  # the mirror's command
        return m

    def prepare_thread(self) -> None:
        """Start the sampler thread before anything else starts: it waits for
        :meth:`start`. Where no thread can start (RLIMIT_NPROC, a sandbox denying
        clone3) this raises NoThread while nothing has been spawned yet."""
        if self.thread is None:
            self.thread = start_thread(self._run, f"proctable-lineage-{self.mode}")

    def start(self, root: Member) -> None:
        self.root = Identity(root.pid, root.start, root.handle)
        self.core.floor = root.start
        with self.lock:
            self.track()
            self.look(full=True)
        if self.thread is not None or self.backend.sampler:
            self.prepare_thread()
            self._go.set()

    def want_sampler(self) -> None:
        """Sample between the callers' looks from now on (a backend that needs no
        sampler, once changes() starts its record): the event stream and the thread.
        NoThread where no thread can start."""
        if self.thread is not None or self.released or self.state != "open":
            return
        if self.sub is None:
            self.subscribe()
            self.track()  # the socket's filter lets their events in from the next look on
        self.prepare_thread()
        self._go.set()

    def backend_release_disarm(self) -> None:
        """Forget how to release a keeper (a lineage over one that could not be
        made, or that is let go without a teardown: the session goes on)."""
        backend = self.backend
        if isinstance(backend, SubreaperBackend):
            backend.release_keeper = None
            backend.let_go = True

    def abort_spawn(self) -> None:
        """spawn failed half-way: end what it started, free what it holds (bounded)."""
        self.spawn_failed = True
        p = self.process
        if p is not None and p.returncode is None:
            try:
                p.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=2.0)
        for m in list(self.reg.live.values()):
            self.reg.send(m, signal.SIGKILL)
        self.release()

    # -- events -----------------------------------------------------------------------

    def events(self, sync: bool = False) -> bool:
        """Handle what the stream reported; True when it concerns a member (look now)."""
        sub = self.sub
        if sub is None:
            return False
        if sync:
            sub.sync()
        urgent = False
        if sub.overruns != self._overruns:
            self._overruns = sub.overruns
            self.core.overrun()
            # Exit events may be lost: a pid of the chain may name an unrelated
            # process now (the hub stopped following them too).
            self.chain.clear()
            self._need_full = True
            urgent = True
        reg = self.reg
        for what, _a, b, _c, d in sub.take():
            if what == FORK:
                if b in reg.live or b in self.chain or (b in reg.anchors
                                                       and reg.unreaped(reg.anchors[b])):
                    self.chain[d] = time.monotonic()
                    self._record_fork(b, d)
                    urgent = True
                else:
                    self.core.watched(d)  # a recorded number names a new process
            elif what == EXIT:
                self.chain.pop(b, None)
                if b in reg.live:
                    urgent = True  # the predicate decides, at the look this causes
            elif what == SID and b in reg.live:
                row = stat_of(reg.live[b])
                if row is not None:
                    self.core.observe(as_row(row))
                urgent = True
        return urgent

    def _member_ended(self, m: Member) -> None:
        # Its forks may still be queued (reported before its exit, read after it was
        # seen ended and even reaped): they are ours until its exit event is read.
        if self.sub is not None:
            self.chain[m.pid] = time.monotonic()

    def _record_fork(self, parent: int, child: int) -> None:
        claim = self.core.fork(parent, child)
        if claim is None or child in self.reg.live:
            return
        pm = self.reg.live.get(parent)
        if pm is not None:
            self.reg.record_child(child, pm)
        else:
            self.reg.record(child, claim.floor)

    def track(self) -> None:
        """Tell the hub which pids are ours now (a member whose main thread exited
        lives on; its leader's exit event took it out)."""
        sub = self.sub
        if sub is None:
            return
        live = set(self.reg.live)
        old = time.monotonic() - CHAIN_SECONDS
        for pid in [p for p, t in self.chain.items() if p in live or t < old]:
            del self.chain[pid]
        sub.track(live)

    def follow_own_forks(self) -> None:
        """Have the hub follow this process's forks until the next :meth:`track`."""
        if self.sub is not None:
            self.sub.track([os.getpid()])

    def watch_numbers(self) -> None:
        if self.sub is not None:
            ids = self.core.watch_ids()
            self.sub.watch(ids)
            self.core.watch(ids)  # only numbers the stream watches can be covered

    def health(self) -> list[str]:
        """What the lineage cannot do now that it could (see Lineage.health)."""
        out = list(self.backend.health())
        sub = self.sub
        # After release the subscription is gone: what it said then still holds, and
        # its absence is no refusal.
        overruns, broken = ((sub.overruns, sub.broken) if sub is not None
                            else self._stream_end or (0, False))
        if self.refused and self.backend.follows_forks:
            by = ("by the lineage's environment marker, or " if self.spawned else "")
            out.append("no fork events here (the proc connector is refused, or this is a "
                       "child pid namespace): an orphan whose parent exits between two "
                       f"looks is found only {by}where a group or session rule proves it a "
                       "member; spawn with mode='subreaper' or 'cgroup' to keep every one")
        if overruns:
            out.append(f"fork and exit events were lost {overruns} time(s) (the socket "
                       "overflowed): full looks at /proc fill the gap, and no group or "
                       "session is proven by the stream from then on; in scan mode an "
                       "orphan made in the gap may be missed")
        if broken:
            out.append("the event stream failed: the lineage follows by looking at /proc "
                       "only (a fork chain whose middle link exits between two looks can "
                       "escape; spawned lineages keep their structure)")
        if isinstance(self.error, OutOfFds):
            out.append(f"out of file descriptors: {self.error}")
        return out

    def tearing_down(self) -> bool:
        return self.state == "tearing"

    def overruns_seen(self) -> int:
        """How many overruns of the stream this lineage has handled (-1: no stream)."""
        return self._overruns if self.sub is not None else -1

    def stream_unbroken(self) -> bool:
        sub = self.sub
        return sub is not None and sub.overruns == self._overruns

    # -- looking ------------------------------------------------------------------------

    def look(self, full: bool) -> bool:
        """One sample (lock held); False when the backend could not look (also when
        the process has no fd left to look with, after freeing the kept ones)."""
        self.samples += 1
        for attempt in range(2):
            try:
                self.events(sync=full)
                self.reg.reap_ended()
                full = full or self._need_full
                self._need_full = False
                ok = self.backend.sample(full)
                self.reg.reap_ended()
                self.track()
            except OutOfFds as exc:
                if attempt == 0:
                    relieve_fds()
                    self._need_full = True
                    continue
                if self.error is None:
                    log.warning("lineage: cannot look: %s", exc)
                self.error = exc
                return False
            else:
                return ok
        return False

    def member_rows(self) -> list[Proc]:
        """Fresh rows of the live members and anchors (an anchor found reaped is dropped)."""
        out = []
        reg = self.reg
        for m in list(reg.live.values()):
            row = stat_of(m)
            if row is not None:
                m.proc = row
                out.append(row)
        for m in list(reg.anchors.values()):
            row = stat_of(m)
            if row is None:
                reg.drop_anchor(m)
            else:
                m.proc = row
                out.append(row)
        return out

    def public_suspects(self) -> list[Suspect]:
        """The suspects of the last full look, with pidfs handles (pidfd opened
        before the identity check), still there and still not members."""
        out = []
        for claim, row in self.suspects:
            if claim.pid in self.reg.live:
                continue
            try:
                fd = pidfd_open(claim.pid)
            except ProcessLookupError:
                continue
            try:
                now = read_safe(claim.pid)
                if now is None or now.start_time != row.start_time or _ended.ended(fd, now):
                    continue
                out.append(Suspect(now, claim.via, claim.ident, handle_of(fd)))
            finally:
                if fd is not None:
                    os.close(fd)
        out.sort(key=lambda s: (s.proc.start_time, s.pid))
        return out

    def _run(self) -> None:
        while not self._go.wait(5.0):  # until start(), or a halt before it
            if self.released:
                return
        if self._stop.is_set():
            return
        interval = self.interval
        due = time.monotonic() + interval
        fds = [self.wake_r]
        while not self._stop.is_set():
            try:
                r = readable(fds, max(due - time.monotonic(), 0.0))
            except OSError:
                r = []
            if self._stop.is_set():
                break
            if r:
                _drain(self.wake_r)
            try:
                with self.lock:
                    if self.state != "open":
                        break
                    urgent = self.events()
                    now = time.monotonic()
                    if urgent or now >= due:
                        self.look(full=False)
                        due = now + interval
            except Exception as exc:  # keep sampling; report once
                if self.error is None:
                    log.warning("lineage sampler: %r", exc)
                self.error = exc

    def halt_thread(self) -> None:
        t = self.thread
        if t is not None and t.is_alive() and t is not threading.current_thread():
            self._stop.set()
            self._go.set()  # a thread still waiting for start() ends at once
            self._wake()
            t.join(timeout=5.0)
        self.thread = None

    # -- teardown -----------------------------------------------------------------------

    def _signal_new(self, sig: int) -> None:
        t0 = self.t0 if self.t0 is not None else time.monotonic()
        now = time.monotonic() - t0
        reg = self.reg
        for m in list(reg.live.values()):
            if sig == signal.SIGTERM:
                if not m.term_sent and reg.send(m, signal.SIGTERM):
                    m.term_sent = True
                    if m.term_at is None:
                        m.term_at = now
                reg.send(m, signal.SIGCONT)
            elif not m.kill_sent and reg.send(m, signal.SIGKILL):
                m.kill_sent = True
                if m.kill_at is None:
                    m.kill_at = now

    def _all_gone(self) -> bool:
        self.reg.reap_ended()
        self.look(full=False)
        if self.reg.live:
            return False
        ok = self.look(full=True)
        return ok and not self.reg.live and self.backend.proven_empty()

    def _wait_gone(self, deadline: float, sig: int) -> bool:
        extra = [(self.wake_r, select.POLLIN), *self.backend.wait_fds()]
        while True:
            self._signal_new(sig)
            if self._all_gone():
                return True
            self._signal_new(sig)
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            p = select.poll()
            for fd, ev in extra:
                p.register(fd, ev)
            for m in self.reg.live.values():
                if m.fd is not None:
                    p.register(m.fd, select.POLLIN)
            p.poll(max(1, int(min(left, self.interval) * 1000)))
            _drain(self.wake_r)
            self.backend.rearm()
            self.events()

    def terminate(self, grace: float, kill_timeout: float) -> TeardownReport:
        self.check_open()
        self.halt_thread()
        with self.lock:
            self.check_open()
            self.state = "tearing"
            reg = self.reg
            if self.t0 is None:
                self.t0 = time.monotonic()
            reg.tearing = True
            reg.t0 = self.t0
            for m in reg.live.values():
                m.term_sent = m.kill_sent = m.stopped = False
            self.events(sync=True)
            reg.reap_ended()
            self.look(full=True)
            reg.live_rows()
            self.backend.stop_forks()
            self._signal_new(signal.SIGTERM)
            self.backend.resume()
            gone = self._wait_gone(time.monotonic() + grace, signal.SIGTERM)
            if not gone:
                if self.backend.kill_all():
                    now = time.monotonic() - self.t0
                    for m in reg.live.values():
                        if m.kill_at is None:
                            m.kill_at = now
                    # cgroup.kill passes over a process whose main thread exited (its
                    # other threads run on; seen on 6.18), while kill(2) ends it: so
                    # every member still gets its own SIGKILL through its pidfd below.
                gone = self._wait_gone(time.monotonic() + kill_timeout, signal.SIGKILL)
            report, survivors = self._report(grace, kill_timeout, gone)
            if not gone:
                self.state = "failed"
                _kept.add(self)
                raise TeardownError(
                    f"{len(survivors)} member(s) of the lineage could not be proven gone "
                    f"within grace {grace}s + kill_timeout {kill_timeout}s: "
                    + ", ".join(f"{p.pid} {p.name}" for p in survivors)
                    + "; the lineage keeps its pidfds for terminate() to be called again",
                    list(survivors), report)
            self.report = report
            self.backend.finish(max(kill_timeout, 1.0))
            self.release()
            self.state = "done"
            return report

    def _report(self, grace: float, kill_timeout: float,
                gone: bool) -> tuple[TeardownReport, list[Proc]]:
        reg = self.reg
        ends = []
        for m in reg.history:
            ex = reg.exit_of(m)
            if m.kill_at is not None and (ex is None or ex.signal == signal.SIGKILL
                                          or m.term_at is None):
                how = Ended.KILL
            elif m.term_at is not None:
                how = Ended.TERM
            else:
                how = Ended.ALREADY_GONE
            ends.append(MemberEnd(m.proc, how, m.seen_end, ex, m.handle))
        survivors = []
        for m in reg.live.values():
            row = read_safe(m.pid)
            if row is not None and row.start_time == m.start:
                m.proc = row
            survivors.append(m.proc)
            ends.append(MemberEnd(m.proc, Ended.UNRESOLVED, None, None, m.handle))
        if not gone:
            for row in self.backend.strays():  # never recorded, yet the backend holds it
                survivors.append(row)
                ends.append(MemberEnd(row, Ended.UNRESOLVED, None, None))
        ends.sort(key=lambda e: (e.seconds if e.seconds is not None else float("inf"), e.pid))
        t0 = self.t0 if self.t0 is not None else time.monotonic()
        report = TeardownReport(self.mode, tuple(ends), time.monotonic() - t0, grace,
                                kill_timeout, tuple(self.public_suspects()),
                                tuple(self.health()))
        return report, survivors

    def wait_process(self, timeout: float) -> None:
        """Reap spawn's own Popen (bounded): its returncode is the command's."""
        p = self.process
        if p is None or not self.spawned:
            return
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("lineage: the reaper (pid %d) did not end; killing it", p.pid)
            p.kill()
            try:
                p.wait(timeout=1.0)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass

    # -- release ------------------------------------------------------------------------

    def check_open(self) -> None:
        if self.state == "done":
            raise LineageClosed("this lineage was torn down already (its report is "
                                "lineage.report); start a new one")
        if self.state == "closed":
            raise LineageClosed("this lineage was closed; start a new one")

    def release(self) -> None:
        """Free everything: the thread, every fd and pidfd, the subscription, the
        backend's helpers and cgroup. Idempotent."""
        self.halt_thread()
        if self.released:
            return
        self.released = True
        _kept.discard(self)
        if isinstance(self.process, SpawnedProcess) and self.spawned:
            self.process._settle()
        self.reg.close()
        if self.sub is not None:
            self._stream_end = (self.sub.overruns, self.sub.broken)
            self.sub.close()
            self.sub = None
        try:
            self.backend.close()
        finally:
            for fd in (self.wake_r, self.wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.wake_r = self.wake_w = -1

    def close(self) -> None:
        self.halt_thread()
        with self.lock:
            if self.state in ("done", "closed"):
                return
            self.state = "closed"
            self.release()

    def gc_release(self, what: str) -> None:
        """The Lineage was garbage collected: release what it never released."""
        if self.released or os.getpid() != self.owner:
            return  # (in a forked child the cgroup and the reaper are the parent's)
        warnings.warn(f"{what} was never torn down or closed: released on garbage "
                      "collection (its processes are left running)", ResourceWarning,
                      stacklevel=2)
        self.state = "closed"
        self.release()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass


def _release_kept_at_exit() -> None:
    """The interpreter exits: each lineage kept for a retry after a TeardownError
    gets one last teardown (SIGKILL; at most EXIT_KILL_SECONDS each, and
    EXIT_TOTAL_SECONDS in all) and is released. A cgroup that still holds a process
    then (one that cannot die: D state, frozen) is left in place, with a warning."""
    deadline = time.monotonic() + EXIT_TOTAL_SECONDS
    for e in list(_kept):
        if e.released or e.state != "failed" or os.getpid() != e.owner:
            continue
        left = deadline - time.monotonic()
        # A daemon thread may hold the engine (a teardown under way): never wait on it long.
        if not e.lock.acquire(timeout=max(0.0, min(1.0, left))):
            continue
        try:
            if left > 0:
                try:
                    e.terminate(0.0, max(0.1, min(EXIT_KILL_SECONDS, left)))
                except TeardownError as exc:
                    log.warning("lineage at exit: %s", exc)
                except Exception as exc:
                    log.warning("lineage at exit: teardown failed: %r", exc)
            if not e.released:
                e.state = "closed"
                e.release()
        except Exception as exc:  # at exit: tell, never raise
            log.warning("lineage at exit: release failed: %r", exc)
        finally:
            e.lock.release()


atexit.register(_release_kept_at_exit)
