"""The product on hosts that deny it kernel features, denied by the kernel itself.

Each combination runs tests/faults/scenario.py (exit watcher, terminate, every
lineage mode, attach, a supervisor, the table) under tests/faults/deny.c: a
seccomp filter that answers EPERM (as older container runtime profiles did) or
ENOSYS (as gVisor-like sandboxes and old kernels do) for one feature, or a
read-only cgroup mount in a private mount namespace (as containers have it).
Every answer must be right, or a clear error exactly where a feature cannot
work at all; never a crash, a hang, a wrong status, or a process left running
(found by an environment marker in the process table, and killed here by pid).
"""

from __future__ import annotations

import json
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from ._faults import ERRNOS, deny, run_marked
from ._reliability import linux_only
from .conftest import needs_root

pytestmark = [linux_only, needs_root]

SCENARIO = Path(__file__).resolve().parent / "faults" / "scenario.py"
DENIALS = ["pidfd_open", "pidfd_send_signal", "waitid_pidfd", "pidfd_get_info",
           "netlink_connector", "clone3", "subreaper"]
LINEAGES = ("lineage_auto", "lineage_subreaper", "lineage_scan", "lineage_cgroup")



def run_denied(rule: str, err: str, ro_cgroup: bool = False,
               names: tuple[str, ...] = ()) -> dict[str, Any]:
    """The scenarios' results under the denial (every default one, or names);
    whatever they left running is killed (by pid) and named in the result as
    'leftovers'."""
    mark = f"deny-{rule}-{err}-{uuid.uuid4().hex[:8]}"
    rc, stdout, stderr, left = run_marked(
        [*deny(rule, err, ro_cgroup=ro_cgroup), sys.executable, str(SCENARIO), *names], mark)
    assert rc == 0, stderr[-3000:]
    results: dict[str, Any] = json.loads(stdout.splitlines()[-1])
    results["leftovers"] = left
    return results


def _no_thread(res: dict[str, Any]) -> bool:
    return "NoThread" in res.get("error", "") or "NoThread" in res.get("result", {}).get(
        "refused", "")


def check(results: dict[str, Any], *, threads: bool = True, reapers: bool = True,
          cgroup: bool = True) -> None:
    """What every host must get right; threads/reapers/cgroup: whether this host
    lets the product start threads, become a subreaper, write a cgroup."""
    assert results.pop("leftovers") == [], "processes were left running"
    r = results
    assert r["table"]["result"]["me"] is True

    for name in ("watch_own", "watch_foreign"):
        if not threads:
            assert _no_thread(r[name]), r[name]
            continue
        assert "error" not in r[name], r[name]
    if threads:
        own = r["watch_own"]["result"]
        assert own["exit7"]["code"] == 7 and own["killed"]["signal"] == signal.SIGKILL
        assert own["popen_still_reaps"] == [7, -signal.SIGKILL]  # never reaped for it
        foreign = r["watch_foreign"]["result"]
        assert foreign.get("status", {}).get("code") == 3, foreign

    term = r["terminate_own"]
    assert "error" not in term, term
    assert term["result"]["status"]["signal"] == signal.SIGKILL
    assert term["result"]["seconds"] < 0.2 + 5.0 + 2.0  # grace + kill_timeout + slack
    stopped = r["terminate_stopped"]
    assert "error" not in stopped, stopped
    assert stopped["result"]["status"]["code"] == 42

    for name in (*LINEAGES, "lineage_attach"):
        res = r[name]
        refused = res.get("result", {}).get("refused") or res.get("error")
        if not threads and not (cgroup and reapers and name in ("lineage_auto",
                                                                 "lineage_cgroup")):
            assert _no_thread(res), res  # clear, and nothing left (checked above)
            continue
        if not threads:
            # A cgroup-mode lineage needs no thread of its own (the cgroup holds
            # every member until teardown reads it): it works, escapes included.
            assert res.get("result", {}).get("mode") == "cgroup", (name, res)
        if refused is not None:
            # Only where the host cannot give what the mode needs, and said clearly.
            allowed = ((name in ("lineage_subreaper", "lineage_cgroup") and not reapers
                        and "PR_SET_CHILD_SUBREAPER" in refused)
                       or (name == "lineage_cgroup" and not cgroup
                           and "cgroup" in refused))
            assert allowed, (name, refused)
            continue
        out = res["result"]
        assert out.get("members_seen", True) is True, (name, out)
        assert out["teardown"] == "ok", (name, out)
        assert out["left_running"] == [], (name, out)
    if threads:
        auto = r["lineage_auto"]["result"]
        want = "cgroup" if (reapers and cgroup) else ("subreaper" if reapers else "scan")
        assert auto["mode"] == want, auto

    sup = r["supervisor"]
    if not threads:
        assert _no_thread(sup), sup
        return
    assert "error" not in sup, sup
    out = sup["result"]
    assert [s for s, _ in out["seven"]] == ["exited"] and out["seven"][0][1]["code"] == 7
    assert [s for s, _ in out["sleeper"]] == ["killed"]
    assert out["crash"][-1] == "gave_up" and out["crash"].count("created") == 3
    assert out["left_running"] == []


@pytest.mark.parametrize("err", ERRNOS)
@pytest.mark.parametrize("rule", DENIALS)
def test_denied(rule: str, err: str) -> None:
    results = run_denied(rule, err)
    check(results,
          threads=not (rule == "clone3" and err == "EPERM"),  # glibc falls back on ENOSYS
          reapers=rule != "subreaper")


@pytest.mark.parametrize("err", ERRNOS)
def test_teardown_without_pidfds_waits_for_its_reaper(err: str) -> None:
    # Without pidfd_open, teardown watched its members' rows but not its reaper's:
    # it returned while the reaper was still on its way out (1 in 30 with two CPU
    # burners beside; once in a loaded suite run).
    r = run_denied("pidfd_open", err, names=("teardown_repeat",))
    assert r.pop("leftovers") == []
    out = r["teardown_repeat"]
    assert "error" not in out, out
    assert out["result"] == {"cgroup": [], "subreaper": []}, out["result"]


def test_control_run_through_the_launcher() -> None:
    check(run_denied("none", "EPERM"))


def test_read_only_cgroup_mount() -> None:
    check(run_denied("none", "EPERM", ro_cgroup=True), cgroup=False)
