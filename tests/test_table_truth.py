"""The table against readers proctable did not write: /proc/<pid>/status, statm, ps, psutil.

Each test is a case an outside review found wrong: uid 0 for a daemon that
dropped root, an rss that matches no other tool, a hidden pid that lost the
whole table, a stopped process that terminate() could not let handle SIGTERM.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from typing import Any, Callable

import pytest

import proctable

from ._reliability import linux_only
from .conftest import Procs, needs_root, run_as_nobody, wait_until, wait_zombie

pytestmark = linux_only

NOBODY = 65534
PAGE = os.sysconf("SC_PAGE_SIZE")


def status_field(pid: int, name: str) -> list[int]:
    """The numbers of one line of /proc/<pid>/status (e.g. Uid: real eff saved fs)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return [int(x) for x in line.split()[1:] if x.isdigit()]
    raise AssertionError(f"no {name} line for pid {pid}")


def statm(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/statm") as f:
        size, resident = f.read().split()[:2]
    return int(size), int(resident)


# --- uid: the owner of the directory, not of the files -------------------------------


def _dropper(procs: Procs, after: str = "") -> tuple[subprocess.Popen[bytes], Callable[[], None]]:
    """A root process that forks a child, which drops to uid 65534 with setuid()
    WITHOUT exec (nginx workers, sshd's privsep children do this): non-dumpable.
    Returns the Popen (its stdout says the child's pid) and a function that tells
    the child to drop."""
    code = (
        "import os, sys, time\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.read(r, 1)\n"
        "    os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        f"    {after or 'pass'}\n"
        "    sys.stdout.write('dropped\\n'); sys.stdout.flush()\n"
        "    time.sleep(300); os._exit(0)\n"
        "sys.stdout.write(f'{pid}\\n'); sys.stdout.flush()\n"
        "sys.stdin.readline(); os.write(w, b'x')\n"
        "os.waitpid(pid, 0)\n"
    )
    p = procs.py(code, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdin is not None

    def drop() -> None:
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(b"go\n")
        p.stdin.flush()
        assert p.stdout.readline() == b"dropped\n"

    return p, drop


def _child_of(p: subprocess.Popen[bytes]) -> int:
    assert p.stdout is not None
    return int(p.stdout.readline())


@needs_root
def test_uid_of_a_daemon_that_dropped_root_without_exec(procs: Procs) -> None:
    p, drop = _dropper(procs)
    child = _child_of(p)
    try:
        with proctable.Scanner() as scanner:
            before = scanner.refresh().get(child)
            assert before is not None and before.uid == 0
            drop()
            # The kernel's own answer, as ps and psutil read it.
            assert status_field(child, "Uid")[1] == NOBODY
            # The files inside /proc/<pid> say root now: that is the bug we must not copy.
            assert os.stat(f"/proc/{child}/stat").st_uid == 0
            row = proctable.read(child)
            assert row is not None and row.uid == NOBODY
            snap = proctable.snapshot().get(child)
            assert snap is not None and snap.uid == NOBODY
            # A Scanner that opened the fds while it was root sees the change too.
            again = scanner.refresh().get(child)
            assert again is not None and again.uid == NOBODY
            assert proctable.read(child, memory=False).uid == NOBODY  # type: ignore[union-attr]
    finally:
        os.kill(child, signal.SIGKILL)


@needs_root
def test_zombie_uid_is_its_own_and_masked_stays_masked(procs: Procs) -> None:
    # A uid-65534 process that exits 3 and is left unreaped by its root parent.
    code = (
        "import os, sys, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setgroups([]); os.setgid(65534); os.setuid(65534); os._exit(3)\n"
        "sys.stdout.write(f'{pid}\\n'); sys.stdout.flush(); time.sleep(300)\n"
    )
    p = procs.py(code, stdout=subprocess.PIPE)
    child = _child_of(p)
    z = wait_zombie(child)
    assert z.uid == NOBODY  # the directory's owner, not root's for a process without an mm
    assert z.exit is not None and z.exit.code == 3  # we are root: field 52 is visible
    snap = proctable.snapshot().get(child)
    assert snap is not None and snap.uid == NOBODY and snap.exit == z.exit


# --- rss: the exact figure --------------------------------------------------------------


def test_rss_of_idle_sleeps_matches_statm(procs: Procs) -> None:
    sleeps = [procs.popen(["sleep", "60"]) for _ in range(20)]
    pids = {p.pid for p in sleeps}
    # Exec'd and asleep: a sleep that still runs (state R) is still mapping pages.
    wait_until(lambda: all((r := proctable.read(pid)) is not None and r.name == "sleep"
                           and r.state == "S" for pid in pids))
    table = proctable.snapshot()
    with proctable.Scanner() as scanner:
        scanned = scanner.refresh()
    for pid in pids:
        size, resident = statm(pid)
        for row in (table.get(pid), scanned.get(pid), proctable.read(pid)):
            assert row is not None and row.rss is not None and row.vms is not None
            assert abs(row.rss // PAGE - resident) <= 2, (pid, row.rss // PAGE, resident)
            assert row.vms // PAGE == size
            # status's VmRSS is the same sum, in kB.
            assert abs(row.rss // 1024 - status_field(pid, "VmRSS")[0]) <= 2 * PAGE // 1024


def test_rss_of_a_64_mib_process_within_one_percent(procs: Procs) -> None:
    code = ("import sys, time\n"
            "b = bytearray(64 << 20)\n"
            "for i in range(0, len(b), 4096): b[i] = 1\n"
            "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)\n")
    p = procs.py(code, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    _, resident = statm(p.pid)
    row = proctable.read(p.pid)
    assert row is not None and row.rss is not None
    assert row.rss >= 64 << 20
    assert abs(row.rss - resident * PAGE) <= 0.01 * resident * PAGE
    # ps, a reader we did not write, in KiB.
    out = subprocess.run(["ps", "-o", "rss=", "-p", str(p.pid)], check=False, capture_output=True,
                         text=True, timeout=30)
    if out.returncode == 0 and out.stdout.strip():
        assert abs(row.rss // 1024 - int(out.stdout)) <= 0.01 * int(out.stdout)
    psutil = pytest.importorskip("psutil")
    assert abs(row.rss - psutil.Process(p.pid).memory_info().rss) <= 0.01 * row.rss


def test_memory_false_leaves_memory_out_and_nothing_else() -> None:
    me = os.getpid()
    full, lean = proctable.read(me), proctable.read(me, memory=False)
    assert full is not None and lean is not None
    assert full.rss is not None and full.vms is not None
    assert lean.rss is None and lean.vms is None
    assert (lean.pid, lean.start_time, lean.uid, lean.name) == (
        full.pid, full.start_time, full.uid, full.name)
    row = proctable.snapshot(memory=False).get(me)
    assert row is not None and row.rss is None and row.uid == os.geteuid()
    with proctable.Scanner(memory=False) as s:
        r = s.refresh().get(me)
        assert r is not None and r.rss is None
    with pytest.raises(TypeError):
        proctable.snapshot(memory=1)  # type: ignore[arg-type]


# --- hidepid: one hidden pid must not lose the table -----------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18


def _private_proc(hidepid: int) -> None:
    """In a forked child: a mount namespace of its own with /proc mounted hidepid=N."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    opts = f"hidepid={hidepid}".encode()
    if _libc.mount(b"proc", b"/proc", b"proc", 0, opts) != 0:
        raise OSError(ctypes.get_errno(), f"mount -t proc -o {opts.decode()}")


def _as_nobody_with_hidepid(hidepid: int, body: Callable[[], Any]) -> Any:
    def run() -> Any:
        _private_proc(hidepid)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        return body()

    # run_as_nobody drops after run() would: do it ourselves, in its forked child.
    return _fork_answer(run)


def _fork_answer(fn: Callable[[], Any], timeout: float = 30.0) -> Any:
    import ast
    import select

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            result = ("ok", fn())
        except BaseException as exc:
            import traceback
            result = ("error", repr(exc) + "\n" + traceback.format_exc())
        os.write(w, repr(result).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail("the child did not answer in time")
            if not select.select([r], [], [], left)[0]:
                continue
            data = os.read(r, 65536)
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(r)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
    kind, value = ast.literal_eval(b"".join(chunks).decode())
    if kind == "error":
        pytest.fail(f"the child raised {value}")
    return value


@needs_root
@pytest.mark.parametrize("hidepid", [1, 2])
def test_hidepid_as_nobody_keeps_the_table(procs: Procs, hidepid: int) -> None:
    root_sleeper = procs.popen(["sleep", "60"])

    def body() -> Any:
        own = subprocess.Popen(["sleep", "30"])
        try:
            # Forked by a process that setuid()'d without exec, the child is
            # non-dumpable (so hidden, under hidepid) until its exec of sleep:
            # wait, bounded, until the kernel shows it to its owner.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    r = proctable.read(own.pid)
                except proctable.AccessDenied:
                    r = None  # not yet
                if r is not None and r.name == "sleep" and r.uid == NOBODY:
                    break
                time.sleep(0.005)
            table = proctable.snapshot()
            with proctable.Scanner() as s:
                s.refresh()
                scanned = s.refresh()
            try:
                other: Any = proctable.read(root_sleeper.pid)
                other = "none" if other is None else "row"
            except proctable.AccessDenied as e:
                other = ("denied", isinstance(e, PermissionError), e.pid)
            mine = table.get(own.pid)
            return {
                "rows": len(table),
                "mine": None if mine is None else (mine.uid, mine.rss is not None),
                "me": table.get(os.getpid()) is not None,
                "denied": sorted(d.pid for d in table.denied),
                "denied_uids": sorted({d.uid for d in table.denied}, key=str),
                "scanned_denied": sorted(d.pid for d in scanned.denied),
                "scanned_mine": scanned.get(own.pid) is not None,
                "other": other,
                "in_table": root_sleeper.pid in table,
            }
        finally:
            own.kill()
            own.wait()

    got = _as_nobody_with_hidepid(hidepid, body)
    assert got["me"] and got["mine"] == (NOBODY, True) and got["scanned_mine"]
    assert not got["in_table"]
    if hidepid == 1:
        # Listed but unreadable: not a row, but named, with its owner (root).
        assert root_sleeper.pid in got["denied"]
        assert root_sleeper.pid in got["scanned_denied"]
        assert 0 in got["denied_uids"]
        assert got["other"] == ("denied", True, root_sleeper.pid)
    else:
        # Invisible: the kernel does not even list it to this user; but a
        # process holds the pid, so read() says denied, not "none".
        assert got["denied"] == [] and got["scanned_denied"] == []
        assert got["other"] == ("denied", True, root_sleeper.pid)


# --- terminate() of a stopped process --------------------------------------------------


def test_terminate_lets_a_stopped_process_handle_sigterm(procs: Procs) -> None:
    code = ("import signal, sys, os, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: os._exit(42))\n"
            "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
            "while True: time.sleep(1)\n")
    p = procs.py(code, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    os.kill(p.pid, signal.SIGSTOP)
    wait_until(lambda: (r := proctable.read(p.pid)) is not None and r.state == "T")
    t0 = time.monotonic()
    status = proctable.terminate(p, grace=10.0, kill_timeout=5.0)
    assert status is not None and status.code == 42, status
    assert time.monotonic() - t0 < 10.0  # the handler ran, not SIGKILL after the grace


# --- membership means identity ----------------------------------------------------------


def test_a_live_process_is_in_a_later_table_whatever_its_counters(procs: Procs) -> None:
    busy = procs.py("import time\nt = time.time() + 60\nwhile time.time() < t: pass\n")
    first = wait_until(lambda: proctable.read(busy.pid))
    assert isinstance(first, proctable.Proc)
    wait_until(lambda: (r := proctable.read(busy.pid)) is not None and r != first)
    later = proctable.snapshot()
    assert first in later and first.identity in later and busy.pid in later
    assert later.get(busy.pid) != first  # the counters moved on
    assert first.same_process(later.get(busy.pid))  # type: ignore[arg-type]
    busy.kill()
    busy.wait()
    assert first not in proctable.snapshot()


def test_identities_carry_the_pidfs_handle() -> None:
    from proctable.table import _has_pidfs

    row = proctable.read(os.getpid())
    assert row is not None
    ident = row.identity
    assert ident == proctable.identity(os.getpid())
    if _has_pidfs():
        assert isinstance(ident.handle, int)
    else:
        assert ident.handle is None


def test_rows_are_values() -> None:
    import pickle

    row = proctable.read(os.getpid())
    assert row is not None
    assert pickle.loads(pickle.dumps(row)) == row
    assert hash(pickle.loads(pickle.dumps(row))) == hash(row)
    assert row != proctable.read(1) and row != object()
    with pytest.raises(AttributeError):
        row.pid = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        row.anything = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        proctable.Proc((1, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        proctable.Proc((1,) * 14 + (b"SS", b"x"))  # type: ignore[arg-type]


@needs_root
def test_unprivileged_read_of_a_root_process_is_honest(procs: Procs) -> None:
    root = procs.popen(["sleep", "60"])

    def body() -> Any:
        r = proctable.read(root.pid)
        return None if r is None else (r.uid, r.rss is not None, r.exit)

    kind, value = run_as_nobody(body)  # type: ignore[misc]
    assert kind == "ok"
    assert value == (0, True, None)



def test_kernel_threads_are_flagged_as_the_kernel_says() -> None:
    table = proctable.snapshot()
    me = table.get(os.getpid())
    assert me is not None and not me.kernel_thread
    kthreads = [p for p in table if p.kernel_thread]
    kthreadd = table.get(2)
    if kthreadd is None or kthreadd.name != "kthreadd":
        pytest.skip("no kthreadd in this pid namespace (a container)")
    assert kthreadd.kernel_thread
    # Outside reader: a kernel thread has no user space, so an empty cmdline and
    # no memory; every child of kthreadd is one.
    for p in kthreads:
        try:
            with open(f"/proc/{p.pid}/cmdline", "rb") as f:
                assert f.read() == b"", p
        except FileNotFoundError:
            continue  # it ended meanwhile
        assert p.rss in (0, None), p
    assert {p.pid for p in table if p.ppid == 2} <= {p.pid for p in kthreads}


# --- hidepid=2: hidden is not gone ---------------------------------------------------

def _fork_nondumpable(before: Callable[[int], Any]) -> tuple[int, Any]:
    """Fork a child that, once before(pid) returned, makes itself non-dumpable
    (PR_SET_DUMPABLE 0, as ssh-agent and gpg-agent do) and then sleeps. Returns
    (its pid, what before returned) once it did. The caller kills and reaps it."""
    r, w = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.close(w2)
            os.read(r2, 1)
            _libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
            os.write(w, b"k")
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(w)
    os.close(r2)
    try:
        seen = before(pid)
        os.write(w2, b"g")
        assert os.read(r, 1) == b"k"
    finally:
        os.close(r)
        os.close(w2)
    return pid, seen


@needs_root
def test_hidepid2_own_nondumpable_child_is_denied_not_gone() -> None:
    """Under hidepid=2 the kernel hides a non-dumpable process even from its
    owner (ENOENT, as for a pid nobody holds); kill(pid, 0) still succeeds. A
    live child must be AccessDenied there, never None / GONE, and its
    Identity (with its handle) stays alive; once reaped, it is gone."""

    def body() -> Any:
        out: dict[str, Any] = {}
        # Our setuid() made us non-dumpable, and a fork inherits that: become
        # dumpable, so that the child is visible until it drops it itself.
        _libc.prctl(4, 1, 0, 0, 0)
        child, ident = _fork_nondumpable(proctable.identity)
        try:
            os.kill(child, 0)  # the kernel says a process holds the pid

            def outcome(fn: Callable[[], Any]) -> Any:
                try:
                    v = fn()
                except proctable.AccessDenied as e:
                    return ("denied", e.pid)
                return ("value", repr(v))

            out["read"] = outcome(lambda: proctable.read(child))
            out["probe"] = outcome(lambda: proctable.exit_probe(child).state)
            out["identity"] = outcome(lambda: proctable.identity(child))
            out["handle"] = ident is not None and ident.handle is not None
            out["alive"] = outcome(ident.alive) if ident else None
        finally:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        out["after"] = repr(proctable.read(child))
        out["after_probe"] = str(proctable.exit_probe(child).state)
        out["pid"] = child
        return out

    got = _as_nobody_with_hidepid(2, body)
    pid = got["pid"]
    assert got["read"] == ("denied", pid)
    assert got["probe"] == ("denied", pid)
    assert got["identity"] == ("denied", pid)
    if got["handle"]:
        # With a pidfs handle the pidfd answers exactly, /proc or not.
        assert got["alive"] == ("value", "True")
    else:
        assert got["alive"] == ("denied", pid)
    assert got["after"] == "None" and got["after_probe"] == "gone"


@needs_root
def test_hidepid1_scanner_denies_a_process_that_turned_nondumpable() -> None:
    """A Scanner opened our child's fds while it was readable; the child then
    turns non-dumpable, which hidepid=1 denies us. The kept fds skip that check:
    the refresh must re-check, and list it in denied as snapshot() does."""

    def body() -> Any:
        _libc.prctl(4, 1, 0, 0, 0)  # dumpable again after our setuid (see above)
        with proctable.Scanner(reader="proc") as scanner:
            child, seen = _fork_nondumpable(lambda pid: scanner.refresh().get(pid) is not None)
            try:
                t = scanner.refresh()
                again = scanner.refresh()
                sn = proctable.snapshot(reader="proc")
                return {
                    "seen": seen,
                    "row": t.get(child) is not None or again.get(child) is not None,
                    "denied": [child in {d.pid for d in x.denied} for x in (t, again, sn)],
                    "in_snapshot": sn.get(child) is not None,
                }
            finally:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)

    got = _as_nobody_with_hidepid(1, body)
    assert got == {"seen": True, "row": False, "denied": [True, True, True],
                   "in_snapshot": False}, got
