"""Lineage: every process a run starts (escapes included), and a teardown that proves them gone.

:class:`Lineage` is a thin face over an :class:`Engine`, which owns everything:
the membership core (:mod:`._core`), the recorded members (:mod:`._members`), one
backend (:mod:`.cgroup`, :mod:`.subreaper` or :mod:`.scan`, chosen from a table,
never by branching on the mode), a subscription to the shared proc-connector hub
(:mod:`._hub`), and the sampler thread. The thread holds the engine, never the
Lineage, so a Lineage dropped without ``terminate()`` or ``close()`` is garbage
collected: its engine is then released, with a ``ResourceWarning``.

A lineage whose teardown failed keeps what a retry needs (pidfds, fds, its
cgroup). If the interpreter exits without a retry, an ``atexit`` handler gives
each such lineage one last teardown (SIGKILL, bounded) and releases it, so its
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
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .. import _ended, _pidfd
from .. import _lowlevel as _ll
from .._aio import is_asyncio_process
from .._fdwait import readable
from .._output import Collected, drain, read_until
from .._status import ExitStatus, decode_wait_status
from .._threads import start_thread
from ..errors import NoSuchProcess, OutOfFds, ProctableError, TeardownError
from ..table import Identity, Proc
from . import _helper, _hub
from ._backend import Backend, BackendUnavailable
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
from ._report import Change, Ended, LineageClosed, MemberEnd, Suspect, TeardownReport
from .cgroup import CgroupBackend
from .scan import ScanBackend
from .subreaper import SubreaperBackend

if TYPE_CHECKING:
    import asyncio

__all__ = ["MODES", "Lineage", "SpawnedProcess"]

log = logging.getLogger("proctable.lineage")

MODES = ("auto", "cgroup", "subreaper", "scan")
_BACKENDS: dict[str, type[Backend]] = {
    "cgroup": CgroupBackend,
    "subreaper": SubreaperBackend,
    "scan": ScanBackend,
}
# Which backends a mode tries, strongest first.
_SPAWN = {"auto": ("cgroup", "subreaper", "scan"), "cgroup": ("cgroup",),
          "subreaper": ("subreaper",), "scan": ("scan",)}
_ATTACH = {"auto": "scan", "cgroup": "cgroup", "subreaper": "subreaper", "scan": "scan"}
CHAIN_SECONDS = 2.0
EXIT_KILL_SECONDS = 1.0
"""At interpreter exit, how long each lineage kept for a retry may take to be proven gone."""
EXIT_TOTAL_SECONDS = 5.0
"""... and all of them together."""

# Engines whose teardown failed and that keep their fds and cgroup for a retry.
_kept: weakref.WeakSet[Engine] = weakref.WeakSet()


def _check_interval(interval: object) -> float:
    if isinstance(interval, bool) or not isinstance(interval, (int, float)):
        raise TypeError(f"interval must be a number of seconds, not {type(interval).__name__}")
    if not 0 < interval < float("inf"):
        raise ValueError(f"interval must be > 0 seconds, not {interval}")
    return float(interval)


def _check_seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, not {value}")
    return float(value)


def _check_mode(mode: object) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    return str(mode)


# --- the Popen spawn hands out ----------------------------------------------------------


def _close_box(box: list[Optional[int]]) -> None:
    fd, box[0] = box[0], None
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


class SpawnedProcess(subprocess.Popen):  # type: ignore[type-arg]
    """``Lineage.spawn``'s Popen. Its ``returncode`` is the command's own, and
    :attr:`exit_status` is the command's full wait status, the core-dump bit
    included, which a returncode cannot carry.

    In the cgroup and subreaper modes this Popen is the lineage helper's mirror
    process (``pt-mirror``): every signal sent through it reaches the command,
    its death (``kill()``) ends the command's lineage, and it exits the way the
    command did. The command's raw status comes on a pipe (from the mirror, or
    from the reaper where the mirror was killed first), and is what ``returncode``
    is made of. In scan mode this Popen is the command itself."""

    _exit_box: Optional[list[Optional[int]]] = None  # the helper's status pipe
    _pidfd_box: Optional[list[Optional[int]]] = None  # scan: a pidfd of the command
    _command_box: Optional[list[Optional[int]]] = None  # mirror: a pidfd of the command
    _exit_status: Optional[ExitStatus] = None
    _raw: Optional[int] = None  # the command's raw status, once told
    _lost = False  # the helper ended without telling it: unknown
    _status_lock: threading.Lock  # set with the status pipe: one reader of it at a time

    def _attach_exit_pipe(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._status_lock = threading.Lock()
        self._exit_box = [fd]
        weakref.finalize(self, _close_box, self._exit_box)

    def _attach_pidfd(self, fd: int) -> None:
        self._pidfd_box = [fd]
        weakref.finalize(self, _close_box, self._pidfd_box)

    def _attach_command(self, fd: int) -> None:
        self._command_box = [fd]
        weakref.finalize(self, _close_box, self._command_box)

    def send_signal(self, sig: int) -> None:
        """Send sig to the command: through the mirror, which passes every signal on,
        except SIGSTOP, which no process can catch to pass on: that one goes to the
        command itself (through a pidfd of it)."""
        box = self._command_box
        if sig == signal.SIGSTOP and box is not None and box[0] is not None:
            self.poll()
            if self.returncode is not None:
                return
            try:
                signal.pidfd_send_signal(box[0], sig)
            except ProcessLookupError:
                pass  # the command ended already
            except OSError:
                super().send_signal(sig)  # pidfd signals denied here: the mirror only
            return
        super().send_signal(sig)

    def _take_status(self, timeout: float = 0.0) -> None:
        """Read the command's raw status from the helper's pipe if it is there (wait
        at most ``timeout`` for it). EOF with no line: nobody knows it."""
        box = self._exit_box
        fd = None if box is None else box[0]
        if box is None or fd is None or self._raw is not None:
            return
        if timeout > 0:  # outside the lock: the exit watcher's thread must not wait on it
            try:
                readable([fd], timeout)
            except (OSError, ValueError):  # closed meanwhile by a thread that read it
                pass
        # Two threads read here at once (a teardown's wait() and the exit watcher's
        # command_status()): one reads and closes, the other sees it done.
        with self._status_lock:
            fd = box[0]
            if fd is None or self._raw is not None:
                return
            try:
                data = os.read(fd, 64)
            except BlockingIOError:
                return  # not told yet: the command runs on
            except OSError:
                data = b""
            _close_box(box)
            try:
                self._raw = int(data.split(b"\n", 1)[0])
            except ValueError:
                self._lost = True  # the helper ended without a status: nobody knows it

    def _handle_exitstatus(self, sts: int, *args: Any, **kwargs: Any) -> None:
        # The mirror's own status stands for the command's only where the helper
        # could not tell the real one. A mirror killed by a signal (kill()) has its
        # reaper kill the command's lineage and tell the command's status: wait
        # for it, bounded.
        if self._exit_box is not None and not os.WIFSTOPPED(sts):
            self._take_status(2.0 if os.WIFSIGNALED(sts) else 0.5)
            if self._raw is not None:
                sts = self._raw
        super()._handle_exitstatus(sts, *args, **kwargs)  # type: ignore[misc]

    @property
    def exit_status(self) -> Optional[ExitStatus]:
        """The command's exit status once this Popen's returncode is set (after
        ``wait()`` or ``poll()``); None before, and None where it is unknown."""
        rc = self.returncode
        if rc is None:
            return None
        if self._exit_status is None:
            status = self._read_status()
            if status is None and self._lost:
                return None  # unknown is not the mirror's own 125
            self._exit_status = status or ExitStatus.from_returncode(rc)
        return self._exit_status

    @property
    def status_lost(self) -> bool:
        """The lineage's reaper died (killed from outside) before it could tell the
        command's status: that status is unknown (the returncode is the mirror's)."""
        if self._exit_box is None:
            return False
        self._take_status()
        return self._lost

    def exit_wake_fd(self) -> Optional[int]:
        """A new fd (the caller's to close) that polls readable once the command's
        status can be read (the helper's status pipe: the reaper writes it as soon as
        the command is reaped, before the mirror ends); None where there is none or
        it was read already. The exit watcher waits on it beside the mirror's pidfd."""
        box = self._exit_box
        if box is None:
            return None
        with self._status_lock:
            fd = box[0]
            if fd is None or self._raw is not None:
                return None
            try:
                return os.dup(fd)
            except OSError:
                return None  # no fd left: the mirror's end tells it, a moment later

    def command_status(self) -> Optional[ExitStatus]:
        """The command's whole wait status as soon as the command has ended, before
        anyone reaps this Popen (the exit watcher asks here first: the mirror's
        own death cannot carry the core-dump bit); None while it runs or where
        it is not known."""
        if self._exit_status is not None:
            return self._exit_status
        if self._exit_box is None:
            return self.exit_status
        self._take_status()
        if self._raw is None:
            return None
        try:
            self._exit_status = decode_wait_status(self._raw)
        except ValueError:
            return None
        return self._exit_status

    def _settle(self) -> None:
        """Read the status now if the command has ended, and close the fds kept to
        read it (called when the lineage releases everything). A scan-mode command
        is our own child: its status is read without reaping it (the Popen's
        wait() still gets it), so the pidfd kept for it can go now. The mirror's
        pidfd of its command goes too (its lineage is over)."""
        if self._command_box is not None:
            _close_box(self._command_box)
        if self.returncode is not None:
            _ = self.exit_status
            return
        box = self._pidfd_box
        if box is None or box[0] is None or self._exit_status is not None:
            return
        try:
            raw = _pidfd.peek_child(self.pid, box[0])
        except (ChildProcessError, OSError):
            return  # not ours to read (reaped elsewhere): the pidfd's exit info later
        if raw is None:
            return  # it runs on (a teardown that did not end it): keep the pidfd
        try:
            self._exit_status = decode_wait_status(raw)
        except ValueError:
            return
        _close_box(box)

    def _read_status(self) -> Optional[ExitStatus]:
        self._take_status()
        raw = self._raw
        box = self._pidfd_box
        if raw is None and box is not None and box[0] is not None:
            try:
                raw = _pidfd.exit_info(box[0])
            except OSError:
                raw = None
            _close_box(box)
        if raw is None:
            return None
        try:
            return decode_wait_status(raw)
        except ValueError:
            return None


# --- the engine --------------------------------------------------------------------------


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


def _input_bytes(input: object, text: bool, stdin: Any) -> bytes:
    """communicate()'s input as bytes: in text mode a str, encoded as Popen does (with
    the stdin stream's encoding and errors); else bytes."""
    if input is None:
        return b""
    if text:
        if not isinstance(input, str):
            raise TypeError("in text mode, communicate() takes input as a str, not "
                            f"{type(input).__name__}")
        if stdin is None:
            return b""  # no stdin pipe: nothing to write it to (as Popen, ignored)
        return input.encode(stdin.encoding, stdin.errors or "strict")
    if isinstance(input, str):
        raise TypeError("communicate() takes input as bytes (spawn with text=True for a str)")
    if not isinstance(input, (bytes, bytearray, memoryview)):
        raise TypeError(f"communicate() takes input as bytes, not {type(input).__name__}")
    return bytes(input)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass


# --- the public face ---------------------------------------------------------------------

Root = Union[int, Identity, "subprocess.Popen[Any]", "asyncio.subprocess.Process"]


def _resolve_root(root: object) -> tuple[int, Optional[int], Optional[int], Optional[object]]:
    """(pid, start_time, handle, the process object) of a root; refuse anything else."""
    if isinstance(root, subprocess.Popen) or is_asyncio_process(root):
        pid = _ll.check_pid(root.pid)
        if root.returncode is not None:
            raise NoSuchProcess(pid, f"no such process: pid {pid} exited already "
                                f"(returncode {root.returncode})")
        return pid, None, None, root
    if isinstance(root, Identity):
        pid = _ll.check_pid(root.pid)
        st, handle = root.start_time, root.handle
        if isinstance(st, bool) or not isinstance(st, int):
            raise TypeError(f"Identity.start_time must be an int, not {type(st).__name__}")
        if handle is not None and (isinstance(handle, bool) or not isinstance(handle, int)):
            raise TypeError(f"Identity.handle must be an int or None, not {type(handle).__name__}")
        return pid, st, handle, None
    if isinstance(root, bool) or not isinstance(root, int):
        raise TypeError("root is a pid, a proctable.Identity, a subprocess.Popen or an "
                        f"asyncio.subprocess.Process, not {type(root).__name__}")
    return _ll.check_pid(root), None, None, None


def _nothing() -> None:
    pass


class Lineage:
    """Every process a run starts, escapes included; a context manager.

    ``Lineage(root)`` attaches to a running process (a pid, an :class:`Identity`,
    a ``Popen`` or an ``asyncio.subprocess.Process``) and tracks it by scanning
    (``mode`` ``auto`` or ``scan``); :meth:`spawn` starts a command inside the
    tracking and can use the stronger backends. ``mode`` tells the backend in use:
    ``cgroup``, ``subreaper`` or ``scan``. Leaving the ``with`` block tears the
    lineage down (:meth:`terminate` with its defaults); its report stays in
    :attr:`report`.
    """

    _command: Any = None  # what spawn() ran (for messages)
    _collected: Optional[Collected] = None  # communicate()'s reads kept across a timeout

    def __init__(self, root: Root, interval: float = 0.05, mode: str = "auto") -> None:
        interval = _check_interval(interval)
        mode = _check_mode(mode)
        backend_cls = _BACKENDS[_ATTACH[mode]]
        if not backend_cls.attachable:
            raise backend_cls.attach_refusal()
        pid, start, handle, given = _resolve_root(root)
        if pid == os.getpid():
            # Teardown stops and kills every member: never this process itself.
            raise ValueError("a lineage cannot be rooted at the calling process itself")
        engine = Engine(backend_cls, interval)
        if isinstance(given, subprocess.Popen):
            engine.process = given
        else:
            engine.given = given
        try:
            engine.subscribe()
            engine.prepare_thread()
            m = engine.backend.attach(pid, start, handle)
            engine.start(m)
        except BaseException:
            engine.release()
            raise
        self._bind(engine)

    def _bind(self, engine: Engine) -> None:
        self._engine = engine
        what = f"Lineage(mode={engine.mode}, root={engine.root.pid if engine.root else None})"
        fin = weakref.finalize(self, engine.gc_release, what)
        fin.atexit = False  # at exit the reaper and the kernel end what is left

    @classmethod
    def spawn(cls, args: Any, interval: float = 0.05, mode: str = "auto", *,
              cgroup_parent: Optional[str] = None, terminal: Optional[int] = None,
              ignore_signals: Iterable[int] = (), **popen_kwargs: Any) -> Lineage:
        """Start ``args`` already inside the tracking; ``lineage.process`` is its Popen.

        ``popen_kwargs`` go to ``subprocess.Popen`` (stdio, cwd, env, sessions, ...).
        In ``cgroup`` and ``subreaper`` modes the Popen is the lineage helper's
        mirror, which the command inherits all of that from, which passes every
        signal sent to it on to the command, and whose returncode is the
        command's own; ``lineage.root`` is the command, and
        ``lineage.process.exit_status`` the command's full status (core dump
        included). ``cgroup_parent`` names the cgroup v2 directory to create the
        lineage's cgroup in (default: the one this process is in).

        The command starts with every signal's disposition at default and no
        signal blocked, whatever this process (or thread) ignores or blocks;
        ``ignore_signals`` names those it should start with ignored instead
        (``(signal.SIGHUP,)`` for ``nohup``'s). ``terminal`` is the slave side of
        a pseudo-terminal: the command then leads a new session with it as its
        controlling terminal, stdin, stdout and stderr (prepared before exec by
        the helper; no ``preexec_fn``).
        """
        interval = _check_interval(interval)
        mode = _check_mode(mode)
        ignore = _helper.signal_numbers(ignore_signals)
        if terminal is not None:
            if isinstance(terminal, bool) or not isinstance(terminal, int):
                raise TypeError(f"terminal must be a file descriptor, not "
                                f"{type(terminal).__name__}")
            if not os.isatty(terminal):
                raise ValueError(f"terminal={terminal} is not a terminal")
        popen_kwargs["terminal"] = terminal
        popen_kwargs["ignore_signals"] = ignore
        if popen_kwargs.get("shell"):
            shell = popen_kwargs.pop("executable", None) or "/bin/sh"
            args = [shell, "-c", args] if isinstance(args, (str, bytes)) else [shell, "-c", *args]
        popen_kwargs.pop("shell", None)
        if isinstance(args, (str, bytes, os.PathLike)):
            args = [args]
        args = list(args)
        if not args:
            raise ValueError("empty command")
        names = _SPAWN[mode]
        for i, name in enumerate(names):
            bcls = _BACKENDS[name]
            prepared = bcls.usable(cgroup_parent)
            if prepared is None:
                if i + 1 == len(names):
                    raise bcls.refusal(cgroup_parent)
                continue
            engine = Engine(bcls, interval)
            engine.backend.adopt(prepared)
            try:
                if bcls.sampler:
                    engine.prepare_thread()  # NoThread now, before the command starts
                    engine.subscribe()  # before the command starts: every fork of it is seen
                m = engine.backend.spawn(args, popen_kwargs)
                engine.start(m)
            except BackendUnavailable as exc:
                engine.abort_spawn()  # nothing was started: try the next backend
                if i + 1 == len(names):
                    raise ProctableError(str(exc)) from None
                log.debug("lineage: %s; trying %s", exc, names[i + 1])
                continue
            except BaseException:
                engine.abort_spawn()
                raise
            self = cls.__new__(cls)
            self._bind(engine)
            self._command = args
            return self
        raise AssertionError("unreachable: the last backend either spawns or raises")

    @classmethod
    def _over_keeper(cls, keeper: Identity, guard: Identity, command: Identity,
                     cgroup: Optional[str], inside: bool, release: Callable[[], None],
                     interval: float = 0.05) -> Lineage:
        """The lineage of a durable session (see :mod:`._session`): its keeper is the
        reaper (a subreaper that made the cgroup and started the command), and
        ``release`` tells it the lineage is torn down. It has no Popen. Used by the
        supervisor for a session it started and for one it re-adopts; every
        member is found from the keeper's structure, as in a spawn's lineage."""
        if cgroup is not None and not os.path.exists(os.path.join(cgroup, "cgroup.procs")):
            # Emptied and removed already (a teardown got that far before its supervisor
            # was killed; only an empty cgroup can be removed): the keeper's tree is
            # all there is.
            cgroup = None
        bcls = CgroupBackend if cgroup is not None else SubreaperBackend
        engine = Engine(bcls, _check_interval(interval))
        try:
            engine.prepare_thread()
            engine.subscribe()
            backend = engine.backend
            assert isinstance(backend, SubreaperBackend)
            m = backend.take_keeper(keeper, guard, command, cgroup, inside, release)
            engine.start(m)
        except BaseException:
            engine.backend_release_disarm()
            engine.release()
            raise
        self = cls.__new__(cls)
        self._bind(engine)
        return self

    # -- what it is -----------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """The backend in use: ``cgroup``, ``subreaper`` or ``scan``."""
        return self._engine.mode

    @property
    def interval(self) -> float:
        return self._engine.interval

    @property
    def root(self) -> Optional[Identity]:
        """The command (or the attached root) as (pid, start time, pidfs handle)."""
        return self._engine.root

    @property
    def process(self) -> subprocess.Popen[Any]:
        """The Popen: spawn's (a :class:`SpawnedProcess`; in cgroup and subreaper
        modes the lineage's mirror process, whose returncode is the command's own,
        set when the command ends), or the one given to attach. ProctableError for
        a lineage attached by pid, Identity or asyncio Process (which stays yours)."""
        p = self._engine.process
        if p is None:
            raise ProctableError("this lineage was attached by pid, Identity or asyncio "
                                 "Process: it has no Popen")
        return p

    @property
    def cgroup(self) -> Optional[str]:
        """The path of the lineage's own cgroup (cgroup mode, until released), else None."""
        path = getattr(self._engine.backend, "path", None)
        return path if isinstance(path, str) else None

    @property
    def health(self) -> list[str]:
        """What this lineage can no longer do that it could when it started: its
        reaper killed from outside, fork events lost or their stream broken, no
        fds left. Empty when all is well. Each is also logged as a warning when it
        happens; a TeardownReport carries the list too (``report.health``)."""
        e = self._engine
        with e.lock:
            return e.health()

    @property
    def report(self) -> Optional[TeardownReport]:
        """The report of the teardown that proved every member gone (None before)."""
        return self._engine.report

    @property
    def closed(self) -> bool:
        """True once terminate() proved every member gone (or close() gave up tracking)."""
        return self._engine.state in ("done", "closed")

    @property
    def samples(self) -> int:
        """How many looks so far (the sampler's and every other)."""
        return self._engine.samples

    @property
    def sampler_thread(self) -> Optional[threading.Thread]:
        """The sampler thread while it runs (its CPU time is what a lineage costs,
        beside its share of the event hub's thread)."""
        return self._engine.thread

    # -- members ----------------------------------------------------------------------------

    def sample(self) -> None:
        """Look for new members now, in full (the sampler thread looks cheaply every
        ``interval``, and in full every few seconds)."""
        e = self._engine
        e.check_open()
        with e.lock:
            e.check_open()
            e.look(full=True)

    def members(self) -> list[Proc]:
        """Every live member now (ended ones left out), as fresh rows, oldest first.
        A process whose main thread exited while its other threads run is live."""
        e = self._engine
        e.check_open()
        with e.lock:
            e.check_open()
            e.look(full=True)
            return e.reg.live_rows()

    def identities(self) -> list[Identity]:
        """The identities of :meth:`members`, with pidfs handles."""
        e = self._engine
        with e.lock:
            rows = self.members()
            by_pid = e.reg.live
            return [by_pid[p.pid].identity for p in rows if p.pid in by_pid]

    def changes(self) -> list[Change]:
        """Who joined and who left since the last call, in the order it happened.

        The first call starts the record and answers ``joined`` for every member
        there is now (the root included); later calls drain the record, which
        sees every member the lineage records, also one that lived shorter than
        a sample, and each ``left`` with the member's exit status where the
        kernel still had it. Without a first call nothing is recorded (a
        lineage that nobody asks costs nothing more).
        """
        e = self._engine
        e.check_open()
        with e.lock:
            reg = e.reg
            if reg.log is None:
                e.want_sampler()  # the record sees members that live shorter than a look
                e.look(full=True)
                reg.log = []
                return [Change("joined", m.proc, parent_member=m.proc.ppid in reg.live)
                        for m in sorted(reg.live.values(), key=lambda m: (m.start, m.pid))]
            e.look(full=False)
            out, reg.log = reg.log, []
            return out

    def suspects(self) -> list[Suspect]:
        """Processes in a group or session a member leads or led, which the lineage
        cannot prove still is that group or session: never members, never signalled."""
        e = self._engine
        e.check_open()
        with e.lock:
            e.check_open()
            e.look(full=True)
            return e.public_suspects()

    # -- teardown -----------------------------------------------------------------------------

    def terminate(self, grace: float = 5.0, kill_timeout: float = 5.0) -> TeardownReport:
        """Tear the lineage down and prove every member gone.

        Sample; stop new forks (freeze the cgroup, or SIGSTOP every member); SIGTERM
        every member; SIGCONT (thaw); for ``grace`` seconds keep sampling and
        SIGTERM every new member; then SIGKILL what is left (``cgroup.kill``) and
        wait at most ``kill_timeout`` seconds for the proof: each member's pidfd
        polls readable (or its identity no longer matches), and the backend's own
        proof (``populated 0``; nothing left below the reaper). Every signal goes
        through the pidfd opened when the member was first recorded; suspects are
        never signalled.

        Raises :class:`TeardownError` (with ``survivors``) when the proof does not
        come in time: the lineage then keeps its pidfds, fds and cgroup, and
        ``terminate()`` may be called again. After a teardown that succeeded, the
        lineage is released and ``terminate()`` raises :class:`LineageClosed`; the
        report stays in :attr:`report`.
        """
        grace = _check_seconds(grace, "grace")
        kill_timeout = _check_seconds(kill_timeout, "kill_timeout")
        return self._engine.terminate(grace, kill_timeout)

    def communicate(self, input: Optional[Union[bytes, str]] = None,
                    timeout: Optional[float] = None, *, grace: float = 5.0,
                    kill_timeout: float = 5.0) -> tuple[Any, Any]:
        """Read a spawned command's output to its end: ``(stdout, stderr)``.

        As ``Popen.communicate`` (pass ``stdout``/``stderr``/``stdin=subprocess.PIPE``
        to :meth:`spawn`; a stream not piped gives None), but the end is the
        command's own exit, not EOF: once the command has exited the lineage is torn
        down (``terminate(grace, kill_timeout)``; escaped jobs holding the pipe
        included), what is left in the pipes is read without blocking, and the
        pipes are closed. So it returns whatever escapes do with the pipe.
        ``subprocess.TimeoutExpired`` when the command runs past ``timeout``
        (nothing is lost: call again, without input or with the same: what
        of the first call's input is not written yet is written on);
        ``TeardownError`` when the teardown cannot prove every member gone. In text
        mode (``text=True``, ``encoding=``, ``errors=`` or ``universal_newlines=True``
        at :meth:`spawn`) input is a str and the output is str, decoded and with
        newlines translated as Popen does (decoded last: output that does not decode
        raises with the pipes closed and the command reaped).
        """
        p = self.process
        text = bool(getattr(p, "text_mode", False))
        data = _input_bytes(input, text, p.stdin)
        got = self._collected
        if got is None:
            got = self._collected = Collected()
            got.data = data
        elif input is not None and data != got.data:
            # As Popen's: a call after a timeout goes on with the first call's input
            # (what of it is not written yet is written now); it cannot send another.
            raise ValueError("cannot send another input after a communicate() that timed "
                             "out: call it again without input (the first call's input "
                             "is written on)")
        data = got.data
        files = {"stdout": p.stdout, "stderr": p.stderr}
        reads = {name: f.fileno() for name, f in files.items()
                 if f is not None and not f.closed}
        stdin = p.stdin if p.stdin is not None and not p.stdin.closed else None
        if stdin is not None:
            stdin.flush()
        deadline = None if timeout is None else time.monotonic() + _check_seconds(
            timeout, "timeout")
        ended = None
        root = self.root
        if root is not None:
            try:
                ended = _pidfd.open_pidfd(root.pid)
            except (ProcessLookupError, OutOfFds):
                ended = None
        try:
            if ended is not None and not _pidfd.still_there(ended, root.pid if root else None,
                                                           root.start_time if root else None):
                os.close(ended)  # the pid names another process now: it ended
                ended = None

            def running() -> bool:
                if ended is not None:
                    return not _ended.pidfd_ended(ended)
                return p.poll() is None

            done = read_until(list(reads.values()), None if stdin is None else stdin.fileno(),
                              data, ended, running, got, deadline,
                              stdin.close if stdin is not None else _nothing)
        finally:
            if ended is not None:
                os.close(ended)
        if not done:
            raise subprocess.TimeoutExpired(self._command or p.args, timeout or 0.0)
        if not self.closed:
            self.terminate(grace=grace, kill_timeout=kill_timeout)
        raws: dict[str, bytes] = {}
        codecs: dict[str, tuple[str, str]] = {}
        for name, fd in reads.items():
            chunks = got.chunks.get(fd, [])
            chunks += drain(fd)
            raws[name] = b"".join(chunks)
            f: Any = files[name]  # a TextIOWrapper in text mode
            if text:
                codecs[name] = (f.encoding, f.errors or "strict")
            f.close()
        try:
            p.wait(timeout=kill_timeout)
        except subprocess.TimeoutExpired:
            log.debug("lineage: %r not reaped within %gs", p.args, kill_timeout)
        self._collected = None
        # Decoded last, once the pipes are closed and the command reaped (as Popen's):
        # output that does not decode raises, and leaves nothing open behind it.
        out: dict[str, Any] = {"stdout": None, "stderr": None}
        for name, raw in raws.items():
            if text:
                # As Popen.communicate: decode with the stream's encoding and errors,
                # then translate \r\n and \r to \n.
                encoding, errors = codecs[name]
                out[name] = raw.decode(encoding, errors).replace("\r\n", "\n").replace(
                    "\r", "\n")
            else:
                out[name] = raw
        return out["stdout"], out["stderr"]

    def close(self) -> None:
        """Stop tracking and release every fd, pidfd and the cgroup (one that still
        holds processes is left in place), without signalling anything. After a
        failed teardown, this gives up its retry."""
        self._engine.close()

    def __enter__(self) -> Lineage:
        self._engine.check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.closed:
            self.terminate()

    def __repr__(self) -> str:
        e = self._engine
        root = e.root.pid if e.root is not None else None
        return f"<Lineage mode={e.mode} root={root} members={len(e.reg.live)} state={e.state}>"
