"""proctable.process_iter against psutil itself: same keys, same types, same values.

Two kinds of comparison. Processes started here stand still (sleeping, stopped,
zombie), so every offered attribute must be equal, exactly, to what psutil says
of them, and to what we expect of them: a comm truncated at 15 bytes, a tty, a
deleted executable, mixed real/effective/saved ids, odd argv bytes. Then the
whole live table, where other processes run and change: a (pid, attribute)
agrees when psutil's value, read between two of ours, equals one of them; a
value that our two reads saw change is allowed to disagree (it moved), one
that stood still in our reads is not. Both as root and as uid 65534 (where
psutil's AccessDenied values become ad_value on both sides), and under
hidepid=1, where whole processes are denied.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import pwd
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any, Optional

import pytest

import proctable
from proctable import _extra, compat
from proctable.compat import _decode

from ._faults import deny
from ._reliability import linux_only
from .conftest import (
    PY,
    Procs,
    lasting_differences,
    needs_root,
    run_as_nobody,
    wait_until,
    wait_zombie,
)

psutil = pytest.importorskip("psutil")

pytestmark = linux_only

OFFERED = list(compat.OFFERED)
AD = "<ad_value>"  # a sentinel both sides must put where psutil says AccessDenied
VOLATILE = {"cpu_times", "memory_info", "status", "num_threads"}


def exec_done(pid: int) -> bool:
    """Its exec finished: the command line is set. (Popen returns a moment earlier:
    its pipe closes on exec before the new program's argv pages are in place.)"""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return bool(f.read(1))
    except OSError:
        return False


def plain(v: Any) -> Any:
    """A value as plain data (tuples for psutil's and our named tuples)."""
    if isinstance(v, tuple):
        return tuple(v)
    return v


def ours(attrs: Optional[list[str]] = None, ad_value: Any = AD,
         reader: str = "auto") -> dict[int, dict[str, Any]]:
    got = {p.pid: p.info
           for p in proctable.process_iter(attrs or OFFERED, ad_value, reader=reader)}
    if reader != "auto" and _extra.SUPPORTED:
        assert compat.last_reader() == reader  # the road asked for is the one taken
    return got


READERS = ["proc", pytest.param("bpf", marks=pytest.mark.skipif(
    proctable.reader().name != "bpf", reason="the BPF reader does not run here"))]


def theirs(attrs: Optional[list[str]] = None, ad_value: Any = AD) -> dict[int, dict[str, Any]]:
    return {p.pid: p.info for p in psutil.process_iter(attrs or OFFERED, ad_value)}


def compare_live(rounds: int = 5, ad_value: Any = AD,
                 attrs: Optional[list[str]] = None, reader: str = "auto") -> list[str]:
    """(pid, attr) disagreements that hold up: psutil's value, read between two of
    ours, equals neither, although our two reads agreed, in every one of up to
    `rounds` rounds. Processes that are not the same one in all three reads (by
    create_time) are left out of that round."""
    pending: Optional[set[tuple[int, str]]] = None
    notes: dict[tuple[int, str], str] = {}
    for _ in range(rounds):
        # psutil scans /dev for terminals once per process and never again: give it
        # the /dev of now, as proctable looks again for a terminal it does not know
        psutil._psposix.get_terminal_map.cache_clear()
        # ...and it keeps a Process per pid across calls, whose exe is read once:
        # a process that exec'd meanwhile keeps its old exe there. Read afresh.
        psutil.process_iter.cache_clear()
        a, p, b = (ours(attrs, ad_value, reader), theirs(attrs, ad_value),
                   ours(attrs, ad_value, reader))
        bad: set[tuple[int, str]] = set()
        common = set(a) & set(p) & set(b)
        same = [pid for pid in common
                if a[pid]["create_time"] == p[pid]["create_time"] == b[pid]["create_time"]]
        # create_time is compared exactly: most pids must pass it, or nothing is compared
        assert len(same) >= len(common) // 2 and same, (len(same), len(common))
        # This process is left out: reading changes it (the reader's own memory,
        # and its thread count while a C scan thread runs).
        common.discard(os.getpid())
        for pid in common:
            ca, cp, cb = (d[pid]["create_time"] for d in (a, p, b))
            if not (ca == cp == cb) or ad_value in (ca, cp):
                continue  # another process now holds the pid
            for attr in attrs or OFFERED:
                if pending is not None and (pid, attr) not in pending:
                    continue
                va, vp, vb = (plain(d[pid][attr]) for d in (a, p, b))
                if vp in (va, vb):
                    continue
                if va != vb:
                    continue  # it changed between our reads: it moves, psutil saw a moment
                bad.add((pid, attr))
                notes[(pid, attr)] = f"pid {pid} {attr}: ours {va!r}, psutil {vp!r}"
        pending = bad if pending is None else pending & bad
        if not pending:
            return []
    return sorted(notes[k] for k in pending or ())


# --- the API's shape ----------------------------------------------------------------


def test_yields_psutil_keys_and_types_sorted_by_pid() -> None:
    got = list(proctable.process_iter())
    assert [p.pid for p in got] == sorted(p.pid for p in got)
    me = next(p for p in got if p.pid == os.getpid())
    assert list(me.info) == OFFERED
    info = me.info
    assert isinstance(info["pid"], int) and isinstance(info["ppid"], int)
    assert isinstance(info["name"], str) and info["status"] in ("running", "sleeping")
    assert isinstance(info["create_time"], float)
    assert isinstance(info["uids"], compat.puids) and info["uids"].real == os.getuid()
    assert isinstance(info["gids"], compat.pgids) and info["gids"].effective == os.getegid()
    assert info["username"] == pwd.getpwuid(os.getuid()).pw_name
    assert isinstance(info["cpu_times"], compat.pcputimes)
    assert info["cpu_times"]._fields == psutil.Process().cpu_times()._fields
    assert isinstance(info["memory_info"], compat.pmem)
    assert info["memory_info"]._fields == psutil.Process().memory_info()._fields
    assert info["cmdline"] == psutil.Process().cmdline()
    assert info["exe"] == os.path.realpath(sys.executable) or info["exe"] == sys.executable
    # the proctable row and its identity, for terminate/watch/lineage
    assert isinstance(me.proc, proctable.Proc) and me.proc.pid == me.pid
    assert me.identity == proctable.identity(me.pid)


def test_attrs_subset_and_order_and_psutil_empty_list_means_all() -> None:
    (me,) = [p for p in proctable.process_iter(["name", "pid"]) if p.pid == os.getpid()]
    assert list(me.info) == ["name", "pid"]
    (me,) = [p for p in proctable.process_iter([]) if p.pid == os.getpid()]
    assert list(me.info) == OFFERED


def test_unknown_attribute_is_a_valueerror_naming_the_offered_ones() -> None:
    with pytest.raises(ValueError, match="'io_counters'") as e:
        proctable.process_iter(["pid", "io_counters"])
    for a in compat.AS_DICT_ATTRS:
        assert a in str(e.value)
    with pytest.raises(TypeError):
        proctable.process_iter("name")  # type: ignore[arg-type]
    # psutil offers io_counters, so callers learn of the difference at the call
    assert "io_counters" in psutil.Process().as_dict()


def test_attributes_beyond_the_table_pass_are_read_per_process(procs: Procs) -> None:
    # cwd, environ, nice, num_fds, cpu_percent: offered when named, each read by the
    # Process method (as psutil reads them), also for a zombie (ad_value where
    # psutil says ZombieProcess) and for a process gone meanwhile (left out).
    p = procs.popen(["sleep", "600"], cwd="/", env={"A": "1"})
    z = procs.popen(["true"])
    wait_until(lambda: exec_done(p.pid))
    wait_zombie(z.pid)
    late = ["pid", "cwd", "environ", "nice", "num_fds", "cpu_percent", "memory_percent"]
    mine = {x.pid: x.info for x in proctable.process_iter(late, AD) if x.pid in (p.pid, z.pid)}
    psutil.process_iter.cache_clear()
    theirs = {x.pid: x.info for x in psutil.process_iter(late, AD) if x.pid in (p.pid, z.pid)}
    assert mine == theirs
    assert mine[p.pid]["cwd"] == "/" and mine[p.pid]["environ"] == {"A": "1"}
    assert mine[z.pid]["cwd"] == AD  # psutil: ZombieProcess


def test_ad_value_is_used_as_given(procs: Procs) -> None:
    zombie = procs.popen(["true"])
    wait_zombie(zombie.pid)
    marker = object()
    got = {p.pid: p.info for p in proctable.process_iter(["exe", "name"], ad_value=marker)}
    assert got[zombie.pid] == {"exe": marker, "name": "true"}  # psutil: ZombieProcess
    assert all(i["exe"] is marker or isinstance(i["exe"], str) for i in got.values())


# --- processes that stand still, compared exactly -------------------------------------


def _long_named(tmp_path: pathlib.Path) -> str:
    exe = tmp_path / "proctable_long_program_name"
    shutil.copy("/bin/sleep", exe)
    return str(exe)


def _pty_leader(procs: Procs, keep: list[int]) -> tuple[subprocess.Popen[bytes], str]:
    """A session leader whose controlling terminal is a new pty; the master fd goes
    to keep (closing it would hang the terminal up, and SIGHUP the leader)."""
    master, slave = os.openpty()
    keep.append(master)
    name = os.ttyname(slave)
    os.close(slave)
    code = ("import os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR)\n"  # a session leader gets a controlling tty
            "print('ok', flush=True)\n"
            "time.sleep(600)\n")
    p = procs.popen([PY, "-c", code, name], start_new_session=True, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"ok\n"
    return p, name


@pytest.fixture
def fds() -> Iterator[list[int]]:
    """fds a test opened (pty masters), closed at its end."""
    keep: list[int] = []
    try:
        yield keep
    finally:
        for fd in keep:
            os.close(fd)


def _specimens(procs: Procs, tmp_path: pathlib.Path, keep: list[int]) -> dict[str, int]:
    """Processes in many shapes, each standing still; name -> pid."""
    out: dict[str, int] = {}
    out["sleep"] = procs.popen(["sleep", "600"]).pid
    out["long_name"] = procs.popen([_long_named(tmp_path), "600"]).pid
    renamed = procs.py("import ctypes, time\n"
                       "ctypes.CDLL(None).prctl(15, b'averyveryverylongname', 0, 0, 0)\n"
                       "time.sleep(600)")
    out["renamed"] = renamed.pid
    odd = procs.popen([PY.encode(), b"-c", b"import time; time.sleep(600)", b"a b", b"x\ry",
                       b"\xff\xfe", b"", b"last"])
    out["odd_argv"] = odd.pid
    threads = procs.py("import threading, time\n"
                       "ts = [threading.Thread(target=time.sleep, args=(600,), daemon=True)"
                       " for _ in range(3)]\n"
                       "[t.start() for t in ts]\n"
                       "time.sleep(600)")
    out["threads"] = threads.pid
    stopped = procs.popen(["sleep", "600"])
    os.kill(stopped.pid, signal.SIGSTOP)
    out["stopped"] = stopped.pid
    zombie = procs.popen(["true"])
    wait_zombie(zombie.pid)
    out["zombie"] = zombie.pid
    deleted = tmp_path / "sleep_then_deleted"
    shutil.copy("/bin/sleep", deleted)
    out["deleted_exe"] = procs.popen([str(deleted), "600"]).pid
    tty, _name = _pty_leader(procs, keep)
    out["tty"] = tty.pid
    busy = procs.popen(["sh", "-c", f"{PY} -c 'sum(range(3_000_000))'; exec sleep 600"])
    out["children_cpu"] = busy.pid
    if os.geteuid() == 0:
        mixed = procs.py("import os, time\n"
                         "os.setresgid(65534, 0, 100)\n"
                         "os.setresuid(65534, 0, 1000)\n"
                         "time.sleep(600)")
        out["mixed_ids"] = mixed.pid
    # Everything settled: started, stopped, exec'd, renamed, counted.
    def settled() -> bool:
        t = proctable.snapshot()
        rows = {k: t.get(pid) for k, pid in out.items()}
        return all(r is not None for r in rows.values()) and (
            rows["stopped"].state == "T"  # type: ignore[union-attr]
            and rows["renamed"].name == "averyveryverylo"  # type: ignore[union-attr]
            and rows["threads"].num_threads == 4  # type: ignore[union-attr]
            and rows["children_cpu"].name == "sleep"  # type: ignore[union-attr]
            and all(rows[k].state in "SZT" for k in rows)  # type: ignore[union-attr]
            and all(exec_done(pid) for k, pid in out.items() if k != "zombie")
            and ("mixed_ids" not in rows or _uids(out["mixed_ids"]) == [65534, 0, 1000]))

    wait_until(settled, timeout=30)
    deleted.unlink()
    return out


def _uids(pid: int) -> list[int]:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return [int(x) for x in line.split()[1:4]]
    return []


@pytest.mark.parametrize("reader", READERS)
def test_standing_processes_equal_psutil_exactly(procs: Procs, tmp_path: pathlib.Path,
                                                 fds: list[int], reader: str) -> None:
    pids = _specimens(procs, tmp_path, fds)
    psutil._psposix.get_terminal_map.cache_clear()  # it never scans /dev again otherwise
    a, p, b = ours(reader=reader), theirs(), ours(reader=reader)
    for what, pid in pids.items():
        assert pid in a and pid in p and pid in b, what
        for attr in OFFERED:
            va, vp, vb = (plain(d[pid][attr]) for d in (a, p, b))
            assert va == vb == vp, f"{what} (pid {pid}) {attr}: ours {va!r}, psutil {vp!r}"
    mine = {k: a[pid] for k, pid in pids.items()}
    # The table-only attributes take another road (a snapshot, BPF where it runs,
    # and a second pass for truncated names): the same answers.
    table_only = ["pid", "ppid", "name", "status", "create_time", "num_threads", "terminal"]
    fast = {p.pid: p.info for p in proctable.process_iter(table_only, AD)}
    for what, pid in pids.items():
        assert fast[pid] == {k: a[pid][k] for k in table_only}, what
    # Every road a truncated name can take: with no extra file (a second pass), with
    # extra files but no cmdline (the command line read in the same C pass), with it.
    for attrs in (["name"], ["pid", "name", "ppid", "status", "create_time", "username"],
                  ["name", "memory_info"], ["name", "cpu_times"], ["name", "uids"],
                  ["name", "cmdline"], ["name", "exe"]):
        names = {p.pid: p.info["name"]
                 for p in proctable.process_iter(attrs, AD, reader=reader)}
        for what in ("long_name", "renamed"):
            assert names[pids[what]] == a[pids[what]]["name"], (attrs, what)
    # ...and what those values must be, whatever psutil says
    assert mine["long_name"]["name"] == "proctable_long_program_name"  # extended from argv[0]
    assert mine["renamed"]["name"] == "averyveryverylo"  # argv[0] does not start with it
    assert mine["odd_argv"]["cmdline"][3:] == ["a b", "x\ny", "\udcff\udcfe", "", "last"]
    assert mine["threads"]["num_threads"] == 4
    assert mine["stopped"]["status"] == "stopped"
    z = mine["zombie"]
    assert (z["status"], z["exe"], z["cmdline"], z["name"]) == ("zombie", AD, AD, "true")
    assert mine["deleted_exe"]["exe"] == str(tmp_path / "sleep_then_deleted")
    assert mine["tty"]["terminal"] is not None and mine["tty"]["terminal"].startswith("/dev/pts/")
    assert mine["sleep"]["terminal"] == p[pids["sleep"]]["terminal"]
    assert mine["children_cpu"]["cpu_times"].children_user + \
        mine["children_cpu"]["cpu_times"].children_system > 0
    if "mixed_ids" in mine:
        m = mine["mixed_ids"]
        assert tuple(m["uids"]) == (65534, 0, 1000) and tuple(m["gids"]) == (65534, 0, 100)
        assert m["username"] == pwd.getpwuid(65534).pw_name  # psutil's rule: the REAL uid
        row = next(x for x in proctable.process_iter(["pid"]) if x.pid == pids["mixed_ids"])
        assert row.proc is not None and row.proc.uid == 0  # Proc.uid is the effective uid


def test_rows_are_the_snapshots_rows(procs: Procs, tmp_path: pathlib.Path,
                                     fds: list[int]) -> None:
    pids = _specimens(procs, tmp_path, fds)
    snap = proctable.snapshot()
    for p in proctable.process_iter(["memory_info"]):
        if p.pid in pids.values():
            s = snap.get(p.pid)
            assert p.proc == s, (p.proc, s)  # statm read here too: rss and vms included
    for p in proctable.process_iter(["pid"]):
        if p.pid in pids.values():
            s = snap.get(p.pid)
            assert p.proc is not None and s is not None
            assert p.proc.same_process(s) and p.proc.rss is None  # no statm asked, none read


@pytest.mark.parametrize("reader", READERS)
def test_live_table_equals_psutil_as_root_or_whoever_runs_it(reader: str) -> None:
    assert compare_live(reader=reader) == []


@pytest.mark.parametrize("reader", READERS)
def test_live_table_attributes_alone_equal_psutil(reader: str) -> None:
    # only what the stat line gives: read as snapshot() reads the table
    table_only = ["pid", "ppid", "name", "status", "create_time", "num_threads", "terminal"]
    assert compare_live(attrs=table_only, reader=reader) == []


@pytest.mark.parametrize("reader", READERS)
def test_live_table_cpu_times_alone_equal_psutil(reader: str) -> None:
    # no extra file at all: only the stat line (or the BPF record) gives them
    assert compare_live(attrs=["pid", "create_time", "cpu_times"], reader=reader) == []


@pytest.mark.parametrize("reader", READERS)
def test_live_table_the_headline_attributes_equal_psutil(reader: str) -> None:
    # the README's attrs: through BPF, no /proc file but the cmdline of long names
    headline = ["pid", "name", "ppid", "status", "create_time", "username"]
    assert compare_live(attrs=headline, reader=reader) == []


@needs_root
def test_live_table_equals_psutil_as_nobody(procs: Procs, tmp_path: pathlib.Path,
                                            fds: list[int]) -> None:
    _specimens(procs, tmp_path, fds)  # root processes of every shape: another user's

    def body() -> list[str]:
        # psutil caches Process objects (and their exe) across calls: a cache filled
        # by root before the fork is not what a user 65534 sees
        psutil.process_iter.cache_clear()
        return compare_live()

    assert run_as_nobody(body, timeout=120) == ("ok", [])


@needs_root
def test_as_nobody_root_exe_is_ad_value_on_both_sides(procs: Procs) -> None:
    sleeper = procs.popen(["sleep", "600"])
    wait_until(lambda: exec_done(sleeper.pid))

    def body() -> tuple[Any, Any, Any]:
        psutil.process_iter.cache_clear()  # filled by root before the fork
        mine = next(p.info for p in proctable.process_iter(["exe", "cmdline"], "DENIED")
                    if p.pid == sleeper.pid)
        ps = next(p.info for p in psutil.process_iter(["exe", "cmdline"], "DENIED")
                  if p.pid == sleeper.pid)
        return mine["exe"], ps["exe"], mine["cmdline"]

    # a root process's exe link is denied to others; argv[0] "sleep" is no absolute
    # path, so psutil cannot guess it either
    assert run_as_nobody(body) == ("ok", ("DENIED", "DENIED", ["sleep", "600"]))


@needs_root
def test_hidepid_denied_processes_as_psutil_yields_them(procs: Procs) -> None:
    from .test_table_truth import _as_nobody_with_hidepid

    sleeper = procs.popen(["sleep", "600"])
    wait_until(lambda: exec_done(sleeper.pid))

    def body() -> Any:
        psutil.process_iter.cache_clear()  # filled by root before the fork
        mine = {p.pid: (p.info, p.proc is None) for p in proctable.process_iter(None, "AD")}
        ps = {p.pid: p.info for p in psutil.process_iter(OFFERED, "AD")}
        me = mine[os.getpid()]
        return (
            sleeper.pid in ps,
            {k: plain(v) for k, v in mine[sleeper.pid][0].items()} if sleeper.pid in mine else None,
            mine[sleeper.pid][1] if sleeper.pid in mine else None,
            {k: plain(v) for k, v in ps.get(sleeper.pid, {}).items()},
            me[1], me[0]["name"],
        )

    listed, mine, no_row, ps, my_row_missing, my_name = _as_nobody_with_hidepid(1, body)
    assert listed, "hidepid=1 lists the pid (hidepid=2 would hide it from both)"
    assert mine == ps  # every value but pid is ad_value, on both sides
    assert mine["pid"] == sleeper.pid and mine["name"] == "AD" and no_row is True
    assert my_row_missing is False and isinstance(my_name, str)  # its own are readable


# --- vanished and reused processes ----------------------------------------------------


def test_a_gone_or_reused_pid_is_no_process(procs: Procs) -> None:
    p = procs.popen(["sleep", "600"])
    wait_until(lambda: exec_done(p.pid))
    row = proctable.read(p.pid)
    assert row is not None
    want = _extra.X_STATUS | _extra.X_CMDLINE
    (same, other) = _extra.read_extra([(p.pid, row.start_time, want),
                                       (p.pid, row.start_time + 1, want)])
    assert not same.flags & _extra.F_GONE and same.cmdline == b"sleep\x00600\x00"
    assert other.flags & _extra.F_GONE  # another start time: another process holds the pid
    p.kill()
    p.wait(timeout=10)
    (gone,) = _extra.read_extra([(p.pid, row.start_time, want)])
    assert gone.flags & _extra.F_GONE


def test_processes_exiting_during_iteration_are_skipped(procs: Procs) -> None:
    # A helper that starts and reaps short processes (some setsid, some zombies for
    # a moment) as fast as it can while we iterate: nothing raises, every yielded
    # process has every value, none is yielded twice.
    churn = procs.py(
        "import os, time\n"
        "end = time.monotonic() + 30\n"
        "while time.monotonic() < end:\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        if os.getpid() % 2: os.setsid()\n"
        "        os._exit(0)\n"
        "    os.waitpid(pid, 0)\n")
    for _ in range(20):
        got = list(proctable.process_iter(OFFERED, ad_value=AD))
        pids = [p.pid for p in got]
        assert len(pids) == len(set(pids))
        for p in got:
            assert list(p.info) == OFFERED
            assert p.proc is not None and p.proc.pid == p.pid
            if p.info["ppid"] == churn.pid and p.info["status"] != "zombie":
                # caught alive: its values are its own (a fork of the helper)
                assert p.info["cmdline"] in (AD, [], churn.args) or p.info["cmdline"][0] == PY
    churn.kill()
    churn.wait(timeout=10)


# --- the parsers, against psutil's own on the same bytes -------------------------------


@pytest.mark.parametrize("raw", [
    b"", b"a\x00", b"a\x00b\x00", b"a b c", b"a b c\x00", b"one\x00two words\x00",
    b"x\ry\x00", b"x\r\ny\x00", b"\xff\xfe\x00", b"a\x00\x00", b"\x00", b"  ", b"a  b ",
    b"setproctitle style: a b", b"nul sep\x00 but spaces\x00",
])
def test_cmdline_parse_matches_psutil(tmp_path: pathlib.Path, raw: bytes,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # psutil reads {PROCFS_PATH}/<pid>/cmdline: give it a made-up one.
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "cmdline").write_bytes(raw)
    (tmp_path / "1" / "stat").write_bytes(b"1 (x) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 "
                                          b"0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
    from psutil import _pslinux

    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    try:
        expected = _pslinux.Process(1).cmdline()
    except psutil.ZombieProcess:  # pragma: no cover - the made-up stat says S
        expected = None
    assert (_decode.cmdline(raw) if raw else []) == expected


def test_c_parsers_on_real_files_and_bad_input() -> None:
    with open(f"/proc/{os.getpid()}/status", "rb") as f:
        uids, gids = _extra.parse_status_ids(f.read())
    assert uids == os.getresuid() and gids == os.getresgid()
    with open(f"/proc/{os.getpid()}/statm", "rb") as f:
        statm = _extra.parse_statm_all(f.read())
    assert len(statm) == 7 and statm[0] > 0
    with open(f"/proc/{os.getpid()}/stat", "rb") as f:
        line = f.read()
    flags, cpu, xflags = _extra.parse_stat_cpu(line)
    fields = line[line.rindex(b")") + 2:].split()
    assert cpu[:4] == tuple(int(x) for x in fields[11:15]) and cpu[4] == int(fields[39])
    assert flags == int(fields[6]) and not xflags & _extra.F_ZOMBIE
    for bad in (b"", b"Uid:\t1\t2\n", b"Uid:\tx\t1\t1\nGid:\t1\t1\t1\n", b"Gid:\t1\t2\t3\n"):
        with pytest.raises(ValueError):
            _extra.parse_status_ids(bad)
    for bad in (b"", b"1 2 3", b"1 2 3 4 5 6 x", b"-1 2 3 4 5 6 7"):
        with pytest.raises(ValueError):
            _extra.parse_statm_all(bad)
    for bad in (b"", b"1 (x)", b"1 (x) S 1 2 3 4 5 6 7 8 9 10 x 12 13 14", b"no paren"):
        with pytest.raises(ValueError):
            _extra.parse_stat_cpu(bad)
    # 42 absent (before Linux 2.6.18): iowait 0, as psutil sets it
    short = b"1 (x) S " + b" ".join(b"%d" % i for i in range(4, 30))
    _f, cpu, xflags = _extra.parse_stat_cpu(short)
    assert cpu[4] == 0 and not xflags & int(_extra.lib.PT_X_HAVE_BLKIO)


def test_long_cmdline_beyond_the_c_scratch(procs: Procs) -> None:
    arg = "x" * 70_000  # more than PT_X_BLOB_MAX: read by Python, identity checked
    p = procs.popen([PY, "-c", "import time; time.sleep(600)", arg])
    wait_until(lambda: exec_done(p.pid))
    (mine,) = [x.info for x in proctable.process_iter(["cmdline"]) if x.pid == p.pid]
    assert mine["cmdline"][-1] == arg
    (ps,) = [x.info for x in psutil.process_iter(["cmdline"]) if x.pid == p.pid]
    assert mine == ps


def test_terminal_map_follows_new_ptys(procs: Procs, fds: list[int]) -> None:
    _decode._tty_map = {}  # a map from before any pty: the lookup must scan again
    p, name = _pty_leader(procs, fds)
    (mine,) = [x.info for x in proctable.process_iter(["terminal"]) if x.pid == p.pid]
    assert mine["terminal"] == name



_FEW_FDS = r"""
import json, os, resource, proctable
from proctable import OutOfFds
list(proctable.process_iter(None))  # the reader decided (and any BPF link loaded) first
resource.setrlimit(resource.RLIMIT_NOFILE, (32, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
while True:
    try:
        held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
out = []
for _round in range(4):
    os.close(held.pop())  # one more free fd each round: 1, 2, 3, 4
    for reader in ("proc", "bpf") if proctable.reader().name == "bpf" else ("proc",):
        for attrs in (["pid", "uids"], ["pid", "name"], ["pid", "cmdline"], None):
            try:
                n = len(list(proctable.process_iter(attrs, "AD", reader=reader)))
                out.append([len(held), reader, attrs, "rows", n])
            except OutOfFds as e:
                out.append([len(held), reader, attrs, "OutOfFds", str(e)])
            except Exception as e:
                out.append([len(held), reader, attrs, "other", repr(e)])
print(json.dumps(out))
"""


@needs_root
def test_reader_bpf_where_it_cannot_run_says_why() -> None:
    def body() -> list[str]:
        why = proctable.reader().why_not
        said = []
        for read in (lambda: list(proctable.process_iter(["pid", "uids"], reader="bpf")),
                     lambda: list(proctable.process_iter(["pid"], reader="bpf")),
                     lambda: proctable.snapshot(reader="bpf")):
            try:
                read()
                said.append("read")
            except OSError as e:
                said.append(f"{e.errno == errno.ENOTSUP} {why is not None and why in str(e)}")
        return said

    assert run_as_nobody(body, timeout=60) == ("ok", ["True True"] * 3)


_BOTH_ROADS = r"""
import json, os, subprocess, sys, time, proctable
from proctable import compat
# a child with ids only status knows, and one whose comm is cut at 15 bytes
m = subprocess.Popen(["python3", "-c", "import os, time\n"
                      "os.setresgid(65534, 0, 100); os.setresuid(65534, 0, 1000)\n"
                      "time.sleep(60)"])
s = subprocess.Popen([sys.argv[1], "60"])
STILL = ["pid", "ppid", "name", "create_time", "terminal", "uids", "gids", "username",
         "cmdline", "exe"]
def infos(reader):
    got = {p.pid: {k: list(v) if isinstance(v, tuple) else v for k, v in p.info.items()}
           for p in proctable.process_iter(STILL, "AD", reader=reader)}
    return got, compat.last_reader()
def ready():
    with open(f"/proc/{m.pid}/status") as f, open(f"/proc/{s.pid}/cmdline", "rb") as g:
        return "\nUid:\t65534\t0\t1000" in f.read() and b"proctable_" in g.read()
deadline = time.monotonic() + 30
while not ready() and time.monotonic() < deadline:
    time.sleep(0.01)
rounds = [[infos("bpf"), infos("proc")] for _ in range(4)]
for p in (m, s):
    p.kill()
    p.wait()
print(json.dumps({"rounds": rounds, "mixed": m.pid, "long": s.pid}))
"""


@needs_root
@pytest.mark.skipif(proctable.reader().name != "bpf", reason="the BPF reader does not run here")
@pytest.mark.parametrize("errname", ["EPERM", "ENOSYS"])
def test_bpf_road_without_pidfds_reads_rows_whole_and_agrees(errname: str,
                                                             tmp_path: pathlib.Path) -> None:
    # pidfd_open denied (a seccomp filter): no row's /proc reads can be proven by
    # its pidfs inode, so each is read whole, as the /proc road reads it.
    r = subprocess.run([*deny("pidfd_open", errname), PY, "-c", _BOTH_ROADS,
                        _long_named(tmp_path)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert all((ra, rp) == ("bpf", "proc") for (_, ra), (_, rp) in out["rounds"])
    assert lasting_differences([(a, p) for (a, _), (p, _) in out["rounds"]]) == []
    a = out["rounds"][-1][0][0]
    mixed, long = a[str(out["mixed"])], a[str(out["long"])]
    assert (mixed["uids"], mixed["gids"]) == ([65534, 0, 1000], [65534, 0, 100])
    assert long["name"] == "proctable_long_program_name"


def test_out_of_fds_is_outoffds_or_a_full_table() -> None:
    # An application that used up its fds: every attribute set either reads the
    # table or raises OutOfFds (an OSError with errno EMFILE), never another error.
    r = subprocess.run([PY, "-c", _FEW_FDS], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out and not [o for o in out if o[3] == "other"], out
    assert any(o[3] == "OutOfFds" for o in out), out  # the limit was really reached


def test_buffers_too_small_are_grown_and_the_read_retried() -> None:
    # C never allocates: it says ENOSPC with the room it needs, and the caller
    # retries with more. Start from buffers far too small for the table.
    b = _extra._buffers
    b.cap = 2
    b.rows = _extra.ffi.new("pt_proc[]", 2)
    b.extra = _extra.ffi.new("pt_extra[]", 2)
    b.denied = _extra.ffi.new("pt_denied[]", 2)
    b.info.denied, b.info.denied_cap = b.denied, 2
    b.arena_cap = 8
    b.arena = _extra.ffi.new("char[]", 8)
    rows, extras, _denied = _extra.scan_extra(proctable.Proc, _extra.X_CMDLINE)
    assert len(rows) == len(extras) > 2 and b.cap >= len(rows) and b.arena_cap > 8
    me = next(x for x in extras if x.pid == os.getpid())
    with open("/proc/self/cmdline", "rb") as f:
        assert me.cmdline == f.read()
    # the second pass grows the arena too
    b.arena_cap = 8
    b.arena = _extra.ffi.new("char[]", 8)
    row = next(r for r in rows if r.pid == os.getpid())
    (x,) = _extra.read_extra([(row.pid, row.start_time, _extra.X_CMDLINE)])
    assert x.cmdline == me.cmdline and b.arena_cap > 8
