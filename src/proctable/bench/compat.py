"""The "psutil-compatible iteration" rows of ``proctable bench``.

``proctable.process_iter(attrs)`` beside ``psutil.process_iter(attrs)`` with the
same attributes, every yielded ``info`` dict read; once without and once with
``cmdline`` (the extra file read per process that most callers weigh).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import ModuleType
from typing import Any, Callable, Optional

from .. import _ended
from .._extra import X_PROCFS, floor_scan_extra
from .._fdwait import readable
from ..compat import _process as _cp
from ..compat._iter import _want, process_iter
from ..table import read, snapshot
from ._measure import FLOOR, PSUTIL_COLD, PSUTIL_WARM, BenchContext, Row, Section, drain
from .table import _target_pid

# The example of the issue and the README: what a psutil user's loop asks for.
ATTRS = ["pid", "name", "ppid", "status", "create_time", "username"]
ATTRS_CMDLINE = [*ATTRS, "cmdline"]


def _section(ctx: BenchContext, attrs: list[str], title: str) -> Section:

    want = _want(tuple(attrs))
    bpf = ctx.reader[0] == "bpf"
    rows = [Row("proctable.process_iter(attrs)", drain(process_iter, attrs),
                floor=("C pass alone",)),
            Row("C pass alone", lambda: floor_scan_extra(want), role=FLOOR)]
    if bpf:
        # What a user without the privileges BPF needs gets: the /proc reader.
        rows += [Row("process_iter(attrs, reader='proc')",
                     drain(process_iter, attrs, reader="proc"),
                     floor=("C pass alone, /proc",)),
                 Row("C pass alone, /proc", lambda: floor_scan_extra(want | X_PROCFS),
                     role=FLOOR)]
    ps: Optional[ModuleType] = ctx.psutil
    if ps is not None:
        fn = drain(ps.process_iter, attrs)
        rows.append(Row("psutil.process_iter(attrs), warm", fn, role=PSUTIL_WARM))
        rows.append(Row("psutil.process_iter(attrs), cold", fn, role=PSUTIL_COLD,
                        setup=ps.process_iter.cache_clear))
    which = ("the BPF reader: table, cpu and ids from its records, other files from /proc"
             if bpf else "/proc")
    return Section(title, rows, per_proc=True,
                   note="attrs: " + ", ".join(attrs) + f"; reader: {which}; the C pass "
                   "alone: the same system calls and parsing, no Python objects")


def section_compat(ctx: BenchContext) -> Section:
    return _section(ctx, ATTRS, "psutil-compatible iteration")


def section_compat_cmdline(ctx: BenchContext) -> Section:
    return _section(ctx, ATTRS_CMDLINE, "psutil-compatible iteration, with cmdline")


# --- proctable.compat's process API beside psutil's (``proctable bench --compat``) -----

TREE = 200  # processes in the tree whose children(recursive=True) is timed
WAITED = 50  # processes wait_procs() waits for

# The tree: its root forks 10 branches, each forks sleepers up to TREE processes in
# all; every one dies with its parent (PR_SET_PDEATHSIG). The root prints "ready";
# when its stdin closes it kills the branches (whose sleepers die with them) and,
# a subreaper, reaps them all before it exits.
_TREE = r"""
import os, signal, sys
n = int(sys.argv[1])
try:
    import ctypes
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except Exception:
    _prctl = None
def die_with(parent):
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)
die_with(int(sys.argv[2]))
if _prctl is not None:
    _prctl(36, 1)                          # PR_SET_CHILD_SUBREAPER: orphans come here, to reap
signal.signal(signal.SIGINT, signal.SIG_IGN)
me, branches, per = os.getpid(), 10, (n - 11) // 10
extra = n - 11 - per * 10
kids = []
for b in range(branches):
    pid = os.fork()
    if pid == 0:
        try:
            die_with(me)
            up = os.getpid()
            for i in range(per + (1 if b < extra else 0)):
                if os.fork() == 0:
                    try:
                        die_with(up)
                        null = os.open(os.devnull, os.O_RDWR)
                        for fd in (0, 1, 2):
                            os.dup2(null, fd)
                        os.execv("/bin/sleep", ["sleep", "3600"])
                    finally:
                        os._exit(127)
            signal.pause()
        finally:
            os._exit(0)
    kids.append(pid)
sys.stdout.write("ready\n")
sys.stdout.flush()
try:
    sys.stdin.buffer.read(1)
