"""The product when RLIMIT_NOFILE is tiny: run by tests/test_reliability_limits.py.

    python limits.py NOFILE NAME...   prints one JSON object: name -> result

The limit is set here, in this fresh interpreter, before proctable is imported.
Every process started carries PROCTABLE_FAULT_MARK, so the test finds and kills
(by pid) whatever a failing scenario left behind.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
import traceback
from typing import Any, Callable

NOFILE = int(sys.argv[1])
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, _hard))

import proctable  # noqa: E402 - the limit comes first

MARK = os.environ.get("PROCTABLE_FAULT_MARK", "")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _wait(pred: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout}s")
        time.sleep(0.01)


def table() -> dict[str, Any]:
    t = proctable.snapshot()
    rows = {"snapshot": len(t), "me": os.getpid() in t, "fds": open_fds()}
    with proctable.Scanner(max_fds=10_000) as s:
        for _ in range(3):
            r = s.refresh()
        rows.update(scanner=len(r), scanner_me=os.getpid() in r, max_fds=s.max_fds,
                    open=s.open_fds, degraded=s.degraded)
    rows["fds_after"] = open_fds()
    return rows


def table_two_free() -> dict[str, Any]:
    """The table read with only 2 fds free (every other one held open here): a
    table read needs a directory fd and one file at a time."""
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    for _ in range(2):
        os.close(held.pop())
    out: dict[str, Any] = {}
    try:
        t = proctable.snapshot()
        me = t.get(os.getpid())
        out.update(snapshot=len(t), me=me is not None,
                   me_rss=me is not None and me.rss is not None and me.rss > 0)
        out["snapshot_nomem"] = len(proctable.snapshot(memory=False))
        out["read_me"] = proctable.read(os.getpid()) is not None
        with proctable.Scanner() as s:
            for _ in range(3):
                r = s.refresh()
            out.update(scanner=len(r), scanner_me=os.getpid() in r, open=s.open_fds)
        # a read by several threads (each holds its own files) reads on with one
        from proctable import _lowlevel as _ll
        from proctable.table import Proc
        rows, _ = _ll.snapshot_rows(Proc, 4, _ll.WANT_MEM | _ll.WANT_PROCFS)
        out["snapshot_threads"] = len(rows)
        with proctable.Scanner(threads=4) as s:
            out["scanner_threads"] = len(s.refresh())
        out["reader"] = proctable.reader().name
        # still exactly 2 free: nothing kept
        probe = [os.open(os.devnull, os.O_RDONLY) for _ in range(2)]
        try:
            os.close(os.open(os.devnull, os.O_RDONLY))
            out["kept"] = -1  # a third one opened: the table read freed one of ours
        except OSError:
            out["kept"] = 0
        for fd in probe:
            os.close(fd)
    finally:
        for fd in held:
            os.close(fd)
    return out


def watcher() -> dict[str, Any]:
    """More watches than fds allow: a clear error for the ones that cannot be
    taken, and every accepted one still resolves."""
    procs = [subprocess.Popen(["sleep", "30"]) for _ in range(NOFILE + 8)]
    accepted, refused = [], []
    with proctable.ExitWatcher() as w:
        for p in procs:
            try:
                accepted.append((p, w.watch(p)))
            except OSError as e:
                refused.append(f"{type(e).__name__}: {e}")
        for p in procs:
            p.kill()
        statuses = [f.result(timeout=20).signal for _, f in accepted]
    for p in procs:
        p.wait(10)
    return {"accepted": len(accepted), "refused": len(refused),
            "first_refusal": refused[0] if refused else None, "statuses": sorted(set(statuses))}


def lineage(mode: str) -> dict[str, Any]:
    """A lineage of 40 members (more than the fds allow) spawned, then torn down:
    every member ended, or TeardownError naming the survivors; never a success
    that leaves one running."""
    out: dict[str, Any] = {"asked": mode}
    code = ("import subprocess, sys, time\n"
            "ps = [subprocess.Popen(['setsid', 'sleep', '300']) for _ in range(40)]\n"
            "print('ready', flush=True)\n"
            "time.sleep(300)\n")
    try:
        lin = proctable.Lineage.spawn([sys.executable, "-c", code], mode=mode,
                                      stdout=subprocess.PIPE)
    except (OSError, proctable.ProctableError) as e:
        out["refused"] = f"{type(e).__name__}: {e}"
        return out
    out["mode"] = lin.mode
    try:
        assert lin.process.stdout is not None
        assert lin.process.stdout.readline() == b"ready\n"
        try:
            _wait(lambda: len(lin.members()) >= 41, timeout=20)
            out["members"] = 41
        except (TimeoutError, OSError) as e:
            out["members"] = f"{type(e).__name__}: {e}"
        try:
            report = lin.terminate(grace=1.0, kill_timeout=5.0)
            out["teardown"] = "ok"
            out["ended"] = len(report.members)
        except proctable.TeardownError as e:
            out["teardown"] = "TeardownError"
            out["survivors"] = len(e.survivors)
    except OSError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out  # what is left running, the test finds in the process table


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "table": table,
    "table_two_free": table_two_free,
    "watcher": watcher,
    "lineage_auto": lambda: lineage("auto"),
    "lineage_subreaper": lambda: lineage("subreaper"),
    "lineage_scan": lambda: lineage("scan"),
}


def main(names: list[str]) -> int:
    results: dict[str, Any] = {}
    for name in names or list(SCENARIOS):
        try:
            results[name] = {"result": SCENARIOS[name]()}
        except BaseException as e:
            results[name] = {"error": f"{type(e).__name__}: {e}",
                             "trace": traceback.format_exc()[-2000:]}
    sys.stdout.write(json.dumps(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[2:]))
