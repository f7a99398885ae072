"""`proctable bench` runs, prints JSON, and leaves no process behind (no timings here)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Optional

import pytest

import proctable

from .conftest import DEFAULT_SIGNALS, PY, wait_until

# The repository's Node client beside these tests: the package under test may be an
# installed wheel (as CI installs it), which has no clients/ directory of its own.
NODE_CLIENT = pathlib.Path(__file__).resolve().parent.parent / "clients" / "node" / "index.js"


def node_client() -> Optional[str]:
    """The Node client's path where node and the client are here; None otherwise."""
    if shutil.which("node") is None or not NODE_CLIENT.is_file():
        return None
    return str(NODE_CLIENT)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the bench's sleepers use Linux prctl"
)


def alive(ident: tuple[int, int]) -> bool:
    row = proctable.read(ident[0])
    return row is not None and row.start_time == ident[1]


def subtree(pid: int) -> list[tuple[int, int]]:
    """(pid, start time) of every process below pid now."""
    return [(p.pid, p.start_time) for p in proctable.snapshot().descendants(pid)]


def test_bench_json_runs_and_leaves_nothing() -> None:
    r = subprocess.run(
        [PY, "-m", "proctable", "bench", "--procs", "20", "--rounds", "2", "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["sleepers"] == 20
    assert data["rounds"] == 2
    assert data["procs"] >= 20
    titles = [s["title"] for s in data["sections"]]
    assert titles[0] == "whole table"
    rows = {row["name"]: row for s in data["sections"] for row in s["rows"]}
    for name in ("snapshot()", "Scanner.refresh()", "C floor",
                 "read(pid)", "exit_probe(pid)"):
        assert rows[name]["samples"] == 2
        assert rows[name]["median_s"] > 0
    assert rows["snapshot()"]["vs_floor"] > 0
    assert any(t.startswith("subtree of 5") for t in titles)
    compat = [s for s in data["sections"] if s["title"].startswith("psutil-compatible")]
    assert [s["title"] for s in compat] == ["psutil-compatible iteration",
                                            "psutil-compatible iteration, with cmdline"]
    for s in compat:
        ours = {row["name"]: row for row in s["rows"]}["proctable.process_iter(attrs)"]
        assert ours["samples"] == 2 and ours["median_s"] > 0 and ours["vs_floor"] > 0
    started = [tuple(i) for i in data["started"]]
    assert len(started) == 20 + 5 + 1  # sleepers, the chain, the helper
    left = [i for i in started if alive(i)]  # type: ignore[arg-type]
    assert left == []
    assert "starting 20 sleepers" in r.stderr  # progress goes to stderr


def test_bench_compat_runs_and_leaves_nothing() -> None:
    # --compat: the process API beside psutil, with its 200-process tree and the
    # processes wait_procs() waits for, all stopped by the end
    r = subprocess.run(
        [PY, "-m", "proctable", "bench", "--procs", "10", "--rounds", "1", "--compat",
         "--json"], capture_output=True, text=True, timeout=300, check=False,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    sections = {s["title"]: s for s in data["sections"] if s["title"].startswith("compat:")}
    assert len(sections) == 7
    rows = {row["name"]: row for s in sections.values() for row in s["rows"]}
    for name in ("compat.Process(pid).as_dict(attrs)", "compat.pids()",
                 "compat.pid_exists(pid)", "compat, children files (the /proc road)",
                 "compat.wait_procs(procs)"):
        assert rows[name]["samples"] == 1 and rows[name]["median_s"] > 0
        assert rows[name]["vs_psutil_warm"] is None or rows[name]["vs_psutil_warm"] > 0
    started = [tuple(i) for i in data["started"]]
    assert len(started) == 10 + 5 + 1 + 200  # sleepers, the chain, the helper, the tree
    assert [i for i in started if alive(i)] == []  # type: ignore[arg-type]
    assert len(proctable.snapshot().children(os.getpid())) == 0  # no wait_procs child left


def test_bench_text_without_sleepers() -> None:
    r = subprocess.run(
        [PY, "-m", "proctable", "bench", "--procs", "0", "--rounds", "1", "--no-psutil"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "whole table" in r.stdout and "snapshot()" in r.stdout
    assert "psutil left out (--no-psutil)" in r.stdout.splitlines()[0]
    assert "faster" not in r.stdout


def test_bench_without_psutil_says_how_to_get_it(tmp_path: Any) -> None:
    # An interpreter where `import psutil` fails, as after `pip install proctable`.
    (tmp_path / "psutil.py").write_text("raise ImportError('no psutil here')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = subprocess.run(
        [PY, "-m", "proctable", "bench", "--procs", "0", "--rounds", "1"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )
    assert r.returncode == 0, r.stderr
    head, columns = r.stdout.splitlines()[:2]
    assert "pip install 'proctable[bench]'" in head
    assert "pip install 'proctable[bench]'" in columns  # where the ratios would be
    assert "faster" not in r.stdout


def test_bench_progress_off_a_terminal_ends_each_phase() -> None:
    # Off a terminal (a log, CI): a line when each phase starts and one when it ends,
    # so the log never stops at "started 100/1,000".
    r = subprocess.run(
        [PY, "-m", "proctable", "bench", "--procs", "150", "--rounds", "3", "--no-psutil"],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert "\r" not in r.stderr and "\033" not in r.stderr
    assert any(re.fullmatch(r"started 150/150 sleepers \(\d+\.\d s\)", x) for x in lines), lines
    assert any(re.fullmatch(r"measuring: round 3/3 \(\d+\.\d s\)", x) for x in lines), lines
    assert lines[0].startswith("starting 150 sleepers")
    assert lines[-1].startswith("stopping 150 sleepers")


def test_bench_subtree_rows_make_no_nonsense_ratios() -> None:
    r = subprocess.run(
        [PY, "-m", "proctable", "bench", "--procs", "5", "--rounds", "2", "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    (sub,) = [s for s in data["sections"] if s["title"].startswith("subtree")]
    rows = {row["name"]: row for row in sub["rows"]}
    fresh = rows["Table.descendants(root), fresh index"]
    # Python over rows already read: no kernel call, so it has no floor, and psutil
    # (which reads /proc) is compared with snapshot().descendants instead.
    assert fresh["vs_floor"] is None and fresh["vs_psutil_warm"] is None
    read = rows["snapshot().descendants(root)"]
    assert read["vs_floor"] is not None  # it reads the table, as the floor does (no timing)


def _interrupt_when(marker: str, procs: int) -> None:
    """Start a long bench, SIGINT it once stderr shows marker; nothing may be left."""
    p = subprocess.Popen(
        [*DEFAULT_SIGNALS, PY, "-m", "proctable", "bench", "--procs", str(procs),
         "--rounds", "100000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    seen: list[tuple[int, int]] = []
    try:
        assert p.stderr is not None
        buf = b""
        deadline = time.monotonic() + 60
        while marker.encode() not in buf:
            assert time.monotonic() < deadline, f"no {marker!r} on stderr: {buf!r}"
            ready, _, _ = select.select([p.stderr], [], [], 1.0)
            if ready:
                chunk = os.read(p.stderr.fileno(), 4096)
                assert chunk, f"bench exited early: {buf!r}"
                buf += chunk
        seen = subtree(p.pid)
        assert seen, "the bench started no process"
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=60)
        assert rc == 130
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        if p.stderr is not None:
            p.stderr.close()
    # The helper's sleepers are gone; the helper was reaped by the bench.
    wait_until(lambda: not any(alive(i) for i in seen), timeout=30)


def test_interrupt_while_measuring_leaves_nothing() -> None:
    _interrupt_when("measuring", 50)


def test_interrupt_while_starting_sleepers_leaves_nothing() -> None:
    _interrupt_when("started 100/", 2000)


def test_bench_watcher_block_runs_and_leaves_nothing() -> None:
    before = set(subtree(os.getpid()))
    r = subprocess.run(
        [PY, "-m", "proctable", "bench", "--procs", "0", "--rounds", "1", "--watcher",
         "--json", "--no-psutil"],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert r.returncode == 0, r.stderr
    ex = json.loads(r.stdout)["exit_watcher"]
    assert ex["latency"]["n"] == 50
    assert ex["latency"]["median_ms"] > 0
    assert ex["idle"]["processes"] == 1000
    assert ex["idle"]["resolved_while_idle"] == 0
    assert set(subtree(os.getpid())) <= before


def test_bench_says_which_reader_ran_and_why_not_bpf() -> None:
    r = subprocess.run(
        [PY, "-m", "proctable", "bench", "--procs", "0", "--rounds", "1", "--no-psutil"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("reader: "))
    expected = proctable.reader()
    if expected.name == "bpf":
        assert line.startswith("reader: bpf")
        assert "snapshot(reader='proc')" in r.stdout  # the /proc reader timed beside it
    else:
        assert line == f"reader: proc (not BPF: {expected.why_not})"


def test_bench_scanners_and_their_floors_share_the_fd_limit() -> None:
    """Each Scanner row and its kept-fd floor hold the same max_fds, printed,
    and all the kept-fd sets together stay within RLIMIT_NOFILE (they used to
    take half the limit each, so together exceeded it and met EMFILE)."""
    import resource

    limit = 256

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    r = subprocess.run(
        [PY, "-m", "proctable", "bench", "--procs", "0", "--rounds", "1", "--json",
         "--no-psutil"],
        capture_output=True, text=True, timeout=120, check=False, preexec_fn=low,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    note = next(s for s in data["sections"] if s["title"] == "whole table")["note"]
    m = re.search(r"RLIMIT_NOFILE 256: each Scanner and its kept-fd floor max_fds (\d+)",
                  note)
    assert m is not None, note
    holders = 3 if "reader: BPF" in note else 4
    assert 0 < holders * int(m.group(1)) < limit, note


_ZOMBIES = (
    "import os, sys, time\n"
    "for code in (1, 0):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        os._exit(code)\n"
    "    sys.stdout.write(f'{pid}\\n')\n"
    "sys.stdout.flush()\n"
    "time.sleep(60)\n"
)

_CALLS = (
    "import sys, proctable\n"
    "from proctable import _lowlevel as ll\n"
    "pid, which = int(sys.argv[1]), sys.argv[2]\n"
    "for _ in range(20):\n"
    "    ll.floor_read(pid, ll.WANT_MEM) if which == 'floor' else proctable.read(pid)\n"
)


def test_the_floor_makes_the_readers_zombie_system_calls(tmp_path: Any) -> None:
    """The ptrace check (readlinkat of cwd) is made by the reader only for a
    zombie whose status reads 0: the floor must make it exactly then too."""

    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("no strace here")
    z = subprocess.Popen([PY, "-c", _ZOMBIES], stdout=subprocess.PIPE)
    try:
        assert z.stdout is not None
        exit1, exit0 = int(z.stdout.readline()), int(z.stdout.readline())
        for pid in (exit1, exit0):
            wait_until(lambda pid=pid: (r := proctable.read(pid)) is not None
                       and r.state == "Z")

        def readlinks(pid: int, which: str) -> int:
            out = tmp_path / f"{pid}.{which}"
            r = subprocess.run([strace, "-f", "-qq", "-e", "trace=readlinkat", "-o", str(out),
                                PY, "-c", _CALLS, str(pid), which],
                               capture_output=True, text=True, timeout=120, check=False)
            assert r.returncode == 0, r.stderr
            return sum(1 for line in out.read_text().splitlines() if "/cwd" in line
                       or "\"cwd\"" in line)

        counts = {(pid, w): readlinks(pid, w) for pid in (exit1, exit0)
                  for w in ("floor", "reader")}
    finally:
        z.kill()
        z.wait()
    assert counts[(exit1, "reader")] == 0 and counts[(exit0, "reader")] == 20, counts
    assert counts[(exit1, "floor")] == counts[(exit1, "reader")], counts
    assert counts[(exit0, "floor")] == counts[(exit0, "reader")], counts


@pytest.mark.parametrize("rounds", ["0", "-1", "x"])
def test_bench_refuses_rounds_that_measure_nothing(rounds: str) -> None:
    """``proctable bench --rounds 0`` printed ``nan`` for every median (issue 30, item
    10, found by trying the command line as a new user): it is an argparse error."""
    r = subprocess.run(
        [PY, "-m", "proctable", "bench", "--procs", "0", "--rounds", rounds, "--no-psutil"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert r.returncode == 2, r.stdout
    assert "--rounds" in r.stderr and "nan" not in r.stdout


def test_bench_latency_runs_and_leaves_nothing() -> None:
    # start -> created / exited over the sidecar from the repository's Node client
    # (where node is here), and in Python; each side's own spawn beside it.
    from proctable.bench.latency import latency_bench, render

    before = set(proctable.snapshot().descendants(os.getpid()))
    client = node_client()
    data = latency_bench(rounds=3, client=client)
    wire, py = data["wire"], data["python"]
    if client is None:
        assert wire.get("skipped")
    else:
        for k in ("node_spawn", "node_exit", "sidecar_created", "sidecar_response",
                  "sidecar_exited"):
            s = wire[k]
            assert 0 < s["min_ms"] <= s["median_ms"] <= s["max_ms"], (k, s)
        assert wire["sidecar_created"]["median_ms"] <= wire["sidecar_exited"]["median_ms"]
    for k in ("popen", "popen_wait", "supervisor_created", "supervisor_return",
              "supervisor_exited"):
        assert py[k]["median_ms"] > 0, (k, py[k])
    assert py["supervisor_created"]["median_ms"] <= py["supervisor_exited"]["median_ms"]
    assert "start -> created" in render(data)
    wait_until(lambda: set(proctable.snapshot().descendants(os.getpid())) <= before)


def test_bench_wire_runs_whole_and_leaves_nothing() -> None:
    # Issue 31's wire benchmark at tiny sizes: every row well-formed and whole (every
    # byte delivered once, no offset skipped, the stream's end as written), every line
    # of every key in order, and nothing left running (the socket sidecar included).
    from proctable.bench.wire import render, seq_total, wire_bench

    client = node_client()
    if client is None:
        pytest.skip("needs node and clients/node")
    before = set(proctable.snapshot().descendants(os.getpid()))
    data = wire_bench(zero_mib=3, lines_mib=1.5, rounds=2, warmup=0, keys=4, rate=200,
                      seconds=0.5, client=client)
    rows = data["rows"]
    assert [(r["stream"], r["mode"]) for r in rows] == [
        (s, m) for s in ("zero", "lines") for m in ("node", "stdio", "socket", "base64")]
    sizes = {s["name"]: s["bytes"] for s in data["streams"]}
    seq = data["streams"][1]["args"]
    assert seq[:2] == ["seq", "1"] and sizes["lines"] == seq_total(int(seq[2]))
    assert sizes["zero"] == 3 << 20 and sizes["lines"] >= 1.5 * (1 << 20)
    for r in rows:
        assert r["samples"] == 2 and r["bytes"] == sizes[r["stream"]], r
        assert r["lost"] == 0 and r["gaps"] == 0 and r["told"] == 0 and r["whole"], r
        assert 0 < r["mb_s"]["min"] <= r["mb_s"]["median"] <= r["mb_s"]["max"], r
        assert r["client_cpu_per_200mib"]["min"] >= 0 and r["chunk_kib"] > 0, r
        if r["mode"] == "node":
            assert r["vs_node"] is None and r["sidecar_cpu_per_200mib"] is None, r
        else:
            assert r["vs_node"] > 0 and r["sidecar_cpu_per_200mib"]["min"] >= 0, r
    m = data["many_keys"]
    assert m["want"] == 4 * 100
    for side in (m["sidecar"], m["node"]):
        assert side["lines"] == m["want"] and side["keys_whole"] == 4, side
        assert side["bad_lines"] == 0 and side["told_lost"] == 0, side
    assert m["sidecar"]["sidecar_cpu"] >= 0 and m["node"]["sidecar_cpu"] is None
    text = render(data)
    assert "client over a socket, binary" in text and "NOT WHOLE" not in text
    assert "proctable bench --latency" in text
    wait_until(lambda: set(proctable.snapshot().descendants(os.getpid())) <= before)


def test_bench_wire_without_node_says_so(tmp_path: Any) -> None:
    # No node on PATH: the wire figures are left out with the reason, the rest runs.
    env = {**os.environ, "PATH": str(tmp_path)}
    r = subprocess.run(
        [PY, "-m", "proctable", "bench", "--procs", "0", "--rounds", "1", "--no-psutil",
         "--wire"], capture_output=True, text=True, timeout=120, check=False, env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "whole table" in r.stdout
    assert "the wire (proctable serve to the Node client): left out (node is not on PATH" \
        in r.stdout


@pytest.mark.parametrize(("bad", "says"), [
    ({"rounds": 0}, "rounds 0"), ({"warmup": -1}, "warmup -1"), ({"keys": -1}, "keys -1"),
    ({"zero_mib": 0}, "positive"), ({"rate": 0}, "positive"),
    ({"modes": ("stdio", "tcp")}, "unknown modes"),
])
def test_bench_wire_refuses_what_measures_nothing(bad: dict[str, Any], says: str) -> None:
    from proctable.bench.wire import wire_bench

    client = node_client()
    if client is None:
        pytest.skip("needs node and clients/node (without, it says so first)")
    with pytest.raises(ValueError, match=says):
        wire_bench(**bad, client=client)
