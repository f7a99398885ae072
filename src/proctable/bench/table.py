"""The table's sections: the whole table, one process, one subtree, each read by
proctable, by psutil (warm and cold) and by the C floor, for the same fields."""

from __future__ import annotations

import os
from typing import Optional

from .. import _lowlevel as _ll
from ..exits import exit_probe
from ..scanner import Scanner
from ..table import Proc, Table, _table, read, snapshot
from ._measure import FLOOR, PSUTIL_COLD, PSUTIL_WARM, BenchContext, Row, Section, drain

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
