"""proctable.compat against psutil 7: one script, run through ``import psutil`` and
through ``import proctable.compat as psutil``, on the same processes.

The script (tests/_psutil_script.py) calls every name of psutil's process API
on each specimen and records the value and its type, or the exception class
with its pid and name. The specimens stand still (sleeping, stopped, zombies,
kernel threads, a process whose main thread exited, a tree), so both runs see
the same processes in the same states; what moves on its own (a kernel
thread's cpu times) is compared by type. Then again as uid 65534, where root's
processes are another user's, with /proc mounted hidepid=2 in a private mount
namespace (and, with PROCTABLE_SLOW_TESTS, plain and hidepid=1).

Where proctable.compat differs on purpose (identity, a zombie's wait(), a
thread id) the tests below the comparison say so, psutil beside it.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import signal
import subprocess
import textwrap
import threading
import time
from typing import Any

import pytest

import proctable
from proctable import compat

from . import _psutil_script as script
from ._reliability import SLOW, linux_only
from .conftest import PY, Procs, needs_root, run_in_pid_namespace, wait_until, wait_zombie
from .test_compat import _specimens, exec_done, fds  # noqa: F401 - fds is a fixture

psutil = pytest.importorskip("psutil")

pytestmark = linux_only


# The main thread ends (the exit syscall, as pthread_exit), another thread sleeps.
LEADER_EXIT = r"""
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
SYS_exit = {"x86_64": 60, "aarch64": 93}[os.uname().machine]
threading.Thread(target=time.sleep, args=(600,)).start()
sys.stdout.write("ok\n"); sys.stdout.flush()
libc.syscall(SYS_exit, 0)
"""

# A child that exits 9 and that nobody reaps: a zombie that is not ours.
NOT_OURS = r"""
import os, sys, time
pid = os.fork()
if pid == 0:
    os._exit(9)
