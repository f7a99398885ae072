"""``proctable bench``: proctable beside psutil and the C floor, measured alike.

The measurements are a list of sections (``SECTIONS``): each is a function
that gets the ``BenchContext`` (the sleepers, psutil if installed) and
returns a ``Section`` of ``Row``s, or None to leave itself out. To add rows
(an exit watcher, a lineage sample), append a section factory to
``SECTIONS``; ``run()`` measures every row of every section interleaved,
one call of each per round (A B C A B C ...), so machine noise hits them
alike, and reports medians.

Sleeping processes are started by one helper process and stopped by pid:
the helper and every sleeper die with their parent (PR_SET_PDEATHSIG), the
helper kills and reaps them when its stdin closes, and ``Sleepers.close()``
waits for all of that with bounded waits, then checks every pid.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import Any, Callable, Optional

from .. import _ended
from .. import _lowlevel as _ll
from .._fdwait import readable
from ..exits import exit_probe
from ..scanner import Scanner
from ..table import Proc, Table, _table, read, reader, snapshot

__all__ = [
    "SECTIONS",
    "BenchContext",
    "Row",
    "Section",
    "Sleepers",
    "results",
    "run",
]

# The helper: forks n sleepers (each execs `sleep`, dies with the helper) and
# one chain of CHAIN processes (each the child of the one before, in its own
# process group) for the subtree rows; prints their pids; when its stdin
# closes (or reads anything), kills them all and reaps them, then exits.
_HELPER = r"""
import os, signal, sys
parent, n, chain = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
try:
    import ctypes
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except Exception:
    _prctl = None
def die_with_parent(expected):
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)          # PR_SET_PDEATHSIG
    if os.getppid() != expected:           # the parent died before that
        os._exit(0)
def become_sleeper(parent_pid):
    die_with_parent(parent_pid)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        os.execv("/bin/sleep", ["sleep", "3600"])
    except OSError:
        os.execvp("sleep", ["sleep", "3600"])
signal.signal(signal.SIGINT, signal.SIG_IGN)   # the bench stops us, by closing our stdin
die_with_parent(parent)
if _prctl is not None:
    _prctl(36, 1)                          # PR_SET_CHILD_SUBREAPER: the chain's orphans come here
me = os.getpid()
out = sys.stdout
pids, batch = [], []
try:
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                become_sleeper(me)
            finally:
                os._exit(127)
        pids.append(pid)
        batch.append(str(pid))
        if len(batch) == 100 or i == n - 1:
            out.write("pids " + " ".join(batch) + "\n")
            out.flush()
            batch = []
    if chain:
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, 0)
                up = me
                for depth in range(chain):
                    die_with_parent(up)
                    out.write("chain %d\n" % os.getpid())
                    out.flush()
                    up = os.getpid()
                    if depth + 1 == chain or os.fork() != 0:
                        become_sleeper(os.getppid())
            finally:
                os._exit(127)
        pids.append(pid)
    out.write("ready\n")
    out.flush()
    sys.stdin.buffer.read(1)
finally:
    signal.alarm(20)                       # bounded: the reaping below cannot hang
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)   # a chain member's child dies with it
        except OSError:
            pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
