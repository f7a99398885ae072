"""The command line as a person meets it: help, ps, tree, exit (run as a user would)."""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import time
from typing import Optional

import pytest

import proctable
from proctable.cli import _output as O
from proctable.cli import build_parser
from proctable.cli._columns import COLUMNS, View

from .conftest import PY, Procs, wait_until, wait_zombie

COMMANDS = ["ps", "tree", "top", "exit", "watch", "run", "serve", "bench"]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc (command lines, stat lines, ttys)")


def run(*args: str, timeout: float = 60, env: Optional[dict[str, str]] = None,
        ) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR")}
    e.update(env or {})
    return subprocess.run([PY, "-m", "proctable", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=e)


def run_in_pty(args: list[str], cols: int = 80, rows: int = 24, timeout: float = 60,
               env: Optional[dict[str, str]] = None) -> tuple[int, str]:
    """Run proctable with a pseudo-terminal as its stdout (and stdin): (exit code, output)."""
    import fcntl
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    e = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR")}
    e.update(env or {})
    p = subprocess.Popen([PY, "-m", "proctable", *args], stdin=slave, stdout=slave,
                         stderr=subprocess.PIPE, env=e)
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"no end of output: {out[-500:]!r}"
            r, _, _ = select.select([master], [], [], 1.0)
            if not r:
                if p.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        if p.stderr is not None:
            p.stderr.close()
        os.close(master)
    return rc, out.decode("utf-8", "replace")


def rss(pid: int) -> int:
    row = proctable.read(pid)
    return 0 if row is None or row.rss is None else row.rss


def name_of(pid: int) -> Optional[str]:
    row = proctable.read(pid)
    return None if row is None else row.name


def table_rows(text: str) -> tuple[list[str], list[list[str]]]:
    header, *rows = text.splitlines()
    return header.split(), [r.split() for r in rows if r.strip()]


# --- help -----------------------------------------------------------------------------


def test_bare_proctable_prints_help_and_exits_2() -> None:
    r = run()
    assert r.returncode == 2
    assert r.stdout.startswith("usage: proctable")
    for cmd in COMMANDS:
        assert re.search(rf"^\s+{cmd}\s+\S", r.stdout, re.MULTILINE), cmd
    assert "error" not in r.stderr


def _subparsers(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_every_command_has_a_description_and_every_argument_a_help_text() -> None:
    subs = _subparsers(build_parser())
    assert sorted(subs) == sorted(COMMANDS)
    for name, sp in subs.items():
        assert sp.description and len(sp.description) > 40, name
        for action in sp._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"proctable {name}: {action.dest} has no help text"
        r = run(name, "--help")
        assert r.returncode == 0 and r.stdout.startswith(f"usage: proctable {name}"), name
        # argparse %-formats help texts but not descriptions: a "%%" shows as typed.
        assert "%%" not in r.stdout, f"proctable {name} --help prints a doubled %"


def test_version_and_the_console_entry_point() -> None:
    from proctable.cli import main

    assert main(["exit", "--json", str(os.getpid())]) == 0
    assert run("--version").stdout.strip() == f"proctable {proctable.__version__}"


def test_import_proctable_does_not_load_the_command_line() -> None:
    code = ("import sys, proctable; print(sorted(m for m in sys.modules "
            "if m.startswith(('proctable.cli', 'proctable.bench'))))")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60,
                       check=True)
    assert r.stdout.strip() == "[]"



def test_every_subpackage_is_an_attribute_after_a_plain_import() -> None:
    """The layers load on first use, and stay reachable as they were when
    ``import proctable`` imported them all (``proctable.supervise.KINDS``)."""
    names = ["bench", "cli", "compat", "exits", "lineage", "pytest_plugin", "serve",
             "supervise"]
    code = ("import proctable\n"
            f"print([type(getattr(proctable, n)).__name__ for n in {names!r}])")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60,
                       check=True)
    assert r.stdout.strip() == str(["module"] * len(names))