finally:
    signal.alarm(20)
    for pid in kids:
        try:
            os.kill(pid, signal.SIGKILL)       # a branch's sleepers die with it
        except OSError:
            pass
    while True:                            # the branches, and the orphaned sleepers
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
"""


class Tree:
    """TREE processes in one tree (a root, 10 branches, sleepers below them) that
    die with this process; close() stops them, then kills by (pid, start time)
    whatever of them is left."""

    def __init__(self, n: int = TREE) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _TREE, str(n), str(os.getpid())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     start_new_session=True)
        self.idents: list[tuple[int, int]] = []
        try:
            self._wait_ready(n)
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, n: int) -> None:
        assert self.proc.stdout is not None
        if not readable([self.proc.stdout.fileno()], 60):
            raise TimeoutError("the tree did not start within 60 s")
        if self.proc.stdout.readline() != b"ready\n":
            raise RuntimeError(f"the tree's root exited ({self.proc.poll()})")
        deadline = time.monotonic() + 60
        while True:
            below = snapshot().descendants(self.proc.pid)
            if (len(below) == n - 1 and all(p.name == "sleep" for p in below
                                           if p.ppid != self.proc.pid)):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the tree has {len(below) + 1} of {n} processes")
            time.sleep(0.01)
        root = read(self.proc.pid)
        self.idents = [(p.pid, p.start_time) for p in [*below, *([root] if root else [])]]

    @property
    def root(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        p = self.proc
        try:
            if p.stdin is not None:
                p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
        if p.stdout is not None:
            p.stdout.close()
        for pid, start in self.idents:
            if not _ended.ended(None, read(pid, memory=False), start):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self.idents = []


class Exiting:
    """WAITED children of this process for one timed wait_procs(), started in a
    row's setup: killed at the start of the timed call (``killed``), or killed
    and turned zombies before it (``zombies``). Whatever a call left is killed
    and reaped by close()."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.objects: list[Any] = []

    def start(self, make: Callable[[int], Any], zombies: bool) -> None:
        self.close()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            for _ in range(WAITED):
                self.pids.append(os.posix_spawn(
                    "/bin/sleep", ["sleep", "3600"], {},
                    file_actions=[(os.POSIX_SPAWN_DUP2, null, 1), (os.POSIX_SPAWN_DUP2, null, 2)]))
        finally:
            os.close(null)
        self.objects = [make(pid) for pid in self.pids]
        if zombies:
            self.kill()
            deadline = time.monotonic() + 30
            for pid in self.pids:
                while time.monotonic() < deadline:
                    row = read(pid, memory=False)
                    if row is None or row.state == "Z":
                        break
                    time.sleep(0.001)

    def kill(self) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def close(self) -> None:
        self.kill()
        for pid in self.pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass  # reaped by the wait_procs() timed
        self.pids, self.objects = [], []


def _every_as_dict(ps: Any) -> Callable[[], int]:
    """Process(pid).as_dict(attrs) of every pid of ps.pids(), as a psutil loop
    does it (a process gone meanwhile, or psutil's NoSuchProcess of a kernel
    thread's environ, is skipped)."""
    from ..compat import AS_DICT_ATTRS  # noqa: PLC0415

    attrs = list(AS_DICT_ATTRS)

    def run() -> int:
        n = 0
        for pid in ps.pids():
            try:
                ps.Process(pid).as_dict(attrs)
            except ps.NoSuchProcess:
                continue
            n += 1
        return n

    return run


def _api_rows(ctx: BenchContext, title: str, ours: list[Row], theirs: Optional[Row],
              note: str, per_proc: bool = False) -> Section:

    rows = list(ours)
    if theirs is not None:
        rows.append(theirs)
    return Section(title, rows, per_proc=per_proc, note=note)


def section_as_dict_one(ctx: BenchContext) -> Optional[Section]:
    if not ctx.compat_api:
        return None
    from ..compat import AS_DICT_ATTRS, Process  # noqa: PLC0415

    pid, attrs = _target_pid(ctx), list(AS_DICT_ATTRS)
    ps = ctx.psutil
    theirs = None if ps is None else Row("psutil.Process(pid).as_dict(attrs)",
                                         lambda: ps.Process(pid).as_dict(attrs),
                                         role=PSUTIL_WARM, inner=50)
    return _api_rows(ctx, "compat: Process(pid).as_dict(), one process",
                     [Row("compat.Process(pid).as_dict(attrs)",
                          lambda: Process(pid).as_dict(attrs), inner=50)], theirs,
                     f"attrs: the {len(attrs)} names compat offers (AS_DICT_ATTRS), on both "
                     "sides; a sleeping process; the reader does not matter (one process "
                     "is read from /proc)")


