"""What the product must get right on a host that denies it kernel features.

Run by tests/test_reliability_denied.py inside tests/faults/deny.c (a seccomp
filter answering EPERM or ENOSYS for one feature), as a fresh interpreter that
imports the installed proctable. Each scenario uses real processes and prints
what it saw; the test decides. Every process started here carries
PROCTABLE_FAULT_MARK in its environment, so that the test finds (and kills) by
pid whatever a failing scenario left behind.

    python scenario.py NAME [NAME...]    prints one JSON object: name -> result
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from typing import Any, Callable

import proctable

PY = sys.executable
MARK = os.environ.get("PROCTABLE_FAULT_MARK", "")


def _status(s: Any) -> Any:
    if s is None:
        return None
    return {"code": s.code, "signal": s.signal, "core": s.core_dumped}


def _wait(pred: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout}s: {pred}")
        time.sleep(0.01)


def marked_alive() -> list[int]:
    """Pids of live processes (not zombies) that carry this run's mark."""
    tag = f"PROCTABLE_FAULT_MARK={MARK}".encode()
    out = []
    for p in proctable.snapshot(memory=False):
        if p.pid == os.getpid() or (p.state == "Z" and (p.num_threads or 1) <= 1):
            continue
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                if tag in f.read().split(b"\0"):
                    out.append(p.pid)
        except OSError:
            continue
    return out


# --- exits -----------------------------------------------------------------------------


def watch_own() -> dict[str, Any]:
    out = {}
    a = subprocess.Popen([PY, "-c", "import os; os._exit(7)"])
    b = subprocess.Popen(["sleep", "30"])
    try:
        with proctable.ExitWatcher() as w:
            fa, fb = w.watch(a), w.watch(b)
            b.kill()
            out["exit7"] = _status(fa.result(timeout=20))
            out["killed"] = _status(fb.result(timeout=20))
            out["sources"] = [fa.source, fb.source]
    finally:
        b.kill()
        a.wait(10)
        b.wait(10)
    out["popen_still_reaps"] = [a.returncode, b.returncode]
    return out


# A parent that is not us: its child (the target) exits 3 after a moment; the parent
# reaps it on a line on stdin, so the target is first a zombie nobody reaps, then
# reaped by another process than us.
_PARENT = ("import os, sys, time\n"
           "pid = os.fork()\n"
           "if pid == 0:\n"
           "    time.sleep(0.2); os._exit(3)\n"
           "print(pid, flush=True)\n"
           "sys.stdin.readline()\n"
           "os.waitpid(pid, 0)\n"
           "sys.stdin.readline()\n")


