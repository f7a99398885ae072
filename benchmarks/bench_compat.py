"""psutil-compatible iteration: proctable.process_iter(attrs) beside psutil.process_iter(attrs).

The same attributes on both sides, every info dict read; once without and once
with cmdline. `proctable bench` prints the same comparison interleaved, in its
"psutil-compatible iteration" sections.
"""

from __future__ import annotations

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