def test_a_one_shot_ps_loads_only_the_table_layers() -> None:
    """`proctable ps` is a one-shot command: the lineage, supervisor, exit-watcher and
    sidecar layers (and asyncio, concurrent.futures, dataclasses) stay unloaded."""
    code = ("import sys, io, contextlib; from proctable.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): rc = main(['ps'])\n"
            "heavy = ('proctable.lineage', 'proctable.supervise', 'proctable.exits', "
            "'proctable.serve', 'asyncio', 'concurrent.futures', 'dataclasses')\n"
            "print(rc, sorted(m for m in sys.modules if m.startswith(heavy)))")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60,
                       check=True)
    assert r.stdout.strip() == "0 []"


def test_exit_has_a_text_for_every_probe_state_but_exited() -> None:
    from proctable.cli import exit as exit_cmd
    from proctable.exits import ProbeState

    names = {s.name for s in ProbeState} - {"EXITED"}
    assert set(exit_cmd._TEXT) == names
    assert set(exit_cmd._FAILED) <= names


# --- units ------------------------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0, "00:00:00"), (59.99, "00:00:59"), (3661.5, "01:01:01"),
    (86399, "23:59:59"), (86400 * 3 + 7322, "3-02:02:02"), (None, "?"),
])
def test_cpu_time_as_ps_prints_it(seconds: Optional[float], text: str) -> None:
    assert O.fmt_cputime(seconds) == text


def test_start_time_by_ps_stime_rule() -> None:
    now = time.mktime((2025, 6, 15, 12, 0, 0, 0, 0, -1))
    assert O.fmt_start(now - 3600, now) == "11:00"
    assert O.fmt_start(time.mktime((2025, 3, 2, 9, 0, 0, 0, 0, -1)), now) == "Mar02"
    assert O.fmt_start(time.mktime((2023, 12, 31, 23, 0, 0, 0, 0, -1)), now) == "2023"


@pytest.mark.parametrize(("n", "text"), [
    (0, "0K"), (512 * 1024, "512K"), (10388 * 1024, "10M"), (int(1.5 * 2**20), "1.5M"),
    (123 * 2**20, "123M"), (int(1.5 * 2**30), "1.5G"), (None, "?"),
])
def test_memory_in_k_m_g(n: Optional[int], text: str) -> None:
    assert O.fmt_bytes(n) == text


@linux_only
def test_tty_names_as_ps_names_them() -> None:
    assert O.tty_name(0) == "?"
    assert O.tty_name((136 << 8) | 3) == "pts/3"
    assert O.tty_name((4 << 8) | 1) == "tty1"
    assert O.tty_name((4 << 8) | 64) == "ttyS0"


@linux_only
def test_unknown_values_show_as_question_marks_never_zero() -> None:
    # A stat line alone gives no uid, no memory figures: every such cell is "?".
    with open(f"/proc/{os.getpid()}/stat", "rb") as f:
        row = proctable.parse_stat(f.read())
    assert row.uid is None and row.rss is None
    view = View()
    for key in ("uid", "user", "rss", "vms"):
        assert COLUMNS[key].cell(row, view) == "?", key
    assert COLUMNS["cpu"].cell(row, view) == "?"


# --- ps -----------------------------------------------------------------------------------


def test_ps_default_table(procs: Procs) -> None:
    child = procs.popen(["sleep", "61"])
    r = run("ps")
    assert r.returncode == 0, r.stderr
    header, rows = table_rows(r.stdout)
    assert header == ["PID", "PPID", "USER", "S", "START", "TIME", "RSS", "TTY", "NAME"]
    mine = [row for row in rows if row[0] == str(child.pid)]
    assert mine, r.stdout
    _pid, ppid, user, state, start, cputime, rss, _tty, name = mine[0]
    assert ppid == str(os.getpid()) and name == "sleep" and state in "SR"
    assert user == O.Users().name(os.geteuid())
    assert re.fullmatch(r"\d\d:\d\d", start)
    assert re.fullmatch(r"(\d+-)?\d\d:\d\d:\d\d", cputime)
    assert re.fullmatch(r"\d+(\.\d)?[KMG]", rss)


def _ps_fields(pid: int, fields: str) -> list[str]:
    r = subprocess.run(["ps", "-o", fields, "--no-headers", "-p", str(pid)],
                       capture_output=True, text=True, timeout=30, check=False)
    if r.returncode != 0:
        pytest.skip(f"procps ps not usable here: {r.stderr.strip()}")
    return r.stdout.split()