print(pid, flush=True)
time.sleep(600)
"""


def _odd_specimens(procs: Procs) -> dict[str, int]:
    out: dict[str, int] = {}
    nz = procs.py(NOT_OURS, stdout=subprocess.PIPE)
    assert nz.stdout is not None
    out["zombie_not_ours"] = int(nz.stdout.readline())
    wait_zombie(out["zombie_not_ours"])
    if os.uname().machine in ("x86_64", "aarch64"):
        le = procs.py(LEADER_EXIT, stdout=subprocess.PIPE)
        assert le.stdout is not None and le.stdout.readline() == b"ok\n"
        wait_until(lambda: (r := proctable.read(le.pid)) is not None and r.state == "Z"
                   and r.num_threads == 2)
        out["leader_exited"] = le.pid
    table = proctable.snapshot()
    kthreads = [r for r in table if r.kernel_thread]
    if kthreads:
        out["kthread"] = kthreads[0].pid  # kthreadd where the kernel shows it
        idle = [r for r in kthreads if r.state == "I" and not r.name.startswith("kworker/")]
        if idle:
            out["kthread_idle"] = idle[0].pid
    tree = procs.popen(["sh", "-c", "sleep 600 & sleep 600 & sh -c 'sleep 600 & wait' & wait"])
    wait_until(lambda: len(proctable.snapshot().descendants(tree.pid)) == 4
               and all(exec_done(d.pid) for d in proctable.snapshot().descendants(tree.pid)))
    out["tree"] = tree.pid
    gone = procs.popen(["true"])
    gone.wait(timeout=10)
    out["gone"] = gone.pid
    return out


# What moves on its own: a kernel thread wakes (its status), spends CPU time, and
# kthreadd's children come and go.
MOVING = {"kthread": {"cpu_times", "cpu_percent", "children", "num_threads", "status"},
          "kthread_idle": {"cpu_times", "cpu_percent", "status"}}


def _fresh(ps: Any) -> None:
    """Forget what the module kept from an earlier run (psutil's Process cache and
    terminal map; compat's cpu_percent baselines)."""
    ps.process_iter.cache_clear()
    if ps is psutil:
        psutil._psposix.get_terminal_map.cache_clear()


def _compare(spec: dict[str, int]) -> list[str]:
    for ps in (psutil, compat):
        _fresh(ps)
    a = script.observe(psutil, spec)
    b = script.observe(compat, spec)
    return script.differences(a, b, MOVING)


def test_the_same_script_gives_the_same_answers(procs: Procs, tmp_path: pathlib.Path,
                                                fds: list[int]) -> None:  # noqa: F811
    spec = {**_specimens(procs, tmp_path, fds), **_odd_specimens(procs)}
    assert _compare(spec) == []


@pytest.mark.parametrize("road", ["walk", "table", "table-proc", "no-children-files"])
def test_every_road_of_children_gives_psutils_answer(procs: Procs,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     road: str) -> None:
    # children() takes the table through BPF where it runs, else the children
    # files of the tree (the table again where the kernel has none): each road
    # gives psutil's answer, order included.
    if road == "no-children-files":
        monkeypatch.setenv(proctable._pidfd.DISABLE_ENV, "proc_children")
        road = "walk"
    monkeypatch.setattr(compat._process, "_children_road", road)
    spec = _odd_specimens(procs)
    spec.pop("kthread", None)  # its children come and go
    for ps in (psutil, compat):
        _fresh(ps)
    a = script.observe_children(psutil, spec)
    b = script.observe_children(compat, spec)
    assert script.differences(a, b, MOVING) == []
    assert len(a["tree"]["children(recursive)"]) == 4


def _as_nobody(hidepid: int, spec: dict[str, int]) -> Any:
    from .test_table_truth import NOBODY, _fork_answer, _private_proc

    def run() -> Any:
        if hidepid:
            _private_proc(hidepid)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        own = subprocess.Popen(["sleep", "600"])
        zombie = subprocess.Popen(["true"])
        try:
            wait_until(lambda: exec_done(own.pid))
            # exited, not reaped (hidepid=1 may deny even our own zombie's stat line)
            os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)
            mine = {**spec, "own_sleep": own.pid, "zombie_own": zombie.pid}
            listed = set(compat.pids())
            return (_compare(mine), spec["sleep"] in listed)
        finally:
            own.kill()
            own.wait()
            zombie.wait()

    return _fork_answer(run, timeout=120)


@needs_root
@pytest.mark.parametrize("hidepid", [2, *([0, 1] if SLOW else [])])
def test_another_users_processes_give_the_same_answers(procs: Procs, tmp_path: pathlib.Path,
                                                       fds: list[int],  # noqa: F811
                                                       hidepid: int) -> None:
    # uid 65534 looks at root's processes: denied files, denied signals, and under
    # hidepid=2 processes that do not exist for it (psutil: NoSuchProcess).
    spec = {**_specimens(procs, tmp_path, fds), **_odd_specimens(procs)}
    differences, listed = _as_nobody(hidepid, spec)
    assert differences == []
    assert listed is (hidepid != 2)  # the case was the one asked for


# --- the exceptions -------------------------------------------------------------------


