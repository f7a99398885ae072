"""proctable.compat beside psutil: process_iter(attrs), and the process API (as_dict,
children, pids, pid_exists, wait_procs).

process_iter: the same attributes on both sides, every info dict read; once
without and once with cmdline. `proctable bench` prints the same comparison
interleaved, in its "psutil-compatible iteration" sections, and the process
API's with `proctable bench --compat`.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import pytest

import proctable
from proctable.bench import Sleepers, drain
from proctable.bench.compat import ATTRS, ATTRS_CMDLINE


def _size(sleepers: Optional[Sleepers]) -> str:
    return "live table" if sleepers is None else f"+{sleepers.n} procs"


@pytest.mark.parametrize("attrs", [ATTRS, ATTRS_CMDLINE], ids=["no_cmdline", "cmdline"])
def test_compat_proctable(benchmark: Any, sleepers: Optional[Sleepers], attrs: list[str]) -> None:
    benchmark.group = f"process_iter, {'+cmdline, ' if 'cmdline' in attrs else ''}{_size(sleepers)}"
    benchmark.extra_info["reader"] = proctable.reader().name
    assert benchmark(drain(proctable.process_iter, attrs)) > 0


@pytest.mark.parametrize("attrs", [ATTRS, ATTRS_CMDLINE], ids=["no_cmdline", "cmdline"])
def test_compat_proctable_proc_reader(benchmark: Any, sleepers: Optional[Sleepers],
                                      attrs: list[str]) -> None:
    # the road of a user without the privileges the BPF reader needs
    benchmark.group = f"process_iter, {'+cmdline, ' if 'cmdline' in attrs else ''}{_size(sleepers)}"
    assert benchmark(drain(proctable.process_iter, attrs, reader="proc")) > 0


@pytest.mark.parametrize("attrs", [ATTRS, ATTRS_CMDLINE], ids=["no_cmdline", "cmdline"])
def test_compat_psutil_warm(benchmark: Any, sleepers: Optional[Sleepers], attrs: list[str]) -> None:
    ps = pytest.importorskip("psutil")
    benchmark.group = f"process_iter, {'+cmdline, ' if 'cmdline' in attrs else ''}{_size(sleepers)}"
    drain(ps.process_iter, attrs)()  # warm psutil's Process cache
    assert benchmark(drain(ps.process_iter, attrs)) > 0


@pytest.mark.parametrize("attrs", [ATTRS, ATTRS_CMDLINE], ids=["no_cmdline", "cmdline"])
def test_compat_psutil_cold(benchmark: Any, sleepers: Optional[Sleepers], attrs: list[str]) -> None:
    ps = pytest.importorskip("psutil")
    benchmark.group = f"process_iter, {'+cmdline, ' if 'cmdline' in attrs else ''}{_size(sleepers)}"
    result = benchmark.pedantic(drain(ps.process_iter, attrs),
                                setup=ps.process_iter.cache_clear, rounds=15)
    assert result > 0


# --- proctable.compat's process API beside psutil's (proctable bench --compat) ------------

MODULES = ["compat", "psutil"]


def _module(name: str) -> Any:
    if name == "psutil":
        return pytest.importorskip("psutil")
    from proctable import compat

    return compat


@pytest.fixture(scope="module")
def tree() -> Any:
    """A 200-process tree (proctable.bench.compat.Tree), stopped by pid afterwards."""
    from proctable.bench.compat import Tree

    t = Tree()
    try:
        yield t
    finally:
        t.close()


@pytest.mark.parametrize("module", MODULES)
def test_as_dict_one(benchmark: Any, sleepers: Optional[Sleepers], module: str) -> None:
    from proctable.compat import AS_DICT_ATTRS

    ps = _module(module)
    pid = sleepers.pids[0] if sleepers is not None else os.getpid()
    benchmark.group = f"Process(pid).as_dict(), {_size(sleepers)}"
    attrs = list(AS_DICT_ATTRS)
    assert len(benchmark(lambda: ps.Process(pid).as_dict(attrs))) == len(attrs)


@pytest.mark.parametrize("module", MODULES)
def test_as_dict_every(benchmark: Any, sleepers: Optional[Sleepers], module: str) -> None:
    from proctable.bench.compat import _every_as_dict

    benchmark.group = f"Process(pid).as_dict() of every pid, {_size(sleepers)}"
    assert benchmark(_every_as_dict(_module(module))) > 0


@pytest.mark.parametrize("module", ["compat-walk", "compat-table", "compat-table-proc",
                                    "psutil"])
def test_children_of_a_tree(benchmark: Any, sleepers: Optional[Sleepers], tree: Any,
                            module: str) -> None:
    from proctable.compat import _process

    ps = _module(module.split("-", maxsplit=1)[0])
    p = ps.Process(tree.root)
    benchmark.group = f"children(recursive=True) of 200, {_size(sleepers)}"
    _process._children_road = module.split("-", 1)[1] if "-" in module else "auto"
    try:
        assert len(benchmark(lambda: p.children(recursive=True))) == 199
    finally:
        _process._children_road = "auto"


@pytest.mark.parametrize("module", MODULES)
def test_pids(benchmark: Any, sleepers: Optional[Sleepers], module: str) -> None:
    benchmark.group = f"pids(), {_size(sleepers)}"
    assert len(benchmark(_module(module).pids)) > 0


@pytest.mark.parametrize("module", MODULES)
def test_pid_exists(benchmark: Any, module: str) -> None:
    ps = _module(module)
    pid = os.getpid()
    benchmark.group = "pid_exists()"
    assert benchmark(lambda: ps.pid_exists(pid)) is True


@pytest.mark.parametrize("zombies", [False, True], ids=["killed", "zombies"])
@pytest.mark.parametrize("module", MODULES)
def test_wait_procs_50(benchmark: Any, module: str, zombies: bool) -> None:
    from proctable.bench.compat import Exiting

    ps = _module(module)
    batch = Exiting()
    benchmark.group = f"wait_procs() of 50, {'zombies' if zombies else 'killed'}"

    def setup() -> None:
        batch.start(ps.Process, zombies)

    def run() -> int:
        if not zombies:
            batch.kill()
        gone, alive = ps.wait_procs(batch.objects, timeout=30)
        assert not alive
        return len(gone)

    try:
        assert benchmark.pedantic(run, setup=setup, rounds=15) == 50
    finally:
        batch.close()