@linux_only
def test_ps_agrees_with_procps_on_user_time_start_and_rss(procs: Procs) -> None:
    # Test against what we did not write: procps's ps on the same processes.
    busy = procs.py("import time\nt = time.process_time()\n"
                    "while time.process_time() - t < 1.2: pass\ntime.sleep(60)")

    def done_spinning() -> bool:
        row = proctable.read(busy.pid)
        return row is not None and row.state == "S" and (row.utime or 0) + (row.stime or 0) >= 1

    wait_until(done_spinning, timeout=120)
    for pid in (1, os.getpid(), busy.pid):
        r = run("ps", "-o", "pid,user,time,start,rss", "-p", str(pid))
        assert r.returncode == 0, r.stderr
        _, rows = table_rows(r.stdout)
        assert len(rows) == 1, r.stdout
        _, user, cputime, start, rss = rows[0]
        ps_user, ps_time, ps_start, ps_rss = _ps_fields(pid, "user:32,time,stime,rss")
        assert user == ps_user
        assert start == ps_start
        if pid == busy.pid:  # sleeping since: its CPU time no longer moves
            assert cputime == ps_time
        # rss moves for a live interpreter: compare the units, and the value to 10%
        ours = proctable.read(pid)
        assert ours is not None and ours.rss is not None
        assert abs(ours.rss / 1024 - int(ps_rss)) <= max(64, int(ps_rss) * 0.1)
        assert re.fullmatch(r"\d+(\.\d)?[KMG]", rss)


def _kernel_threads() -> list[proctable.Proc]:
    return [p for p in proctable.snapshot(memory=False) if p.kernel_thread]


def test_ps_hides_kernel_threads_unless_asked() -> None:
    kthreads = _kernel_threads()
    if not kthreads:
        pytest.skip("no kernel threads visible here (a container's pid namespace)")
    shown = {int(r[0]) for r in table_rows(run("ps", "-o", "pid").stdout)[1]}
    assert not shown & {p.pid for p in kthreads}
    assert os.getpid() in shown
    shown_k = {int(r[0]) for r in table_rows(run("ps", "-K", "-o", "pid").stdout)[1]}
    assert {p.pid for p in kthreads if proctable.read(p.pid) is not None} & shown_k
    # Named explicitly, a kernel thread is shown.
    k = kthreads[0]
    assert str(k.pid) in run("ps", "-p", str(k.pid)).stdout
    assert "-K" in run("ps", "--help").stdout and "hidden" in run("ps", "--help").stdout
    tree = run("tree").stdout
    assert f"({kthreads[-1].pid})" not in tree and f"({os.getpid()})" in tree


@linux_only
def test_ps_args_column_reads_the_command_line(procs: Procs) -> None:
    marker = f"marker-{os.getpid()}"
    child = procs.popen(["sh", "-c", f"sleep 62; : {marker}"])
    wait_until(lambda: name_of(child.pid) == "sh")
    r = run("ps", "-o", "pid,args", "-p", str(child.pid))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == ["PID", "COMMAND"]
    assert f"sh -c sleep 62; : {marker}" in r.stdout
    r = run("ps", "-f", "-p", str(child.pid))
    assert f"sh -c sleep 62; : {marker}" in r.stdout
    kthreads = _kernel_threads()
    if kthreads:  # no command line: [name], as ps shows it
        r = run("ps", "-o", "pid,args", "-p", str(kthreads[0].pid))
        assert f"[{kthreads[0].name}]" in r.stdout


def test_ps_filters_by_pid_user_and_name(procs: Procs) -> None:
    a = procs.popen(["sleep", "63"])
    b = procs.popen(["cat"], stdin=subprocess.PIPE)
    both = f"{a.pid},{b.pid}"
    rows = table_rows(run("ps", "-o", "pid,name", "-p", both).stdout)[1]
    assert sorted(int(r[0]) for r in rows) == sorted([a.pid, b.pid])
    rows = table_rows(run("ps", "-o", "pid", "-p", both, "--name", "^sl").stdout)[1]
    assert [int(r[0]) for r in rows] == [a.pid]
    me = O.Users().name(os.geteuid())
    rows = table_rows(run("ps", "-o", "pid", "-p", both, "-u", me).stdout)[1]
    assert len(rows) == 2
    rows = table_rows(run("ps", "-o", "pid", "-p", both, "-u", str(os.geteuid() + 4242)).stdout)
    assert rows[1] == []
    for bad in (["-o", "pid,nosuch"], ["--sort", "nosuch"], ["-u", "no-such-user-here"],
                ["--name", "("], ["-p", "abc"], ["-o", "cpu"]):
        r = run("ps", *bad)
        assert r.returncode == 2 and "error" in r.stderr, bad


