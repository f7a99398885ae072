"""No claim on a reusable number: group and session ids reused in a private pid namespace.

A member L leads a process group (or a session) G and exits; G empties and the
kernel frees the number; an unrelated process X gets pid G (steered with
``/proc/sys/kernel/ns_last_pid``), makes a group (or session) G, forks Y and exits.
Y is in "a group a member led", by number only: it must never be claimed or
signalled. It survives teardown, and is reported as a suspect (or not claimed at
all, where a look saw the number free). The scenarios run in a private pid
namespace (``unshare -p -f --mount-proc``), where nothing else takes pids and the
proc connector is of no use (its events name the initial namespace's pids).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from .conftest import PY, needs_root

SCRIPT = textwrap.dedent(r"""
    import json, os, signal, subprocess, sys, time
    sys.path[:0] = json.loads(sys.argv[1])
    import proctable
    from proctable.lineage import Lineage

    # The member: it leads a group (setpgid) or a session (setsid), says its pid,
    # and exits when told; its parent (the root) reaps it at once and lives on.
    ROOT = '''
    import os, sys, time
    kind = sys.argv[1]
    r, w = os.pipe()
    leader = os.fork()
    if leader == 0:
        os.close(w)
        if kind == "session":
            os.setsid()
        else:
            os.setpgid(0, 0)
        print(os.getpid(), flush=True)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    sys.stdin.readline()
    os.write(w, b"x")
    os.waitpid(leader, 0)
    print("reaped", flush=True)
    time.sleep(300)
    '''

    # The unrelated one: makes a group (or session) of its own pid, forks Y, says
    # Y's pid and exits. In a session, Y leaves for a group of its own: only the
    # session id ties it to the old number.
    X = '''
    import os, sys, time
    kind = sys.argv[1]
    if kind == "session":
        os.setsid()
    else:
        os.setpgid(0, 0)
    r, w = os.pipe()
    y = os.fork()
    if y == 0:
        if kind == "session":
            os.setpgid(0, 0)
        os.write(w, b"x")
        time.sleep(300)
        os._exit(0)
    os.read(r, 1)
    print(y, flush=True)
    '''

    def wait_for(pred, timeout=20.0):
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out: {pred}")
            time.sleep(0.005)

    def scenario(kind, how):
        if how == "attach":
            root = subprocess.Popen([sys.executable, "-c", ROOT, kind],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            out, inp = root.stdout, root.stdin
            lin = Lineage(root, interval=60)  # only the looks made here
        else:
            lin = Lineage.spawn([sys.executable, "-c", ROOT, kind], mode="scan", interval=60,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            root = lin.process
            out, inp = root.stdout, root.stdin
        leader = int(out.readline())
        wait_for(lambda: leader in {p.pid for p in lin.members()})
        recorded = lin._engine.core.groups.get(leader) is not None
        with lin._engine.lock:  # nobody looks between the leader's end and the reuse
            inp.write(b"go\n")
            inp.flush()
            assert out.readline() == b"reaped\n"
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(leader - 1))
            x = subprocess.Popen([sys.executable, "-c", X, kind], stdout=subprocess.PIPE)
            y = int(x.stdout.readline())
            x.wait()
            x.stdout.close()
        y_row = proctable.read(y)
        members = {p.pid for p in lin.members()}
        suspects = [(s.pid, s.via, s.id, s.identity.handle is not None) for s in lin.suspects()]
        report = lin.terminate(grace=0.5, kill_timeout=2.0)
        after = proctable.read(y)
        result = {
            "events": lin._engine.sub is not None,  # of no use here: other pids
            "reused": x.pid == leader,
            "group_recorded": recorded,
            "y_in": [y_row.pgid, y_row.sid] if y_row else None,
            "claimed": y in members,
            "suspects": suspects,
            "report_suspects": [(s.pid, s.via, s.id) for s in report.suspects],
            "in_report": [m.ended.value for m in report.members if m.pid == y],
            "y_alive": after is not None and after.start_time == y_row.start_time
                       and after.state not in ("Z", "T", "t"),
            "leader": leader,
            "y": y,
        }
        os.kill(y, signal.SIGKILL)
        if how == "attach":
            root.wait()
        inp.close()
        out.close()
        return result

    res = {}
    for kind in ("group", "session"):
        for how in ("scan", "attach"):
            res[f"{kind}-{how}"] = scenario(kind, how)
    print(json.dumps(res))
""")


@needs_root
def test_group_and_session_id_reuse_in_a_private_pid_namespace(tmp_path: Any) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    script = tmp_path / "reuse.py"
    script.write_text(SCRIPT)
    paths = json.dumps([p for p in sys.path if p])
    # sh is the namespace's init (it reaps orphans; when it exits, the kernel kills
    # everything left in the namespace).
    try:
        r = subprocess.run(
            ["unshare", "-p", "-f", "--mount-proc", "sh", "-c", '"$0" "$1" "$2"; echo done',
             PY, str(script), paths], capture_output=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the pid namespace run did not finish")
    if r.returncode != 0 and b"Operation not permitted" in r.stderr:
        pytest.skip("unshare -p is not permitted here")
    lines = r.stdout.decode().splitlines()
    assert lines and lines[-1] == "done", r.stderr.decode()[-3000:]
    res = json.loads(lines[-2])
    print(f"\nreuse scenarios: {json.dumps(res, indent=1)}")
    for name, got in res.items():
        assert got["reused"], (name, got)  # X really got the leader's number
        assert not got["events"], (name, got)  # the hub refused events of other pids
        assert got["group_recorded"], (name, got)
        # Y is in "group G" (or "session G", and a group of its own) by number only.
        kind = name.split("-")[0]
        assert got["y_in"][0 if kind == "group" else 1] == got["leader"], (name, got)
        if kind == "session":
            assert got["y_in"][0] == got["y"], (name, got)
        # Never claimed, never signalled: it survives the teardown.
        assert not got["claimed"], (name, got)
        assert got["in_report"] == [], (name, got)
        assert got["y_alive"], (name, got)
        # Reported as a suspect (by group or session id), with a pidfs handle.
        assert [s[:3] for s in got["suspects"]] == [[got["y"], kind, got["leader"]]], (name, got)
        assert got["suspects"][0][3]
        assert [s[0] for s in got["report_suspects"]] == [got["y"]], (name, got)
