"""How the bench measures: rows of one section timed side by side, interleaved
(A B C A B C ...) so that machine noise hits them alike; medians, and ratios
against the section's psutil and floor rows."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Optional

from .. import _lowlevel as _ll
from ._sleepers import Sleepers

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
