"""The BPF reader beside the /proc reader, its floor and psutil, with the same fields.

Each group (one per size) holds snapshot() through BPF, through /proc, the C
floor of the /proc reader and psutil's process_iter, every one reading pid,
ppid, state, name, create_time, uid, num_threads and rss of every process, as
`proctable bench` does. The BPF rows skip themselves where the BPF reader does
not run (not root, no BTF, ...), saying why.

    sudo python -m pytest benchmarks/bench_bpf.py --benchmark-enable -q \\
        --bench-procs 1000,4000,10000
"""

from __future__ import annotations

from typing import Any, Optional

import pytest

import proctable
from proctable import _lowlevel as _ll
from proctable.bench import Sleepers, drain
from proctable.bench.table import _ATTRS, _read_fields


def _group(sleepers: Optional[Sleepers]) -> str:
    return "readers, " + ("live table" if sleepers is None else f"+{sleepers.n} procs")


def _needs_bpf() -> None:
    r = proctable.reader()
    if r.name != "bpf":
        pytest.skip(f"the BPF reader does not run here: {r.why_not}")


def test_bpf_snapshot(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    _needs_bpf()
    benchmark.group = _group(sleepers)
    assert benchmark(lambda: _read_fields(proctable.snapshot(reader="bpf"))) > 0


def test_bpf_snapshot_no_memory(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    _needs_bpf()
    benchmark.group = _group(sleepers)
    assert benchmark(lambda: len(proctable.snapshot(memory=False, reader="bpf"))) > 0


def test_bpf_scanner_refresh(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    _needs_bpf()
    benchmark.group = _group(sleepers)
    with proctable.Scanner(reader="bpf") as s:
        assert benchmark(lambda: _read_fields(s.refresh())) > 0


def test_proc_snapshot(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    benchmark.group = _group(sleepers)
    assert benchmark(lambda: _read_fields(proctable.snapshot(reader="proc"))) > 0


def test_proc_floor(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    benchmark.group = _group(sleepers)
    assert benchmark(_ll.floor_scan, 0, _ll.WANT_MEM) > 0


def test_psutil_warm_same_fields(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    ps = pytest.importorskip("psutil")
    benchmark.group = _group(sleepers)
    fields = drain(ps.process_iter, _ATTRS)
    fields()  # warm the cache
    assert benchmark(fields) > 0