def test_exceptions_have_psutils_names_attributes_and_fit_proctables_tree() -> None:
    for name in ("Error", "NoSuchProcess", "ZombieProcess", "AccessDenied", "TimeoutExpired"):
        assert hasattr(compat, name) and issubclass(getattr(compat, name), compat.Error)
    e = compat.NoSuchProcess(123, "name", "gone")
    assert (e.pid, e.name, e.msg) == (123, "name", "gone")
    assert isinstance(e, proctable.NoSuchProcess) and isinstance(e, ProcessLookupError)
    z = compat.ZombieProcess(5, "z", 1)
    assert (z.pid, z.name, z.ppid) == (5, "z", 1) and isinstance(z, compat.NoSuchProcess)
    d = compat.AccessDenied(7)
    assert (d.pid, d.name) == (7, None)
    assert isinstance(d, proctable.AccessDenied) and isinstance(d, PermissionError)
    t = compat.TimeoutExpired(1.5, 9, "x")
    assert (t.seconds, t.pid, t.name) == (1.5, 9, "x") and isinstance(t, TimeoutError)
    assert isinstance(compat.Error(), proctable.ProctableError)
    for exc in (e, z, d, t):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and vars(back) == vars(exc)
        assert str(exc.pid) in str(exc) and str(exc.pid) in repr(exc)
    # psutil's constructors take the same arguments, and give the same attributes
    for cls, args in (("NoSuchProcess", (123, "n", "m")), ("ZombieProcess", (5, "z", 1, "m")),
                      ("AccessDenied", (7, "n", "m")), ("TimeoutExpired", (1.5, 9, "x"))):
        theirs, mine = getattr(psutil, cls)(*args), getattr(compat, cls)(*args)
        for attr in ("pid", "name", "ppid", "seconds"):
            assert getattr(theirs, attr, None) == getattr(mine, attr, None), (cls, attr)


def test_code_that_catches_psutils_names_catches_ours(procs: Procs) -> None:
    p = procs.popen(["true"])
    p.wait(timeout=10)
    for ps in (psutil, compat):
        with pytest.raises(ps.NoSuchProcess):
            ps.Process(p.pid)
    with pytest.raises(proctable.NoSuchProcess) as e:  # proctable's own name catches it too
        compat.Process(p.pid)
    assert e.value.pid == p.pid and isinstance(e.value, ProcessLookupError)


# --- where compat differs on purpose ---------------------------------------------------


def test_a_thread_id_is_no_process(procs: Procs) -> None:
    # psutil's pid_exists() says False for a thread id, but its Process() takes one
    # and answers for the thread; compat says NoSuchProcess, as its pid_exists().
    started = threading.Event()
    stop = threading.Event()
    tids: list[int] = []

    def body() -> None:
        tids.append(threading.get_native_id())
        started.set()
        stop.wait(30)

    t = threading.Thread(target=body)
    t.start()
    try:
        started.wait(10)
        tid = tids[0]
        assert psutil.pid_exists(tid) is False and compat.pid_exists(tid) is False
        assert tid not in compat.pids() and tid not in psutil.pids()
        assert psutil.Process(tid).pid == tid  # psutil: the thread, as a process
        with pytest.raises(compat.NoSuchProcess):
            compat.Process(tid)
    finally:
        stop.set()
        t.join()


def test_wait_of_a_zombie_that_is_not_ours_gives_its_exit_code(procs: Procs) -> None:
    nz = procs.py(NOT_OURS, stdout=subprocess.PIPE)
    assert nz.stdout is not None
    pid = int(nz.stdout.readline())
    wait_zombie(pid)
    # psutil waits for its parent to reap it, then says None: here it times out
    with pytest.raises(psutil.TimeoutExpired):
        psutil.Process(pid).wait(timeout=0.2)
    p = compat.Process(pid)
    t0 = time.monotonic()
    assert p.wait(timeout=5) == 9
    assert time.monotonic() - t0 < 1.0
    assert proctable.read(pid) is not None  # not reaped: it is its parent's
    gone, alive = compat.wait_procs([compat.Process(pid)], timeout=5)
    assert [g.returncode for g in gone] == [9] and alive == []


