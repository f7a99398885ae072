"""Lineage.changes(): every member recorded and every end, with the exit status."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import proctable

from ._reliability import linux_only
from .conftest import PY

pytestmark = linux_only

# The command starts a child that exits 7 at once, then sleeps: the child lives far
# shorter than one sample (the interval is 5 s), and must still be seen, with its code.
CODE = ("import subprocess, sys, time\n"
        "sys.stdin.readline()\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import os; os._exit(7)'])\n"
        "p.wait()\n"
        "sys.stdout.write('done\\n'); sys.stdout.flush()\n"
        "time.sleep(60)\n")


def _a_short_member(mode: str) -> tuple[list[proctable.lineage.Change], list[str], bool]:
    """One run of CODE: the changes of the command's child (joined, left), the
    lineage's health at the end, and whether it had no fork events at all."""
    with proctable.Lineage.spawn([PY, "-c", CODE], interval=5.0, mode=mode,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE) as lin:
        first = lin.changes()
        assert lin.root is not None
        assert [c.kind for c in first] == ["joined"] and first[0].pid == lin.root.pid
        assert lin.process.stdin is not None and lin.process.stdout is not None
        lin.process.stdin.write(b"go\n")
        lin.process.stdin.flush()
        assert lin.process.stdout.readline() == b"done\n"
        deadline = time.monotonic() + 10
        seen: list[proctable.lineage.Change] = []
        while time.monotonic() < deadline:
            seen += lin.changes()
            if any(c.kind == "left" for c in seen):
                break
            time.sleep(0.05)
        kids = [c for c in seen if c.proc.ppid == lin.root.pid or c.kind == "left"]
        return kids, lin.health, lin._engine.sub is None


@pytest.mark.parametrize("mode", ["auto", "subreaper", "scan"])
def test_a_member_shorter_than_a_sample_joins_and_leaves_with_its_status(mode: str) -> None:
    """In scan mode such a member is seen only in the fork and exit events. Where
    they were lost (the socket overflowed: health says so), no run can see it, and
    such a run proves nothing either way: it is run again (at most 5 times).

    The [scan] case failed twice under a neighbour's load with no change of the
    child at all (``[] == ['joined', 'left']``, once in 11 loaded runs here beside
    the helpers' fork-storm test); the cause is not found yet, so a failure now
    says what the lineage's health was."""
    for _ in range(5):
        kids, health, no_events = _a_short_member(mode)
        if not any("were lost" in h for h in health):
            break
    else:
        pytest.skip(f"fork and exit events were lost in every run: {health}")
    kinds = [c.kind for c in kids]
    if "joined" not in kinds and no_events:
        # No fork events here (not root, or a sandbox): a member that lives less
        # than a sample is only seen by the reaper, as a status nobody asked for.
        pytest.skip("no proc connector: a member shorter than a sample is not seen")
    assert kinds == ["joined", "left"], (kids, health)
    joined, left = kids
    assert joined.pid == left.pid and joined.proc.start_time == left.proc.start_time
    assert joined.parent_member
    assert left.status is not None and left.status.code == 7


def test_without_a_first_call_nothing_is_recorded() -> None:
    with proctable.Lineage.spawn([PY, "-c", "import time; time.sleep(30)"]) as lin:
        assert lin._engine.reg.log is None
        lin.members()
        assert lin._engine.reg.log is None


def test_run_events_left_carries_the_members_status() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "proctable", "run", "--events", "-", "--", PY, "-c",
         "import subprocess, sys; subprocess.run([sys.executable, '-c', "
         "'import time, os; time.sleep(0.3); os._exit(5)']); print('ok')"],
        capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    objs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    left = [o for o in objs if o["type"] == "left"]
    assert len(left) == 1, objs
    assert left[0]["status"] is not None and left[0]["status"]["code"] == 5
    joined = [o for o in objs if o["type"] == "joined" and o["pid"] == left[0]["pid"]]
    assert len(joined) == 1 and objs.index(joined[0]) < objs.index(left[0])
