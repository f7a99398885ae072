"""Lineage: every process a run starts (escapes included), and a teardown that proves them gone.

:class:`Lineage` is a thin face over an :class:`~._engine.Engine`, which owns
everything: the membership core (:mod:`._core`), the recorded members
(:mod:`._members`), one backend (:mod:`.cgroup`, :mod:`.subreaper` or :mod:`.scan`,
chosen from a table, never by branching on the mode), a subscription to the shared
proc-connector hub (:mod:`._hub`), and the sampler thread. The thread holds the
engine, never the Lineage, so a Lineage dropped without ``terminate()`` or
``close()`` is garbage collected: its engine is then released, with a
``ResourceWarning``. :class:`~._spawned.SpawnedProcess` is ``spawn``'s Popen.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .. import _ended, _pidfd
from .. import _lowlevel as _ll
from .._aio import is_asyncio_process
from .._output import Collected, drain, read_until
from ..errors import NoSuchProcess, OutOfFds, ProctableError
from ..table import Identity, Proc
from . import _helper
from ._backend import Backend, BackendUnavailable
from ._report import Change, Suspect, TeardownReport
from .cgroup import CgroupBackend
from .scan import ScanBackend
from .subreaper import SubreaperBackend

if TYPE_CHECKING:
    import asyncio
from ._engine import Engine
from ._spawned import SpawnedProcess

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
