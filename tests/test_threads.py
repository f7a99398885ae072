"""proctable._threads.Workers: threads kept for the next job, never a busy one."""

from __future__ import annotations

import threading
import time

from proctable._threads import Workers


def _wait(pred: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(0.005)
    return False


def test_a_job_never_waits_for_a_busy_worker() -> None:
    pool = Workers("test-idle", idle_seconds=5.0)
    release = threading.Event()
    second = threading.Event()
    try:
        pool.run(release.wait, "test-first", 30.0)  # holds its worker
        pool.run(second.set, "test-second")
        assert second.wait(10.0), "the second job waited for the first one's worker"
    finally:
        release.set()
        pool.close()


def test_an_idle_worker_takes_the_next_job() -> None:
    pool = Workers("test-idle", idle_seconds=5.0)
    seen: list[int] = []
    done = threading.Event()

    def job() -> None:
        seen.append(threading.get_ident())
        done.set()

    try:
        pool.run(job, "test-job")
        assert done.wait(10.0)
        assert _wait(lambda: pool.idle == 1)
        done.clear()
        pool.run(job, "test-job")
        assert done.wait(10.0)
        assert seen[0] == seen[1]  # the same thread, no new one
    finally:
        pool.close()


def test_a_worker_is_named_for_its_job_and_ends_when_idle_for_long() -> None:
    pool = Workers("test-idle-briefly", idle_seconds=0.2)
    names: list[str] = []
    pool.run(lambda: names.append(threading.current_thread().name), "test-named")
    assert _wait(lambda: pool.idle == 1)
    assert names == ["test-named"]
    assert any(t.name == "test-idle-briefly" for t in threading.enumerate())
    assert _wait(lambda: not any(t.name == "test-idle-briefly" for t in threading.enumerate()))
    assert pool.idle == 0


def test_close_ends_idle_workers_and_later_jobs_still_run() -> None:
    pool = Workers("test-closing", idle_seconds=60.0)
    pool.run(lambda: None, "test-job")
    assert _wait(lambda: pool.idle == 1)
    pool.close()
    assert _wait(lambda: not any(t.name == "test-closing" for t in threading.enumerate()))
    ran = threading.Event()
    pool.run(ran.set, "test-after-close")  # a teardown after close() still runs
    assert ran.wait(10.0)
    assert _wait(lambda: not any(t.name in ("test-after-close", "test-closing")
                                 for t in threading.enumerate()))


def test_a_failing_job_leaves_the_worker_usable() -> None:
    pool = Workers("test-idle", idle_seconds=5.0)
    ran = threading.Event()

    def boom() -> None:
        raise RuntimeError("a bug in a job")

    try:
        pool.run(boom, "test-boom")
        assert _wait(lambda: pool.idle == 1)
        pool.run(ran.set, "test-after")
        assert ran.wait(10.0)
    finally:
        pool.close()


def test_many_jobs_at_once_each_get_a_thread() -> None:
    pool = Workers("test-idle", idle_seconds=5.0)
    n = 20
    barrier = threading.Barrier(n + 1)
    try:
        for i in range(n):
            pool.run(barrier.wait, f"test-{i}", 30.0)
        barrier.wait(30.0)  # all n run at the same time: none waited for another
    finally:
        pool.close()