@pytest.mark.parametrize("module", ["psutil", "compat"])
def test_wait_of_our_child_reaps_it_and_gives_its_code(procs: Procs, module: str) -> None:
    ps = psutil if module == "psutil" else compat
    code = procs.popen([PY, "-c", "import sys; sys.exit(3)"])
    killed = procs.popen(["sleep", "600"])
    running = procs.popen(["sleep", "600"])
    pc, pk, pr = ps.Process(code.pid), ps.Process(killed.pid), ps.Process(running.pid)
    with pytest.raises(ps.TimeoutExpired) as e:
        pr.wait(timeout=0.05)
    assert (e.value.seconds, e.value.pid) == (0.05, running.pid)
    assert pc.wait(timeout=10) == 3
    pk.terminate()
    got = pk.wait(timeout=10)
    assert got == -signal.SIGTERM and type(got).__name__ == "Negsignal"
    assert pk.wait() == got  # kept, as psutil keeps it
    for p in (code, killed):
        with pytest.raises(ChildProcessError):
            os.waitpid(p.pid, os.WNOHANG)  # reaped by wait()
        p.returncode = 0  # (for the Procs cleanup: reaped already)


@pytest.mark.parametrize("module", ["psutil", "compat"])
def test_wait_procs_of_exiting_children(procs: Procs, module: str) -> None:
    ps = psutil if module == "psutil" else compat
    kids = [procs.popen([PY, "-c", f"import sys, time; time.sleep({i / 20}); sys.exit({i})"])
            for i in range(5)]
    stay = procs.popen(["sleep", "600"])
    seen: list[int] = []
    # returns as soon as all have exited (the bound is only a safety net)
    gone, alive = ps.wait_procs([ps.Process(k.pid) for k in kids], timeout=60,
                                callback=lambda p: seen.append(p.pid))
    assert sorted(p.returncode for p in gone) == [0, 1, 2, 3, 4] and alive == []
    assert sorted(seen) == sorted(k.pid for k in kids)
    for k in kids:
        k.returncode = 0  # reaped by wait_procs
    gone, alive = ps.wait_procs([ps.Process(stay.pid)], timeout=0.05)
    assert gone == [] and [p.pid for p in alive] == [stay.pid]
    with pytest.raises(ValueError):
        ps.wait_procs([], timeout=-1)
    with pytest.raises(TypeError):
        ps.wait_procs([], callback=1)


def test_a_reaped_process_is_not_running_and_is_not_signalled(procs: Procs) -> None:
    p = procs.popen(["sleep", "600"])
    wait_until(lambda: exec_done(p.pid))
    mine = compat.Process(p.pid)
    assert mine.is_running()
    p.kill()
    p.wait(timeout=10)
    assert not mine.is_running()
    with pytest.raises(compat.NoSuchProcess):
        mine.send_signal(signal.SIGTERM)
    with pytest.raises(compat.NoSuchProcess):
        mine.name()
    assert mine.wait(timeout=1) is None


REUSE = textwrap.dedent(r"""
    import json, os, signal, sys, time
    import psutil
    import proctable.compat as compat

    def set_next(pid):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))

    def fork_idle():
        pid = os.fork()
        if pid == 0:
            try:
                while True:
                    signal.pause()
            finally:
                os._exit(0)
        return pid

    def kill_reap(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)

    def alive(pid):
        return os.waitpid(pid, os.WNOHANG) == (0, 0)

    for attempt in range(1, 301):
        old = fork_idle()
        mine, theirs = compat.Process(old), psutil.Process(old)
        kill_reap(old)
        set_next(old)
        new = fork_idle()
        if new == old and mine._start == compat.Process(new)._start:
            break
        kill_reap(new)
    else:
        raise SystemExit("no same-tick reuse in 300 attempts")
    out = {"attempts": attempt, "handle": mine._handle is not None,
           "psutil_is_running": theirs.is_running(), "is_running": mine.is_running()}
    for what in ("name", "ppid", "cmdline", "uids", "kill"):
        try:
            getattr(mine, what)()
            out[what] = "answered"
        except compat.NoSuchProcess:
            out[what] = "NoSuchProcess"
    out["wait"] = mine.wait(timeout=0.1)
    out["new_alive"] = alive(new)
    kill_reap(new)
    print(json.dumps(out))
""")


