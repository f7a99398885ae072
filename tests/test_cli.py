"""The command line: ps, tree, exit (as a user would run them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import proctable

from .conftest import PY, Procs, wait_zombie


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "proctable", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_ps_table_lists_us() -> None:
    r = run("ps")
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split()[:4] == ["PID", "PPID", "PGID", "SID"]
    assert any(line.split()[0] == str(os.getpid()) for line in rows)


def test_ps_json_parses_and_matches_fields() -> None:
    r = run("ps", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert isinstance(data, list) and data
    me = [d for d in data if d["pid"] == os.getpid()]
    assert me and me[0]["ppid"] == os.getppid()
    assert set(me[0]) >= {"pid", "ppid", "pgid", "sid", "start_time", "create_time", "state",
                          "name", "uid", "exit"}


def test_ps_tree_shows_our_child_under_us(procs: Procs) -> None:
    child = procs.popen(["sleep", "60"])
    r = run("ps", "--tree")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    mine = [i for i, line in enumerate(lines) if f"({os.getpid()})" in line]
    kid = [i for i, line in enumerate(lines) if f"sleep ({child.pid})" in line]
    assert mine and kid and kid[0] > mine[0]
    r = run("tree", str(os.getpid()))
    assert r.returncode == 0
    assert f"sleep ({child.pid}) S" in r.stdout


def test_exit_of_a_zombie_human_and_json(procs: Procs) -> None:
    p = procs.py("import os; os._exit(7)")
    wait_zombie(p.pid)
    r = run("exit", str(p.pid))
    assert r.returncode == 0
    assert "exit code 7" in r.stdout
    r = run("exit", "--json", str(p.pid))
    d = json.loads(r.stdout)
    assert d["state"] == "exited" and d["status"]["code"] == 7 and d["status"]["raw"] == 1792
    assert p.wait(timeout=10) == 7  # the CLI did not reap it


def test_exit_of_gone_pid_and_bad_input(procs: Procs) -> None:
    p = procs.py("pass")
    p.wait(timeout=30)
    r = run("exit", str(p.pid))
    assert r.returncode == 1 and "no such process" in r.stdout
    for bad in ("0", "-1", "abc"):
        r = run("exit", "--", bad)
        assert r.returncode == 2 and "not a pid" in r.stderr
    r = run("tree", str(p.pid))
    assert r.returncode == 1 and "no process" in r.stderr


def test_console_script_entry_point_matches_module() -> None:
    from proctable.cli import main

    assert main(["exit", "--json", str(os.getpid())]) == 0
    assert proctable.__version__ in run("--version").stdout
    assert sys.executable


def test_ps_json_tree_nests_children(procs: Procs) -> None:
    child = procs.popen(["sleep", "60"])
    r = run("ps", "--json", "--tree")
    assert r.returncode == 0, r.stderr
    forest = json.loads(r.stdout)

    def find(nodes: list[dict[str, object]], pid: int) -> dict[str, object] | None:
        for n in nodes:
            if n["pid"] == pid:
                return n
            hit = find(n["children"], pid)  # type: ignore[arg-type]
            if hit is not None:
                return hit
        return None

    me = find(forest, os.getpid())
    assert me is not None
    assert child.pid in [k["pid"] for k in me["children"]]  # type: ignore[union-attr]
    count = 0
    todo = list(forest)
    while todo:
        n = todo.pop()
        count += 1
        todo.extend(n["children"])
    assert count >= len(proctable.snapshot()) - 10  # every process once (the table moves)
