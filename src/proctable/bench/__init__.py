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

from typing import Any, Callable, Optional

from .. import _lowlevel as _ll
from ..table import reader, snapshot
from ._measure import BenchContext, Row, Section, _import_psutil, _quiet, drain, measure, results
from ._sleepers import Sleepers
from .compat import API_SECTIONS, section_compat, section_compat_cmdline
from .table import _section_one, _section_subtree, _section_table

__all__ = [
    "SECTIONS",
    "BenchContext",
    "Row",
    "Section",
    "Sleepers",
    "drain",
    "results",
    "run",
]

# Section factories, measured in this order. Append to extend the bench.
SECTIONS: list[Callable[[BenchContext], Optional[Section]]] = [
    _section_table,
    _section_one,
    _section_subtree,
    section_compat,
    section_compat_cmdline,
    *API_SECTIONS,
]


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