"""

CHAIN = 5  # the subtree of the descendants rows: a root and 4 below it


class Sleepers:
    """n sleeping processes (and a 5-process chain) that die with this process.

    Use as a context manager, or call ``close()``: it closes the helper's
    stdin (the helper then kills and reaps every sleeper), waits for the
    helper (bounded), kills it by pid if it does not exit, and finally checks
    every sleeper pid: whatever still holds the start time it had is killed.
    Spawn from the main thread (PR_SET_PDEATHSIG follows the spawning thread).
    """

    def __init__(
        self, n: int, chain: int = CHAIN, progress: Optional[Callable[[int, int], None]] = None
    ) -> None:
        self.n = n
        self.pids: list[int] = []
        self.chain: list[int] = []
        self._idents: list[tuple[int, int]] = []
        self._helper: Optional[subprocess.Popen[bytes]] = None
        try:
            self._spawn(n, chain, progress)
        except BaseException:
            self.close()
            raise

    def _spawn(
        self, n: int, chain: int, progress: Optional[Callable[[int, int], None]]
    ) -> None:
        self._helper = subprocess.Popen(
            [sys.executable, "-c", _HELPER, str(os.getpid()), str(n), str(chain)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C reaches the bench, which stops it by pid
        )
        assert self._helper.stdout is not None
        fd = self._helper.stdout.fileno()
        deadline = time.monotonic() + 60 + n * 0.02
        pending = b""
        ready = False
        while not ready or len(self.chain) < chain:  # the chain reports on its own
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"starting {n} sleepers took too long")
            r = readable([fd], min(left, 1.0))
            if not r:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the sleeper helper exited (status {self._helper.poll()})")
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                word, *rest = raw.decode("ascii", "replace").split() or [""]
                if word == "pids":
                    self.pids.extend(int(x) for x in rest)
                    if progress is not None:
                        progress(len(self.pids), n)
                elif word == "chain":
                    self.chain.append(int(rest[0]))
                elif word == "ready":
                    ready = True
        if len(self.pids) != n or len(self.chain) != chain:
            raise RuntimeError(f"the sleeper helper started {len(self.pids)} of {n} sleepers")
        # The chain's leaves may still be between fork and exec: wait (bounded)
        # until every pid shows, then remember each one's start time.
        want = [*self.pids, *self.chain]
        deadline = time.monotonic() + 30
        while True:
            table = snapshot()
            rows = [table.get(pid) for pid in want]
            if all(r is not None and r.name == "sleep" for r in rows) or (
                time.monotonic() > deadline
            ):
                break
            time.sleep(0.01)
        helper = read(self._helper.pid)
        self._idents = [(r.pid, r.start_time) for r in [helper, *rows] if r is not None]

    @property
    def all_pids(self) -> list[int]:
        return [*self.pids, *self.chain]

    @property
    def idents(self) -> list[tuple[int, int]]:
        """(pid, start time) of the helper and every sleeper, the chain's included."""
        return list(self._idents)

    def close(self, timeout: float = 20.0) -> None:
        """Stop every sleeper and the helper; returns within about timeout + 2 s."""
        helper, self._helper = self._helper, None
        if helper is not None:
            try:
                if helper.stdin is not None:
                    helper.stdin.close()
            except OSError:
                pass
            try:
                helper.wait(timeout)
            except subprocess.TimeoutExpired:
                helper.kill()  # its sleepers die with it (PR_SET_PDEATHSIG)
                try:
                    helper.wait(2.0)
                except subprocess.TimeoutExpired:
                    pass
            if helper.stdout is not None:
                helper.stdout.close()
        # Whatever still holds a sleeper's (pid, start time) is a sleeper left behind.
        for pid, start in self._idents:
            row = read(pid, memory=False)
            if not _ended.ended(None, row, start):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self._idents = []

    def __enter__(self) -> Sleepers:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()


# --- measurement ---------------------------------------------------------------

# Row roles: ratios of a "subject" row are taken against its section's rows
# of these roles.
SUBJECT, PSUTIL_WARM, PSUTIL_COLD, FLOOR = "subject", "psutil warm", "psutil cold", "floor"


@dataclass
class Row:
    """One thing to time. fn is called `inner` times per round (setup first, untimed).

    ``floor`` names the floor rows to compare with; the ratio is taken against
    the fastest of them (the best floor). ``vs_psutil``: compare with the
    section's psutil rows (only where psutil was asked for the same fields).
    """

    name: str
    fn: Callable[[], object]
    role: str = SUBJECT
    setup: Optional[Callable[[], object]] = None
    inner: int = 1
    floor: Sequence[str] = ()
    vs_psutil: bool = True
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else math.nan


