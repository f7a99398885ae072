"""An asyncio.subprocess.Process is a target wherever a Popen is: the watcher,
wait_exit and terminate. asyncio's child watcher reaps it and then sets its
returncode in the loop; proctable must neither steal that exit nor lose it."""

from __future__ import annotations

import asyncio
import signal

import pytest

import proctable
from proctable import ExitWatcher


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_watch_an_asyncio_process(mode: str) -> None:
    async def main() -> tuple[proctable.ExitStatus, int]:
        proc = await asyncio.create_subprocess_exec("sh", "-c", "exit 3")
        with ExitWatcher() as w:
            fut = w.watch(proc)
            status = await asyncio.wrap_future(fut)
        return status, await asyncio.wait_for(proc.wait(), 10)

    status, rc = run(main())  # type: ignore[misc]
    assert status.code == 3 and rc == 3  # asyncio still got its child's exit


def test_wait_exit_of_an_asyncio_process(mode: str) -> None:
    async def main() -> tuple[proctable.ExitStatus, int]:
        proc = await asyncio.create_subprocess_exec("sh", "-c", "sleep 0.1; kill -USR1 $$")
        status = await proctable.wait_exit(proc, timeout=20)
        return status, await asyncio.wait_for(proc.wait(), 10)

    status, rc = run(main())  # type: ignore[misc]
    assert status.signal == signal.SIGUSR1 and rc == -signal.SIGUSR1


def test_watch_with_reap_leaves_the_reaping_to_asyncio() -> None:
    async def main() -> tuple[proctable.ExitStatus, int]:
        proc = await asyncio.create_subprocess_exec("sh", "-c", "exit 7")
        with ExitWatcher() as w:
            status = await asyncio.wrap_future(w.watch(proc, reap=True))
        return status, await asyncio.wait_for(proc.wait(), 10)

    status, rc = run(main())  # type: ignore[misc]
    assert status.code == 7 and rc == 7  # not 255: asyncio's watcher found its child


def test_terminate_an_asyncio_process(mode: str) -> None:
    async def main() -> tuple[object, int]:
        proc = await asyncio.create_subprocess_exec("sleep", "60")
        # terminate() blocks (bounded): run it off the loop, as a caller in asyncio would.
        status = await asyncio.to_thread(proctable.terminate, proc, 5.0, 5.0)
        return status, await asyncio.wait_for(proc.wait(), 10)

    status, rc = run(main())  # type: ignore[misc]
    assert isinstance(status, proctable.ExitStatus) and status.signal == signal.SIGTERM
    assert rc == -signal.SIGTERM


def test_terminate_after_asyncio_reaped_it_signals_nothing() -> None:
    async def main() -> tuple[object, object]:
        proc = await asyncio.create_subprocess_exec("sh", "-c", "exit 4")
        await proc.wait()  # reaped by asyncio: its pid may name a stranger now
        return proctable.terminate(proc, 0.1, 0.1), proc.returncode

    status, rc = run(main())  # type: ignore[misc]
    assert rc == 4
    assert isinstance(status, proctable.ExitStatus) and status.code == 4


def test_a_wrong_target_names_the_asyncio_process_too() -> None:
    with pytest.raises(TypeError, match="asyncio"):
        ExitWatcher().watch("1234")  # type: ignore[arg-type]