def section_as_dict_all(ctx: BenchContext) -> Optional[Section]:
    if not ctx.compat_api:
        return None
    from .. import compat  # noqa: PLC0415

    ps = ctx.psutil
    theirs = None if ps is None else Row("psutil: Process(pid).as_dict(attrs), every pid",
                                         _every_as_dict(ps), role=PSUTIL_WARM)
    return _api_rows(ctx, "compat: Process(pid).as_dict() of every process",
                     [Row("compat: Process(pid).as_dict(attrs), every pid",
                          _every_as_dict(compat))], theirs,
                     "for pid in pids(): Process(pid).as_dict(attrs), the same attrs",
                     per_proc=True)


def section_children(ctx: BenchContext) -> Optional[Section]:
    if not ctx.compat_api:
        return None
    from ..compat import Process  # noqa: PLC0415

    tree = Tree()
    ctx.cleanup.append(tree.close)
    ctx.started += tree.idents
    mine = Process(tree.root)

    def on(road: str) -> Callable[[], object]:
        def run() -> object:
            _cp._children_road = road
            try:
                return mine.children(recursive=True)
            finally:
                _cp._children_road = "auto"
        return run

    rows = [Row("compat, children files (the /proc road)", on("walk"))]
    if ctx.reader[0] == "bpf":
        rows.append(Row("compat, one BPF table read (as root)", on("table")))
    rows.append(Row("compat, one /proc table read", on("table-proc")))
    ps = ctx.psutil
    theirs = None
    if ps is not None:
        p = ps.Process(tree.root)
        theirs = Row("psutil children(recursive=True)", lambda: p.children(recursive=True),
                     role=PSUTIL_WARM)
    return _api_rows(ctx, f"compat: children(recursive=True) of a {TREE}-process tree", rows,
                     theirs, "compat: the children files of the tree's processes, or one "
                     "table read; psutil: every stat file of the host, then each child's")


def section_pids(ctx: BenchContext) -> Optional[Section]:
    if not ctx.compat_api:
        return None
    from ..compat import pids  # noqa: PLC0415

    ps = ctx.psutil
    theirs = None if ps is None else Row("psutil.pids()", ps.pids, role=PSUTIL_WARM, inner=5)
    return _api_rows(ctx, "compat: pids()", [Row("compat.pids()", pids, inner=5)], theirs,
                     "a listing of /proc: the kernel's readdir is most of it on both sides",
                     per_proc=True)


def section_pid_exists(ctx: BenchContext) -> Optional[Section]:
    if not ctx.compat_api:
        return None
    from ..compat import pid_exists  # noqa: PLC0415

    pid = _target_pid(ctx)
    ps = ctx.psutil
    theirs = None if ps is None else Row("psutil.pid_exists(pid)", lambda: ps.pid_exists(pid),
                                         role=PSUTIL_WARM, inner=500)
    return _api_rows(ctx, "compat: pid_exists()",
                     [Row("compat.pid_exists(pid)", lambda: pid_exists(pid), inner=500)],
                     theirs, "a pid that exists (a thread id is none, on both sides)")


def _section_wait(ctx: BenchContext, zombies: bool) -> Optional[Section]:
    if not ctx.compat_api:
        return None
    from .. import compat  # noqa: PLC0415

    def rows_for(ps: Any, name: str, role: str) -> Row:
        batch = Exiting()
        ctx.cleanup.append(batch.close)

        def setup() -> None:
            batch.start(ps.Process, zombies)

        def run() -> int:
            if not zombies:
                batch.kill()
            gone, alive = ps.wait_procs(batch.objects, timeout=30)
            if alive:
                raise RuntimeError(f"{len(alive)} of {WAITED} processes did not end in 30 s")
            return len(gone)

        return Row(name, run, role=role, setup=setup)

    ps = ctx.psutil
    what = "zombies already" if zombies else "killed (SIGKILL) as the call starts"
    return _api_rows(ctx, f"compat: wait_procs() of {WAITED} processes, {what}",
                     [rows_for(compat, "compat.wait_procs(procs)", "subject")],
                     None if ps is None else rows_for(ps, "psutil.wait_procs(procs)",
                                                      PSUTIL_WARM),
                     f"{WAITED} children of the bench (posix_spawn of sleep), their Process "
                     "objects made before the call; the call reaps them all")


def section_wait_killed(ctx: BenchContext) -> Optional[Section]:
    return _section_wait(ctx, zombies=False)


def section_wait_zombies(ctx: BenchContext) -> Optional[Section]:
    return _section_wait(ctx, zombies=True)


API_SECTIONS = [section_as_dict_one, section_as_dict_all, section_children, section_pids,
                section_pid_exists, section_wait_killed, section_wait_zombies]
"""The sections of ``proctable bench --compat`` (each None unless asked for)."""