def watch_foreign() -> dict[str, Any]:
    p = subprocess.Popen([PY, "-c", _PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdin is not None and p.stdout is not None
    target = int(p.stdout.readline())
    out: dict[str, Any] = {}
    try:
        with proctable.ExitWatcher() as w:
            fut = w.watch(target)
            _wait(lambda: (r := proctable.read(target)) is not None and r.state == "Z")
            # Long enough a zombie for a watcher without pidfds (it looks at /proc
            # every 50 ms) to see it: what it cannot see cannot be asked of it.
            time.sleep(0.25)
            p.stdin.write(b"reap\n")
            p.stdin.flush()
            try:
                out["status"] = _status(fut.result(timeout=20))
                out["source"] = fut.source
            except proctable.ExitUnknown as e:
                out["unknown"] = str(e)
    finally:
        p.stdin.write(b"reap\nbye\n")  # whatever it waits for: its child, then the end
        p.stdin.flush()
        p.wait(10)
    return out


def terminate_own() -> dict[str, Any]:
    p = subprocess.Popen([PY, "-c", "import signal, sys, time\n"
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                          "print('ready', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    t0 = time.monotonic()
    st = proctable.terminate(p, grace=0.2, kill_timeout=5.0)
    took = time.monotonic() - t0
    p.wait(10)
    return {"status": _status(st), "seconds": round(took, 3), "returncode": p.returncode}


def terminate_stopped() -> dict[str, Any]:
    p = subprocess.Popen([PY, "-c", "import os, signal, time\n"
                          "signal.signal(signal.SIGTERM, lambda *a: os._exit(42))\n"
                          "print('ready', flush=True)\n"
                          "while True: time.sleep(1)"], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    os.kill(p.pid, signal.SIGSTOP)
    _wait(lambda: (r := proctable.read(p.pid)) is not None and r.state == "T")
    st = proctable.terminate(p, grace=5.0, kill_timeout=5.0)
    p.wait(10)
    return {"status": _status(st)}


# --- lineage ---------------------------------------------------------------------------

# Two escapes (setsid, nohup ... &) and the command itself; each prints its pid.
_ESCAPES = ("setsid sleep 300 & echo $!; nohup sleep 301 >/dev/null 2>&1 & echo $!; "
            "exec sleep 302")


def _lineage(mode: str) -> dict[str, Any]:
    out: dict[str, Any] = {"asked": mode}
    try:
        lin = proctable.Lineage.spawn(["sh", "-c", _ESCAPES], mode=mode,
                                      stdout=subprocess.PIPE)
    except (proctable.ProctableError, OSError) as e:
        out["refused"] = f"{type(e).__name__}: {e}"
        return out
    out["mode"] = lin.mode
    try:
        assert lin.process.stdout is not None
        escaped = [int(lin.process.stdout.readline()) for _ in range(2)]
        want = set(escaped)
        _wait(lambda: want <= {m.pid for m in lin.members()}, timeout=20)
        out["members_seen"] = True
    except Exception as e:
        out["members_seen"] = f"{type(e).__name__}: {e}"
    try:
        report = lin.terminate(grace=1.0, kill_timeout=5.0)
        out["teardown"] = "ok"
        out["ended"] = sorted(str(m.ended) for m in report.members)
    except proctable.TeardownError as e:
        out["teardown"] = f"TeardownError: {e}"
    out["left_running"] = marked_alive()
    return out


def lineage_auto() -> dict[str, Any]:
    return _lineage("auto")


def lineage_subreaper() -> dict[str, Any]:
    return _lineage("subreaper")


def lineage_scan() -> dict[str, Any]:
    return _lineage("scan")


def lineage_cgroup() -> dict[str, Any]:
    return _lineage("cgroup")


def teardown_repeat() -> dict[str, Any]:
    """Not in the default list: 12 spawn-and-teardown rounds in each reaper mode,
    with what each round left running right after terminate() returned (its own
    reaper included: a teardown ends only once the reaper has)."""
    out: dict[str, Any] = {}
    for mode in ("cgroup", "subreaper"):
        left = []
        for _ in range(12):
            try:
                lin = proctable.Lineage.spawn(["sh", "-c", _ESCAPES], mode=mode,
                                              stdout=subprocess.DEVNULL)
            except (proctable.ProctableError, OSError) as e:
                left = [f"refused: {type(e).__name__}: {e}"]
                break
            lin.terminate(grace=0.2, kill_timeout=5.0)
            left += marked_alive()
        out[mode] = left
    return out


def lineage_attach() -> dict[str, Any]:
    p = subprocess.Popen(["sh", "-c", _ESCAPES], stdout=subprocess.PIPE)
    out: dict[str, Any] = {}
    try:
        try:
            lin = proctable.Lineage(p)
        except proctable.ProctableError:
            # Not attached (the host refused what a lineage needs): these are ours,
            # as the caller's, to end, once both escapes have started (the refusal
            # can come before sh has forked them; sh says each pid; EOF if it died).
            assert p.stdout is not None
            for _ in range(2):
                p.stdout.readline()
            for pid in marked_alive():
                os.kill(pid, signal.SIGKILL)
            raise
        out["mode"] = lin.mode
        assert p.stdout is not None
        want = {int(p.stdout.readline()) for _ in range(2)}
        _wait(lambda: want <= {m.pid for m in lin.members()}, timeout=20)
        lin.terminate(grace=1.0, kill_timeout=5.0)
        out["teardown"] = "ok"
    except proctable.TeardownError as e:
        out["teardown"] = f"TeardownError: {e}"
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(10)
    out["left_running"] = marked_alive()
    return out


# --- supervisor ------------------------------------------------------------------------


def supervisor() -> dict[str, Any]:
    events: list[Any] = []
    out: dict[str, Any] = {}
    with proctable.Supervisor(on_event=events.append, grace=0.5, kill_timeout=3.0) as sup:
        sup.start("seven", ["sh", "-c", "sleep 0.2; exit 7"])
        _wait(lambda: any(e.kind == "exited" and e.key == "seven" for e in events))
        sup.start("sleeper", ["sh", "-c", "setsid sleep 300 & exec sleep 300"])
        time.sleep(0.3)
        sup.stop("sleeper")
        crash = proctable.RestartPolicy(max_restarts=2, delay=0.05)
        sup.start("crash", ["sh", "-c", "exit 1"], restart=crash)
        _wait(lambda: any(e.kind == "gave_up" and e.key == "crash" for e in events))
        sup.flush_events()
    for key in ("seven", "sleeper"):
        ex = [e for e in events if e.kind == "exited" and e.key == key]
        out[key] = [(e.status, _status(e.exit)) for e in ex]
    out["crash"] = [e.kind for e in events if e.key == "crash"]
    out["left_running"] = marked_alive()
    return out


def table() -> dict[str, Any]:
    t = proctable.snapshot()
    with proctable.Scanner() as s:
        s.refresh()
        r = s.refresh()
    return {"me": os.getpid() in t and os.getpid() in r, "reader": proctable.reader().name}


SCENARIOS = {f.__name__: f for f in (
    watch_own, watch_foreign, terminate_own, terminate_stopped, lineage_auto,
    lineage_subreaper, lineage_scan, lineage_cgroup, lineage_attach, supervisor, table)}
ON_REQUEST = {f.__name__: f for f in (teardown_repeat,)}


def main(names: list[str]) -> int:
    results: dict[str, Any] = {}
    for name in names or list(SCENARIOS):
        t0 = time.monotonic()
        try:
            results[name] = {"result": {**SCENARIOS, **ON_REQUEST}[name]()}
        except BaseException as e:  # report everything: the test decides
            results[name] = {"error": f"{type(e).__name__}: {e}",
                             "trace": traceback.format_exc()[-2000:]}
        results[name]["seconds"] = round(time.monotonic() - t0, 2)
    sys.stdout.write(json.dumps(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
