"""Side by side: proctable, psutil and the C floor, grouped per operation and size.

Each group holds the proctable call, its psutil equivalent and the C floor (the
same syscalls with no parsing and no Python rows), so pytest-benchmark prints
them together. `proctable bench` measures the same things interleaved.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Optional

import pytest

import proctable
from proctable import _lowlevel as _ll
from proctable.bench import Sleepers
from proctable.table import Proc, _table

ATTRS = ["pid", "ppid", "create_time", "status", "name"]


def _size(sleepers: Optional[Sleepers]) -> str:
    return "live table" if sleepers is None else f"+{sleepers.n} procs"


def _psutil() -> Any:
    return pytest.importorskip("psutil")


def _target(sleepers: Optional[Sleepers]) -> int:
    if sleepers is None:
        return os.getpid()
    return sleepers.pids[len(sleepers.pids) // 2]


@pytest.fixture
def scanner() -> Iterator[proctable.Scanner]:
    s = proctable.Scanner()
    s.refresh()  # opens the fds: the rounds measure re-reads
    try:
        yield s
    finally:
        s.close()


# --- the whole table ------------------------------------------------------------


def test_table_snapshot(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    benchmark.group = f"table, {_size(sleepers)}"
    assert len(benchmark(proctable.snapshot)) > 0


def test_table_snapshot_one_thread(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    benchmark.group = f"table, {_size(sleepers)}"
    want = _ll.WANT_MEM | _ll.WANT_PROCFS  # threads are a /proc reader's matter
    assert len(benchmark(lambda: _table(_ll.snapshot_rows(Proc, 1, want)[0]))) > 0


def test_table_scanner_refresh(
    benchmark: Any, sleepers: Optional[Sleepers], scanner: proctable.Scanner
) -> None:
    benchmark.group = f"table, {_size(sleepers)}"
    assert len(benchmark(scanner.refresh)) > 0



def test_table_floor(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    benchmark.group = f"table, {_size(sleepers)}"
    assert benchmark(_ll.floor_scan, 0) > 0


def test_table_floor_one_thread(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    benchmark.group = f"table, {_size(sleepers)}"
    assert benchmark(_ll.floor_scan, 1) > 0


def test_table_psutil_warm(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    ps = _psutil()
    benchmark.group = f"table, {_size(sleepers)}"
    list(ps.process_iter(ATTRS))  # warm the cache
    assert len(benchmark(lambda: list(ps.process_iter(ATTRS)))) > 0


def test_table_psutil_cold(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    ps = _psutil()
    benchmark.group = f"table, {_size(sleepers)}"
    # Cold: process_iter's Process cache cleared (untimed) before every round.
    result = benchmark.pedantic(lambda: list(ps.process_iter(ATTRS)),
                                setup=ps.process_iter.cache_clear, rounds=15)
    assert len(result) > 0


# --- one process ----------------------------------------------------------------


def test_one_read(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    benchmark.group = f"one process, {_size(sleepers)}"
    pid = _target(sleepers)
    assert benchmark(proctable.read, pid) is not None


def test_one_exit_probe(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    benchmark.group = f"one process, {_size(sleepers)}"
    pid = _target(sleepers)
    assert benchmark(proctable.exit_probe, pid).state is proctable.ProbeState.RUNNING


def test_one_floor(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    benchmark.group = f"one process, {_size(sleepers)}"
    assert benchmark(_ll.floor_read, _target(sleepers)) > 0


def test_one_psutil_warm(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    ps = _psutil()
    benchmark.group = f"one process, {_size(sleepers)}"
    proc = ps.Process(_target(sleepers))
    assert benchmark(proc.as_dict, ATTRS)["pid"] == proc.pid


def test_one_psutil_cold(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    ps = _psutil()
    benchmark.group = f"one process, {_size(sleepers)}"
    pid = _target(sleepers)
    assert benchmark(lambda: ps.Process(pid).as_dict(ATTRS))["pid"] == pid


def test_one_psutil_status(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    ps = _psutil()
    benchmark.group = f"one process, {_size(sleepers)}"
    pid = _target(sleepers)
    assert benchmark(lambda: ps.Process(pid).status()) in ("sleeping", "running")


# --- a subtree ------------------------------------------------------------------


def _root(sleepers: Optional[Sleepers]) -> int:
    if sleepers is None or not sleepers.chain:
        pytest.skip("the subtree comes with the sleepers (--bench-procs > 0)")
    return sleepers.chain[0]


def test_subtree_descendants(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    root = _root(sleepers)
    benchmark.group = f"subtree of 5, {_size(sleepers)}"
    base = proctable.snapshot()
    # A new Table over the snapshot's rows each round: the index is built each time.
    assert len(benchmark(lambda: proctable.Table(base).descendants(root))) == 4


def test_subtree_snapshot_descendants(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    root = _root(sleepers)
    benchmark.group = f"subtree of 5, {_size(sleepers)}"
    assert len(benchmark(lambda: proctable.snapshot().descendants(root))) == 4


def test_subtree_floor(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    _root(sleepers)
    benchmark.group = f"subtree of 5, {_size(sleepers)}"
    assert benchmark(_ll.floor_scan, 0) > 0


def test_subtree_psutil_children(benchmark: Any, sleepers: Optional[Sleepers]) -> None:
    ps = _psutil()
    root = _root(sleepers)
    benchmark.group = f"subtree of 5, {_size(sleepers)}"
    proc = ps.Process(root)
    assert len(benchmark(lambda: proc.children(recursive=True))) == 4