@needs_root
def test_a_pid_reused_within_one_tick_is_not_the_process() -> None:
    # The old process died and its pid went to a new one within the same clock
    # tick: (pid, start time) are equal, only the pidfs handle tells them apart.
    # psutil takes the new process for the old one; compat does not, and never
    # signals it.
    r = run_in_pid_namespace(REUSE, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if not out["handle"]:
        pytest.skip("no pidfs handle here (Linux < 6.9): same-tick reuse cannot be seen")
    assert out["psutil_is_running"] is True  # psutil's documented limit
    assert out["is_running"] is False
    assert {out[k] for k in ("name", "ppid", "cmdline", "uids", "kill")} == {"NoSuchProcess"}
    assert out["wait"] is None and out["new_alive"] is True


# --- speed where it matters: the tree is read once -------------------------------------


def test_children_recursive_reads_the_table_once(procs: Procs,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    tree = procs.popen(["sh", "-c", "sleep 600 & sh -c 'sleep 600 & wait' & wait"])
    wait_until(lambda: len(proctable.snapshot().descendants(tree.pid)) == 3)
    reads: list[int] = []
    real = proctable.compat._process.snapshot

    def counting(*a: Any, **kw: Any) -> Any:
        reads.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(proctable.compat._process, "snapshot", counting)
    kids = compat.Process(tree.pid).children(recursive=True)
    assert len(reads) == 1
    assert [k.pid for k in kids] == [k.pid for k in psutil.Process(tree.pid).children(True)]


def test_process_iter_yields_processes_with_psutils_methods(procs: Procs) -> None:
    p = procs.popen(["sleep", "600"])
    wait_until(lambda: exec_done(p.pid))
    (mine,) = [x for x in compat.process_iter(["name"]) if x.pid == p.pid]
    assert mine.info == {"name": "sleep"} and mine.name() == "sleep"
    assert mine == compat.Process(p.pid) and hash(mine) == hash(psutil.Process(p.pid))
    mine.kill()
    assert p.wait(timeout=10) == -signal.SIGKILL


def test_cpu_percent_keeps_its_baseline_across_process_iter_calls(procs: Procs) -> None:
    # psutil hands the same Process out again, so cpu_percent() of the next
    # iteration measures since the last one; compat carries the baseline over.
    busy = procs.py("while True: pass")
    wait_until(lambda: exec_done(busy.pid))
    (first,) = [x for x in compat.process_iter(["cpu_percent", "cpu_times"])
                if x.pid == busy.pid]
    assert first.info["cpu_percent"] == 0.0
    used = sum(first.info["cpu_times"][:2])
    wait_until(lambda: sum(psutil.Process(busy.pid).cpu_times()[:2]) > used + 0.02, timeout=60)
    (again,) = [x for x in compat.process_iter(["cpu_percent"]) if x.pid == busy.pid]
    assert again.info["cpu_percent"] > 0.0
    compat.process_iter.cache_clear()
    (fresh,) = [x for x in compat.process_iter(["cpu_percent"]) if x.pid == busy.pid]
    assert fresh.info["cpu_percent"] == 0.0  # as psutil's first call


def test_process_iter_takes_psutils_meaning_of_attrs(procs: Procs) -> None:
    p = procs.popen(["sleep", "600"])
    wait_until(lambda: exec_done(p.pid))
    # None: no attribute read (psutil's objects have no info then), every method works
    (bare,) = [x for x in compat.process_iter() if x.pid == p.pid]
    assert bare.info == {"pid": p.pid} and bare.cmdline() == ["sleep", "600"]
    # []: every attribute as_dict() offers
    (full,) = [x for x in compat.process_iter([]) if x.pid == p.pid]
    assert list(full.info) == list(compat.AS_DICT_ATTRS)
    # proctable.process_iter keeps its own: None and [] give the table pass's OFFERED
    (own,) = [x for x in proctable.process_iter() if x.pid == p.pid]
    assert list(own.info) == list(compat.OFFERED)