@dataclass
class Section:
    """Rows measured side by side. per_proc: also report time / processes."""

    title: str
    rows: list[Row]
    per_proc: bool = False
    note: str = ""


@dataclass
class BenchContext:
    sleepers: Optional[Sleepers]
    psutil: Optional[ModuleType]
    rounds: int
    procs: int = 0  # processes in the table when measuring starts
    threads: int = 1  # threads a /proc snapshot of this table uses
    reader: tuple[str, Optional[str]] = ("proc", None)  # proctable.reader()
    cleanup: list[Callable[[], object]] = field(default_factory=list)
    compat_api: bool = False  # also the sections of proctable.compat's process API
    started: list[tuple[int, int]] = field(default_factory=list)  # (pid, start) of others started


# The fields every table row reads: what a supervisor's or a monitor's loop reads.
# psutil is asked for the same ones (uids for the uid, memory_info for rss).
FIELDS = ("pid", "ppid", "state", "name", "create_time", "uid", "num_threads")
_ATTRS = ["pid", "ppid", "status", "name", "create_time", "uids", "num_threads",
          "memory_info"]


def _read_fields(table: Table) -> int:
    """Read FIELDS and rss of every row (lazy attributes pay for themselves here)."""
    seen: object = None
    for p in table:
        seen = (p.pid, p.ppid, p.state, p.name, p.create_time, p.uid, p.num_threads, p.rss)
    return len(table) if seen is not None else 0


def _read_fields_no_mem(table: Table) -> int:
    seen: object = None
    for p in table:
        seen = (p.pid, p.ppid, p.state, p.name, p.create_time, p.uid, p.num_threads)
    return len(table) if seen is not None else 0


def drain(it: Callable[..., Any], attrs: list[str], **kw: Any) -> Callable[[], int]:
    """A timed call of a psutil-style ``process_iter`` (psutil's or proctable's):
    every yielded ``info`` read for every attribute; it returns the processes."""
    def run() -> int:
        n = 0
        for p in it(attrs, **kw):
            info = p.info
            for a in attrs:
                info[a]
            n += 1
        return n

    return run