def test_ps_sorts_descending_with_unknown_last(procs: Procs) -> None:
    big = procs.py("b = bytearray(60 * 2**20)\nimport time\ntime.sleep(60)",
                   stdout=subprocess.PIPE)
    small = procs.popen(["sleep", "64"])
    wait_until(lambda: rss(big.pid) > 50 * 2**20, timeout=30)
    r = run("ps", "--json", "-o", "pid", "--sort=-rss", "-p", f"{small.pid},{big.pid}")
    got = [json.loads(line)["pid"] for line in r.stdout.splitlines()]
    assert got == [big.pid, small.pid]
    r = run("ps", "-o", "pid,rss", "--sort=rss", "-p", f"{small.pid},{big.pid}")
    assert [int(x[0]) for x in table_rows(r.stdout)[1]] == [small.pid, big.pid]


def test_ps_keeps_the_zombie_annotation(procs: Procs) -> None:
    z = procs.py("import os; os._exit(7)")
    wait_zombie(z.pid)
    r = run("ps", "-p", str(z.pid))
    assert "[exit code 7]" in r.stdout
    r = run("ps", "-o", "pid,exit", "-p", str(z.pid))
    assert "exit code 7" in r.stdout and "[" not in r.stdout
    assert z.wait(timeout=10) == 7  # ps did not reap it


