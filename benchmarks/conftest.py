"""Benchmarks (pytest-benchmark): proctable beside psutil and the C floor.

Run: python -m pytest benchmarks --benchmark-enable -q [--bench-procs 1000,4000]

A session fixture starts the extra sleeping processes once per size (one
helper process forks them; they die with it) and stops them by pid at the end.
Files named bench_*.py are collected here (the plain test run never sees them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from proctable.bench import Sleepers


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-procs",
        default="1000,4000",
        help="comma-separated counts of extra sleeping processes to measure at "
        "(default 1000,4000; 0 = the live table only)",
    )


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Optional[pytest.Module]:
    # A file named on the command line is collected by pytest itself: once is enough.
    if (file_path.suffix == ".py" and file_path.name.startswith("bench_")
            and not parent.session.isinitpath(file_path)):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sleepers" in metafunc.fixturenames:
        counts = [int(x) for x in metafunc.config.getoption("--bench-procs").split(",") if x]
        metafunc.parametrize("sleepers", counts, indirect=True, scope="session",
                             ids=[f"{n}procs" for n in counts])


@pytest.fixture(scope="session")
def sleepers(request: Any) -> Iterator[Optional[Sleepers]]:
    """The extra processes of one size (None for 0), stopped by pid afterwards."""
    n = int(request.param)
    if n == 0:
        yield None
        return
    s = Sleepers(n)
    try:
        yield s
    finally:
        s.close()