def _kept_fds_each(holders: int) -> int:
    """max_fds for each of ``holders`` sets of kept fds (Scanners and their
    floors) so that together they stay within the soft RLIMIT_NOFILE, less the
    fds open now and a reserve for the one-shot reads: every Scanner row is
    measured against a floor holding the same number of fds, and none of them
    runs into EMFILE."""
    import resource  # noqa: PLC0415 - only for the bench

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 2 * 32768 * holders
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 64
    spare = soft - open_now - 128
    return max(0, min(spare // max(holders, 1), 32768))


def _fd_note(max_fds: int, kept: int) -> str:
    import resource  # noqa: PLC0415 - only for the note

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft:,}"
    return (f"RLIMIT_NOFILE {limit}: each Scanner and its kept-fd floor max_fds "
            f"{max_fds:,} (together within the limit), {kept:,} processes kept open")


def _section_table(ctx: BenchContext) -> Section:
    bpf = ctx.reader[0] == "bpf"
    # The sets of kept fds open at once: through BPF the two Scanners keep none,
    # and Scanner(reader='proc') is measured against the floor instead.
    each = _kept_fds_each(3 if bpf else 4)
    scanner = Scanner(max_fds=each)
    floor_fds = _ll.FdScanner(each, want=_ll.WANT_MEM, floor=True)
    scanner_nm = Scanner(max_fds=each, memory=False)
    floor_fds_nm = _ll.FdScanner(each, want=0, floor=True)
    scanner_proc = Scanner(max_fds=each if bpf else 0, reader="proc")
    ctx.cleanup += [scanner.close, floor_fds.close, scanner_nm.close, floor_fds_nm.close,
                    scanner_proc.close]
    scanner.refresh()  # opens the fds (/proc reader); refreshes after this re-read them
    floor_fds.refresh(Proc)
    scanner_nm.refresh()
    floor_fds_nm.refresh(Proc)
    if bpf:
        scanner_proc.refresh()
    kept = max(0, ((scanner_proc if bpf else scanner).open_fds - 1) // 3)
    mem, nomem, procfs = _ll.WANT_MEM, 0, _ll.WANT_PROCFS
    best = ("C floor", "C floor, 1 thread")
    rows = [
        Row("snapshot()", lambda: _read_fields(snapshot()), floor=best),
        Row("snapshot(memory=False)", lambda: _read_fields_no_mem(snapshot(memory=False)),
            floor=("C floor, stat only", "C floor, stat only, 1 thread"), vs_psutil=False),
        Row("Scanner.refresh()", lambda: _read_fields(scanner.refresh()),
            floor=("C floor, Scanner's kept fds",)),
        Row("Scanner(memory=False).refresh()",
            lambda: _read_fields_no_mem(scanner_nm.refresh()), vs_psutil=False,
            floor=("C floor, Scanner's kept fds, stat only",)),
    ]
    if bpf:
        # The /proc reader beside the BPF one, on the same table.
        rows += [
            Row("snapshot(reader='proc')", lambda: _read_fields(snapshot(reader="proc")),
                floor=best),
            Row("Scanner(reader='proc').refresh()",
                lambda: _read_fields(scanner_proc.refresh()),
                floor=("C floor, Scanner's kept fds",)),
        ]
    rows += [
        Row("snapshot(), /proc, 1 thread",
            lambda: _read_fields(_table(_ll.snapshot_rows(Proc, 1, mem | procfs)[0])),
            floor=("C floor, 1 thread",)),
        Row("C floor", lambda: _ll.floor_scan(0, mem), role=FLOOR),
        Row("C floor, 1 thread", lambda: _ll.floor_scan(1, mem), role=FLOOR),
        Row("C floor, stat only", lambda: _ll.floor_scan(0, nomem), role=FLOOR),
        Row("C floor, stat only, 1 thread", lambda: _ll.floor_scan(1, nomem), role=FLOOR),
        Row("C floor, Scanner's kept fds", lambda: floor_fds.refresh(Proc), role=FLOOR),
        Row("C floor, Scanner's kept fds, stat only", lambda: floor_fds_nm.refresh(Proc),
            role=FLOOR),
    ]
    ps = ctx.psutil
    if ps is not None:
        fields = drain(ps.process_iter, _ATTRS)
        rows.append(Row("psutil process_iter, warm", fields, role=PSUTIL_WARM))
        rows.append(Row("psutil process_iter, cold", fields, role=PSUTIL_COLD,
                        setup=ps.process_iter.cache_clear))
    which = "BPF task iterator" if bpf else f"/proc (not BPF: {ctx.reader[1]})"
    return Section(
        "whole table",
        rows,
        per_proc=True,
        note=(f"reader: {which}; every row reads {', '.join(FIELDS)} and rss of every "
              f"process (psutil: {', '.join(_ATTRS)}); the floors are the /proc reader's "
              f"system calls with no parsing, 'vs floor' is against the best of the named "
              f"floors; /proc snapshot threads {ctx.threads}; {_fd_note(each, kept)}"),
    )


def _target_pid(ctx: BenchContext) -> int:
    if ctx.sleepers is not None and ctx.sleepers.pids:
        return ctx.sleepers.pids[len(ctx.sleepers.pids) // 2]
    return os.getpid()


def _section_one(ctx: BenchContext) -> Section:
    pid = _target_pid(ctx)
    mem = _ll.WANT_MEM

    def one() -> object:
        p = read(pid)
        assert p is not None
        return (p.pid, p.ppid, p.state, p.name, p.create_time, p.uid, p.num_threads, p.rss)

    rows = [
        Row("read(pid)", one, inner=200, floor=("C floor: one process",)),
        Row("exit_probe(pid)", lambda: exit_probe(pid).state, inner=200, vs_psutil=False,
            floor=("C floor: one process, stat only",)),
        Row("C floor: one process", lambda: _ll.floor_read(pid, mem), role=FLOOR, inner=200),
        Row("C floor: one process, stat only", lambda: _ll.floor_read(pid, 0), role=FLOOR,
            inner=200),
    ]
    ps = ctx.psutil
    if ps is not None:
        proc = ps.Process(pid)
        rows.append(Row("psutil Process.as_dict, warm",
                        lambda: proc.as_dict(_ATTRS), role=PSUTIL_WARM, inner=50))
        rows.append(Row("psutil Process(pid).as_dict, cold",
                        lambda: ps.Process(pid).as_dict(_ATTRS), role=PSUTIL_COLD, inner=50))
    return Section("one process", rows, note="the same fields as above")


def _section_subtree(ctx: BenchContext) -> Optional[Section]:
    if ctx.sleepers is None or not ctx.sleepers.chain:
        return None
    root = ctx.sleepers.chain[0]
    base = snapshot()
    rows = [
        # Pure Python over rows already read: no kernel call, so no floor, and
        # no psutil ratio (psutil reads /proc for its answer; compare the row below).
        Row("Table.descendants(root), fresh index",
            lambda: Table(base).descendants(root), inner=20, vs_psutil=False),
        Row("snapshot().descendants(root)", lambda: snapshot().descendants(root),
            floor=("C floor",)),
        Row("C floor", lambda: _ll.floor_scan(0), role=FLOOR),
    ]
    ps = ctx.psutil
    if ps is not None:
        proc = ps.Process(root)
        rows.append(Row("psutil children(recursive=True)",
                        lambda: proc.children(recursive=True), role=PSUTIL_WARM))
    n = len(base.descendants(root))
    return Section(f"subtree of {n + 1} processes", rows,
                   note="fresh index: a new Table over rows already read, each call (no "
                   "kernel calls, so no ratio); snapshot().descendants reads the table too, "
                   "as psutil does")


# Section factories, measured in this order. Append to extend the bench.
SECTIONS: list[Callable[[BenchContext], Optional[Section]]] = [
    _section_table,
    _section_one,
    _section_subtree,
]

from .compat import API_SECTIONS, section_compat, section_compat_cmdline  # noqa: E402

SECTIONS += [section_compat, section_compat_cmdline, *API_SECTIONS]


def _time_row(row: Row) -> None:
    if row.setup is not None:
        row.setup()
    t0 = time.perf_counter()
    for _ in range(row.inner):
        row.fn()
    row.samples.append((time.perf_counter() - t0) / row.inner)


def measure(
    sections: Sequence[Section],
    rounds: int,
    progress: Optional[Callable[[int, int], None]] = None,
) -> None:
    """Run every row once per round, interleaved; one untimed warm-up round first."""
    rows = [r for s in sections for r in s.rows]
    for r in rows:  # warm-up: caches, imports, buffers
        if r.setup is not None:
            r.setup()
        r.fn()
    for i in range(rounds):
        if progress is not None:
            progress(i, rounds)
        # Rotate the start so that no row always runs right after the same one.
        k = i % len(rows) if rows else 0
        for r in rows[k:] + rows[:k]:
            _time_row(r)
    if progress is not None:
        progress(rounds, rounds)


def _ratios(section: Section, row: Row) -> dict[str, Optional[float]]:
    by_role: dict[str, Row] = {}
    for r in section.rows:
        by_role.setdefault(r.role, r)
    out: dict[str, Optional[float]] = {"vs psutil warm": None, "vs psutil cold": None,
                                       "vs floor": None}
    if row.role != SUBJECT:
        return out
    if row.vs_psutil:
        for role in (PSUTIL_WARM, PSUTIL_COLD):
            base = by_role.get(role)
            if base is not None and row.median > 0:
                out["vs " + role] = base.median / row.median
    floors = [r for r in section.rows if r.name in row.floor and r.median > 0]
    if floors:
        out["vs floor"] = row.median / min(r.median for r in floors)
    return out


def results(ctx: BenchContext, sections: Sequence[Section]) -> dict[str, Any]:
    """The measurements as plain data (what --json prints)."""
    return {
        "procs": ctx.procs,
        "sleepers": 0 if ctx.sleepers is None else ctx.sleepers.n,
        "rounds": ctx.rounds,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "snapshot_threads": ctx.threads,
        "parallel_min": _ll.PARALLEL_MIN,
        "reader": {"name": ctx.reader[0], "why_not": ctx.reader[1]},
        "psutil": None if ctx.psutil is None else ctx.psutil.__version__,
        # (pid, start time) of every process the bench started, to check they are gone.
        "started": ([] if ctx.sleepers is None else [list(i) for i in ctx.sleepers.idents])
        + [list(i) for i in ctx.started],
        "sections": [
            {
                "title": s.title,
                "note": s.note,
                "rows": [
                    {
                        "name": r.name,
                        "role": r.role,
                        "median_s": r.median,
                        "us_per_proc": r.median * 1e6 / ctx.procs
                        if s.per_proc and ctx.procs else None,
                        "samples": len(r.samples),
                        **{k.replace(" ", "_"): v for k, v in _ratios(s, r).items()},
                    }
                    for r in s.rows
                ],
            }
            for s in sections
        ],
    }


def _import_psutil() -> Optional[ModuleType]:
    try:
        import psutil  # noqa: PLC0415 - optional
    except ImportError:
        return None
    return psutil  # type: ignore[no-any-return]


def _quiet(text: str) -> None:
    pass


def run(procs: int, rounds: int, progress: Optional[Callable[[str], None]] = None,
        use_psutil: bool = True, watcher: bool = False,
        lineage: bool = False, compat_api: bool = False) -> dict[str, Any]:
    """Start procs sleepers, measure every section, stop them; the results.

    ``progress(text)`` hears what is going on; the first word of text names the
    phase (starting, started, measuring:, exit, lineage:, stopping).
    """
    say = progress or _quiet
    sleepers: Optional[Sleepers] = None
    ctx = BenchContext(None, _import_psutil() if use_psutil else None, rounds,
                       compat_api=compat_api)
    try:
        if procs > 0:
            say(f"starting {procs:,} sleepers ...")
            sleepers = Sleepers(procs, progress=lambda k, n: say(f"started {k:,}/{n:,} sleepers"))
            ctx.sleepers = sleepers
        say("loading the table readers ...")
        ctx.reader = tuple(reader())  # type: ignore[assignment]
        ctx.procs = len(snapshot())
        ctx.threads = _ll.scan_threads(ctx.procs)
        sections = [s for s in (f(ctx) for f in SECTIONS) if s is not None]
        measure(sections, rounds,
                lambda i, n: say(f"measuring: round {i}/{n}"))
        ctx.procs = len(snapshot())
        data = results(ctx, sections)
        if watcher:
            from .exits import exits_bench  # noqa: PLC0415 - only when asked

            say("exit watcher: 50 lost exits, then 1,000 watched processes idle for 5 s ...")
            data["exit_watcher"] = exits_bench(n_exits=50, n_idle=1000, idle_seconds=5.0)
        if lineage:
            from .lineage import lineage_bench  # noqa: PLC0415 - only when asked

            say("lineage: sampler cost (20 members) and teardown (100 members) ...")
            # The sleepers started above are the unrelated processes on the host.
            data["lineage"] = lineage_bench(procs=0 if procs else 1000)
        return data
    finally:
        for fn in reversed(ctx.cleanup):
            try:
                fn()
            except Exception:
                pass
        if sleepers is not None:
            say(f"stopping {procs:,} sleepers ...")
            sleepers.close()
