"""The "psutil-compatible iteration" rows of ``proctable bench``.

``proctable.process_iter(attrs)`` beside ``psutil.process_iter(attrs)`` with the
same attributes, every yielded ``info`` dict read; once without and once with
``cmdline`` (the extra file read per process that most callers weigh).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Optional

from .._extra import X_PROCFS, floor_scan_extra
from ..compat._iter import _want, process_iter

if TYPE_CHECKING:  # the bench imports this module: no cycle at run time
    from . import BenchContext, Section

# The example of the issue and the README: what a psutil user's loop asks for.
ATTRS = ["pid", "name", "ppid", "status", "create_time", "username"]
ATTRS_CMDLINE = [*ATTRS, "cmdline"]


def _section(ctx: BenchContext, attrs: list[str], title: str) -> Section:
    from . import FLOOR, PSUTIL_COLD, PSUTIL_WARM, Row, Section, drain  # noqa: PLC0415 - cycle

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