def test_ps_json_lines_one_object_each(procs: Procs) -> None:
    child = procs.popen(["sleep", "65"])
    r = run("ps", "--json")
    assert r.returncode == 0, r.stderr
    objs = [json.loads(line) for line in r.stdout.splitlines()]
    assert all(o["v"] == 1 and o["type"] in ("proc", "denied") for o in objs)
    me = [o for o in objs if o["type"] == "proc" and o["pid"] == os.getpid()]
    assert me and me[0]["ppid"] == os.getppid()
    assert "user" not in me[0] and "args" not in me[0]  # derived fields only when asked
    r = run("ps", "--json", "-o", "pid,user,args,tty", "-p", str(child.pid))
    (obj,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert obj["args"] == ["sleep", "65"] and obj["user"] == O.Users().name(os.geteuid())
    assert obj["tty"] is None or isinstance(obj["tty"], str)


def test_ps_tree_orders_children_below_parents(procs: Procs) -> None:
    child = procs.popen(["sleep", "66"])
    r = run("ps", "--tree")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    mine = [i for i, line in enumerate(lines) if line.split()[0] == str(os.getpid())]
    kid = [i for i, line in enumerate(lines) if line.split()[0] == str(child.pid)]
    assert mine and kid and kid[0] > mine[0]
    assert re.search(r"[└├]─ sleep$", lines[kid[0]])
    objs = [json.loads(x) for x in run("ps", "--json", "--tree").stdout.splitlines()]
    procs_ = [o for o in objs if o["type"] == "proc"]
    idx = {o["pid"]: i for i, o in enumerate(procs_)}
    assert idx[child.pid] > idx[os.getpid()]
    assert procs_[idx[child.pid]]["depth"] == procs_[idx[os.getpid()]]["depth"] + 1
    r = run("tree", str(os.getpid()))
    assert r.returncode == 0
    assert f"sleep ({child.pid}) S" in r.stdout


def test_colour_only_on_a_terminal_and_never_with_no_color(procs: Procs) -> None:
    z = procs.py("import os; os._exit(1)")
    wait_zombie(z.pid)
    piped = run("ps")
    assert "\033[" not in piped.stdout
    rc, out = run_in_pty(["ps"])
    assert rc == 0 and "\033[1m" in out  # a bold header, a red zombie
    rc, out = run_in_pty(["ps"], env={"NO_COLOR": "1"})
    assert rc == 0 and "\033[" not in out
    z.wait(timeout=10)


@linux_only
def test_width_follows_the_terminal(procs: Procs) -> None:
    long = procs.popen(["sh", "-c", "sleep 67; : " + "x" * 300])
    wait_until(lambda: name_of(long.pid) == "sh")
    rc, out = run_in_pty(["ps", "-f"], cols=70)
    assert rc == 0
    lines = [line for line in out.replace("\r", "").split("\n") if line]
    assert lines and max(len(re.sub(r"\033\[[0-9;]*m", "", x)) for x in lines) <= 70
    piped = run("ps", "-f", "-p", str(long.pid))  # a pipe: nothing cut
    assert "x" * 300 in piped.stdout
    assert max(len(x) for x in run("ps", "-f", env={"COLUMNS": "50"}).stdout.splitlines()) <= 50


def test_ps_survives_a_reader_that_leaves() -> None:
    p = subprocess.Popen([PY, "-m", "proctable", "ps", "-K"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    p.stderr.close()
    assert p.wait(timeout=60) == 0
    assert b"Traceback" not in err


# --- exit -------------------------------------------------------------------------------


def test_exit_of_a_zombie_human_and_json(procs: Procs) -> None:
    p = procs.py("import os; os._exit(7)")
    wait_zombie(p.pid)
    r = run("exit", str(p.pid))
    assert r.returncode == 0
    name = proctable.read(p.pid).name  # type: ignore[union-attr]
    assert r.stdout == f"{p.pid} {name}: exited, exit code 7 (raw status 1792)\n"
    r = run("exit", "--json", str(p.pid), str(os.getpid()))
    first, second = (json.loads(x) for x in r.stdout.splitlines())
    assert first["v"] == 1 and first["type"] == "probe"
    assert first["state"] == "exited" and first["status"]["code"] == 7
    assert first["status"]["raw"] == 1792 and first["name"] == name
    assert second["state"] == "running" and second["status"] is None
    assert p.wait(timeout=10) == 7  # the CLI did not reap it


def test_exit_and_watch_word_a_gone_pid_alike(procs: Procs) -> None:
    p = procs.py("pass")
    p.wait(timeout=30)
    if proctable.read(p.pid) is not None:
        pytest.skip("the pid was reused at once")
    want = f"{p.pid}: no such process (gone, or reaped already)\n"
    for cmd in (["exit"], ["watch", "--timeout", "5"]):
        r = run(*cmd, str(p.pid))
        assert r.returncode == 1, cmd
        assert r.stderr == want and r.stdout == "", (cmd, r.stdout, r.stderr)
    for cmd in ("exit", "watch"):
        for bad in ("0", "-1", "abc"):
            r = run(cmd, "--", bad)
            assert r.returncode == 2 and "not a pid" in r.stderr
    r = run("tree", str(p.pid))
    assert r.returncode == 1 and "no such process" in r.stderr


def test_exit_and_watch_word_an_exit_alike(procs: Procs) -> None:
    z = procs.py("import os; os._exit(2)")
    wait_zombie(z.pid)
    name = proctable.read(z.pid).name  # type: ignore[union-attr]
    e = run("exit", str(z.pid)).stdout
    w = run("watch", str(z.pid)).stdout
    assert e.startswith(f"{z.pid} {name}: exited, exit code 2 ")
    assert w == f"{z.pid} {name}: exited, exit code 2 (seen by zombie)\n"
    assert z.wait(timeout=10) == 2


@linux_only
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to mount /proc hidepid=1 and drop)")
def test_ps_names_the_pids_it_may_not_read(procs: Procs) -> None:
    # A real denial: /proc mounted hidepid=1 in a private mount namespace, read as
    # uid 65534. Root's sleeper is listed but unreadable: a 'denied' line, a note.
    from .test_table_truth import _as_nobody_with_hidepid

    root_sleeper = procs.popen(["sleep", "68"])

    def body() -> tuple[int, int, str, str]:
        import contextlib
        import io

        from proctable.cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc_json = main(["ps", "--json"])
            rc_text = main(["ps", "-o", "pid"])
        return rc_json, rc_text, out.getvalue(), err.getvalue()

    rc_json, rc_text, out, err = _as_nobody_with_hidepid(1, body)
    assert rc_json == rc_text == 0
    objs = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    denied = [o for o in objs if o["type"] == "denied"]
    assert {"v": 1, "type": "denied", "pid": root_sleeper.pid, "uid": 0} in denied
    assert root_sleeper.pid not in [o["pid"] for o in objs if o["type"] == "proc"]
    assert "not readable by this user" in err


# --- as procps takes them: a descending key after a space, -o key=, exit codes ---------


@linux_only
def test_a_descending_sort_key_after_a_space(procs: Procs) -> None:
    # procps's `ps --sort -rss`: the value after -s/--sort is the value, dash or not
    a = procs.popen(["sleep", "65"])
    b = procs.popen(["sleep", "66"])
    lo, hi = sorted([a.pid, b.pid])
    for sort in (["--sort", "-pid"], ["-s", "-pid"], ["--sort=-pid"], ["-s", "-rss,-pid"]):
        r = run("ps", "-o", "pid", *sort, "-p", f"{lo},{hi}")
        assert r.returncode == 0, (sort, r.stderr)
        rows = table_rows(r.stdout)[1]
        if "-pid" in sort:
            assert [int(x[0]) for x in rows] == [hi, lo], sort
        else:
            assert sorted(int(x[0]) for x in rows) == [lo, hi], sort
    r = run("top", "--once", "-d", "0.2", "-s", "-cpu", "-p", f"{lo},{hi}", "-o", "pid,cpu")
    assert r.returncode == 0, r.stderr
    assert "sorted by -cpu" in r.stdout
    r = run("top", "--once", "-d", "0.2", "--sort", "-pid", "-p", f"{lo},{hi}", "-o", "pid")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split() == ["PID"])
    assert [int(x) for x in lines[head + 1:] if x.strip()] == [hi, lo]
    # a dash value is taken only after -s/--sort: elsewhere an unknown option stays one
    r = run("ps", "-o", "pid", "-rss")
    assert r.returncode == 2 and "error" in r.stderr


@linux_only
def test_exit_refuses_a_negative_start_time(procs: Procs) -> None:
    p = procs.popen(["sleep", "67"])
    r = run("exit", "--start-time", "-5", str(p.pid))
    assert r.returncode == 2 and "--start-time" in r.stderr, r.stderr
    r = run("exit", "--start-time", str(proctable.identity(p.pid).start_time), str(p.pid))
    assert r.returncode == 0 and "running" in r.stdout, r.stderr


@linux_only
def test_ps_of_a_missing_pid_exits_1_as_procps(procs: Procs) -> None:
    gone = procs.popen(["true"])
    gone.wait(timeout=30)
    assert proctable.read(gone.pid) is None  # (the pid is free again, not reused yet)
    for extra in ([], ["--json"]):
        r = run("ps", "-o", "pid", "-p", str(gone.pid), *extra)
        assert r.returncode == 1, (extra, r.stdout, r.stderr)
        r = run("ps", "-o", "pid", "-p", f"{gone.pid},{os.getpid()}", *extra)
        assert r.returncode == 0, (extra, r.stdout, r.stderr)


@linux_only
def test_ps_o_key_equals_renames_the_header_and_empty_hides_it(procs: Procs) -> None:
    p = procs.popen(["sleep", "68"])
    # procps: `-o pid=` prints no header line when every header is empty
    r = run("ps", "-o", "pid=", "-p", str(p.pid))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(p.pid)]
    r = run("ps", "-o", "pid=", "-o", "name=", "-p", str(p.pid))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(p.pid), "sleep"]
    # a header after = is the rest of the argument, commas and all, as procps has it
    r = run("ps", "-o", "pid,ppid=PARENT", "-o", "name=COMMAND,X", "-p", str(p.pid))
    assert r.returncode == 0, r.stderr
    header, rows = table_rows(r.stdout)
    assert header == ["PID", "PARENT", "COMMAND,X"]
    assert rows == [[str(p.pid), str(os.getpid()), "sleep"]]
    # procps's own reading of the same options, where ps is installed
    ps = shutil.which("ps")
    if ps is not None:
        mine = run("ps", "-o", "pid=", "-o", "ppid=", "-p", str(p.pid)).stdout.split()
        theirs = subprocess.run([ps, "-o", "pid=", "-o", "ppid=", "-p", str(p.pid)],
                                capture_output=True, text=True, check=True).stdout.split()
        assert mine == theirs
