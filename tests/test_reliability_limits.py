"""Limits that run out: RLIMIT_NOFILE of 32 and 64, RLIMIT_NPROC during restarts.

Each fd case runs tests/faults/limits.py in a fresh interpreter that lowered its
own RLIMIT_NOFILE before importing proctable; whatever it leaves running is found
by an environment marker and killed here, by pid, and fails the test.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from ._faults import run_marked
from ._reliability import linux_only
from .conftest import needs_root

pytestmark = linux_only

LIMITS = Path(__file__).resolve().parent / "faults" / "limits.py"



def run_limited(nofile: int, scenario: str) -> dict[str, Any]:
    mark = f"limits-{nofile}-{scenario}-{uuid.uuid4().hex[:8]}"
    rc, stdout, stderr, left = run_marked(
        [sys.executable, str(LIMITS), str(nofile), scenario], mark)
    assert rc == 0, stderr[-3000:]
    res = json.loads(stdout.splitlines()[-1])[scenario]
    assert left == [], f"left running: {left}; {res}"
    assert "error" not in res, res
    return res["result"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("nofile", [32, 64])
def test_table_and_scanner_with_few_fds(nofile: int) -> None:
    out = run_limited(nofile, "table")
    assert out["me"] and out["scanner_me"]
    assert out["scanner"] > 0 and out["snapshot"] > 0
    assert out["max_fds"] <= nofile // 2  # a Scanner never takes more than half
    assert out["fds_after"] == out["fds"]  # nothing kept after close()


@pytest.mark.parametrize("nofile", [32, 64])
def test_table_with_two_fds_free(nofile: int) -> None:
    # the README's promise: the table works at these limits, even nearly used up
    out = run_limited(nofile, "table_two_free")
    assert out["me"] and out["scanner_me"] and out["read_me"]
    assert out["me_rss"]  # memory read too, one file at a time
    assert out["snapshot"] > 1 and out["snapshot_nomem"] > 1 and out["scanner"] > 1
    assert out["snapshot_threads"] > 1 and out["scanner_threads"] > 1  # 4 threads asked
    assert out["kept"] == 0  # every fd it opened is closed again


@pytest.mark.parametrize("nofile", [32, 64])
def test_watcher_refuses_what_it_cannot_hold_and_resolves_the_rest(nofile: int) -> None:
    out = run_limited(nofile, "watcher")
    assert out["accepted"] >= nofile // 2 and out["refused"] >= 1
    assert out["first_refusal"].startswith("OutOfFds")
    assert f"RLIMIT_NOFILE {nofile}" in out["first_refusal"]
    assert out["statuses"] == [signal.SIGKILL]  # every accepted watch resolved, right


@pytest.mark.parametrize("mode", ["auto", "subreaper", "scan"])
@pytest.mark.parametrize("nofile", [32, 64])
def test_a_lineage_bigger_than_the_fds_is_torn_down(nofile: int, mode: str) -> None:
    out = run_limited(nofile, f"lineage_{mode}")
    assert out["members"] == 41, out
    # Every member ended (proven, so ok), or TeardownError naming who: never a
    # success that leaves one running (the marker scan above checks that too).
    if out["teardown"] != "ok":
        assert out["teardown"] == "TeardownError" and out["survivors"] > 0, out
    else:
        assert out["ended"] == 41, out


@needs_root
def test_rlimit_nproc_reached_while_restarting() -> None:
    """A supervisor restarts a crashing key while its uid has no process left to
    start: gave_up with a reason, or a restart within the policy; never a dead
    control thread, never a silent stop. Runs as uid 65534 (RLIMIT_NPROC does not
    bind root), in a fresh interpreter."""
    code = textwrap.dedent("""
        import json, os, resource, subprocess, sys, threading, time
        import proctable, proctable.supervise, proctable.lineage
        # Everything imported first: uid 65534 may not read this interpreter's files.
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
        events = []
        sup = proctable.Supervisor(on_event=events.append, grace=0.5, kill_timeout=2.0,
                                   mode="subreaper")
        policy = proctable.RestartPolicy(max_restarts=100, delay=0.05)
        sup.start("crash", ["sh", "-c", "sleep 0.3; exit 1"], restart=policy)
        time.sleep(0.5)
        # Now no new process (or thread) for this uid: count what runs, cap there.
        mine = sum(1 for p in proctable.snapshot(memory=False) if p.uid == 65534)
        threads = sum(p.num_threads or 1 for p in proctable.snapshot(memory=False)
                      if p.uid == 65534)
        soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        resource.setrlimit(resource.RLIMIT_NPROC, (threads, hard))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if any(e.kind == "gave_up" for e in events):
                break
            time.sleep(0.05)
        resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))
        kinds = [e.kind for e in events]
        reasons = [e.reason for e in events if e.kind == "gave_up"]
        alive = sup.running("crash")
        state = sup.state("crash")
        sup.close()
        print(json.dumps({"kinds": kinds, "reasons": reasons, "running": alive,
                          "state": str(state), "mine": mine}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, check=False, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    kinds = out["kinds"]
    assert kinds.count("created") >= 1
    # It gave up loudly, with a reason a person can read, and nothing after that.
    assert "gave_up" in kinds, out
    assert kinds[-1] == "gave_up" or kinds[kinds.index("gave_up") + 1:] == [], out
    assert out["reasons"] and all(out["reasons"]), out
    assert not out["running"], out
