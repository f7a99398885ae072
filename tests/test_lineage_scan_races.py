"""Scan mode with the proc connector, in the initial pid namespace, against races.

1. A pid of the lineage reused at once (``clone3(set_tid)``): a member L that
   leads a group (or a session) is SIGKILLed and reaped by the root, and an
   unrelated process X is made with L's old pid, makes a group (or session) of
   that number, forks Y and exits. Y is neither a child of a member nor in a
   group proven to be L's: it must never be claimed (nor signalled). Before the
   fix, L's exit event was dropped by the socket filter when L exited before the
   filter named it, so the hub kept following L's pid and took X's fork of Y for
   L's.
2. Without pidfds (``PROCTABLE_DISABLE=pidfd``): a scan-mode spawn whose command
   (a shell) has exited before the lineage pinned it, after a ``nohup ... &``:
   the fork event must still be known as the shell's (its kept stat fd proves it
   unreaped), and the escape recorded.

These need root (clone3 with set_tid, the proc connector) and are skipped where
the proc connector gives no events here.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest

import proctable
from proctable.lineage import _engine, _procconn

from ._lineage import Tracker, kill_identity, read_line
from ._reliability import SLOW
from .conftest import build_c, is_root, wait_zombie

needs_root = pytest.mark.skipif(not is_root(), reason="needs root (clone3 set_tid, proc events)")

ATTEMPTS = 150 if SLOW else 50  # reuses tried (each a chance for a false claim)

# The root: N times, fork L leading a group (or a session), let it live a varied
# while (0-60 ms: the interleavings differ), SIGKILL and reap it, and write L's pid
# to the reuser at once (fd argv[3]: no Python between L's reap and the reuse).
ROOT_C = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/wait.h>
int main(int argc, char **argv) {
    int n = atoi(argv[1]), sess = argv[2][0] == 's', out = atoi(argv[3]);
    srand(getpid());
    for (int i = 0; i < n; i++) {
        pid_t l = fork();
        if (l == 0) {
            if (sess) setsid(); else setpgid(0, 0);
            for (;;) pause();
        }
        if (!sess) setpgid(l, l);
        usleep(rand() % 60000);
        kill(l, SIGKILL);
        waitpid(l, 0, 0);
        dprintf(out, "%d\n", (int)l);
        usleep(20000 + rand() % 40000);
    }
    close(out);
    for (;;) pause();
}
"""

# The unrelated one: per pid G read from stdin, clone3(set_tid=G) a process X that
# makes a group (or session) G, forks Y (which waits to be killed) and exits.
# Prints "G X Y" (X is -1 where the pid could not be had).
REUSER_C = r"""
#define _GNU_SOURCE
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int sess = argv[1][0] == 's';
    char line[64];
    setvbuf(stdout, 0, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        pid_t g = atoi(line), y = -1;
        int p[2];
        if (pipe(p) != 0) return 1;
        pid_t tid[1] = { g };
        struct clone_args ca;
        memset(&ca, 0, sizeof ca);
        ca.exit_signal = SIGCHLD;
        ca.set_tid = (uint64_t)(uintptr_t)tid;
        ca.set_tid_size = 1;
        long x = syscall(SYS_clone3, &ca, sizeof ca);
        if (x == 0) {
            if (sess) setsid(); else setpgid(0, 0);
            pid_t k = fork();
            if (k == 0) {
                close(p[0]); close(p[1]);
                if (sess) setpgid(0, 0);
                for (;;) pause();
            }
            write(p[1], &k, sizeof k);
            _exit(0);
        }
        close(p[1]);
        if (x > 0) { read(p[0], &y, sizeof y); waitpid(x, 0, 0); }
        close(p[0]);
        printf("%d %ld %d\n", (int)g, x, (int)y);
    }
    return 0;
}
"""




def _events_or_skip(lin: proctable.Lineage) -> None:
    if lin._engine.sub is None:
        pytest.skip("no proc-connector events here")



@needs_root
@pytest.mark.parametrize("kind", ["group", "session"])
def test_reused_pid_of_a_leader_gives_no_claim_on_its_forks(tmp_path: Path, kind: str,
                                                            track: Tracker) -> None:
    root_bin = build_c(tmp_path, "root", ROOT_C)
    reuser_bin = build_c(tmp_path, "reuser", REUSER_C)
    arg = "s" if kind == "session" else "g"
    r, w = os.pipe()
    try:
        reuser = subprocess.Popen([reuser_bin, arg], stdin=r, stdout=subprocess.PIPE)
        root = subprocess.Popen([root_bin, str(ATTEMPTS), arg, str(w)], pass_fds=(w,))
    finally:
        os.close(r)
        os.close(w)
    assert reuser.stdout is not None
    ys: list[proctable.Identity] = []
    stop = threading.Event()
    claimed: set[tuple[int, int]] = set()
    errors: list[BaseException] = []
    try:
        lin = track.attach(root)
        _events_or_skip(lin)

        def looper() -> None:  # members() looks in full, over and over: many chances
            try:
                while not stop.is_set():
                    claimed.update((p.pid, p.start_time) for p in lin.members())
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        t = threading.Thread(target=looper, daemon=True)
        t.start()
        reused = 0
        for _ in range(ATTEMPTS):
            g, x, y = map(int, read_line(reuser.stdout, 60.0).split())
            if x == g and y > 0:
                reused += 1
                ident = proctable.identity(y)
                if ident is not None:
                    ys.append(ident)
        stop.set()
        t.join(timeout=30.0)
        assert not t.is_alive() and not errors, errors
        claimed.update((p.pid, p.start_time) for p in lin.members())
        suspects = {s.pid for s in lin.suspects()}
        report = lin.terminate(grace=1.0, kill_timeout=5.0)
        # Nearly every attempt got the pid (another process may take it first).
        assert reused >= ATTEMPTS // 2, f"only {reused} of {ATTEMPTS} pids reused"
        wrong = [y for y in ys if (y.pid, y.start_time) in claimed]
        assert not wrong, f"unrelated processes claimed: {wrong} (report: {report})"
        reported = {m.pid for m in report.members}
        killed = [y for y in ys if not y.alive()]
        assert not killed, f"unrelated processes killed by teardown: {killed} ({reported})"
        # Each Y is a suspect (seen in a group a member led, unproven) or not
        # claimed at all (seen with the number free): never anything else.
        assert not suspects - {y.pid for y in ys}, suspects
    finally:
        stop.set()
        for y in ys:
            kill_identity(y)
        for p in (root, reuser):
            if p.returncode is None:
                p.kill()
                p.wait(timeout=10)
            if p.stdout is not None:
                p.stdout.close()


@needs_root
def test_track_never_puts_back_a_pid_whose_exit_is_not_taken(tmp_path: Path) -> None:
    # The lineage's list of live members may predate an exit the hub just read:
    # were the pid tracked again, the forks of the process that gets the pid next
    # would be handed over as the member's. The reuse is made for real.
    from proctable.lineage import _hub

    reuser_bin = build_c(tmp_path, "reuser", REUSER_C)
    sub = _hub.subscribe(lambda: None, True)
    if sub is None:
        pytest.skip("no proc-connector events here")
    y: Optional[proctable.Identity] = None
    try:
        member = subprocess.Popen(["sleep", "300"])
        sub.track({member.pid})
        member.kill()
        member.wait(timeout=10)  # reaped: the pid is free
        sub.sync()  # its exit is read (handed to the lineage, not taken yet)
        sub.track({member.pid})  # the lineage's stale list
        assert member.pid not in sub.tracked
        reuser = subprocess.Popen([reuser_bin, "g"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
        assert reuser.stdin is not None and reuser.stdout is not None
        reuser.stdin.write(f"{member.pid}\n".encode())
        reuser.stdin.close()  # one pid: it exits after it (Y keeps the pipe: read a line)
        g, x, ypid = map(int, read_line(reuser.stdout, 30.0).split())
        reuser.wait(timeout=30)
        reuser.stdout.close()
        if ypid > 0:
            y = proctable.identity(ypid)
        sub.sync()
        taken = sub.take()
        assert any(ev[0] == _procconn.EXIT and ev[2] == member.pid for ev in taken)
        if x == g:  # the pid was had (nothing else took it first)
            assert not any(ev[0] == _procconn.FORK and ev[2] == g for ev in taken), taken
        # Once the exit is taken, tracking the pid is the lineage's deliberate word
        # (a member whose main thread exited lives on).
        sub.track({member.pid})
        assert member.pid in sub.tracked
    finally:
        sub.close()
        kill_identity(y)


def test_following_filter_lets_in_every_process_exit() -> None:
    # A child followed at its fork may exit before the filter names it: with
    # follow_forks the filter lets in every exit of a process (not of a thread).
    try:
        conn = _procconn.ProcConnector(pids={os.getpid()}, follow_forks=True)
    except OSError as e:
        pytest.skip(f"the proc connector is not available here: {e}")
    try:
        p = subprocess.Popen(["sh", "-c", "true & wait"])  # sh and true: not ours
        p.wait(timeout=10)
        events = conn.read()
        exits = {b for what, a, b, _c, _d in events if what == _procconn.EXIT and a == b}
        forks = {d for what, _a, b, _c, d in events if what == _procconn.FORK and b == p.pid}
        assert p.pid in exits, events
        assert forks and forks <= exits, events
        assert all(a == b for what, a, b, _c, _d in events if what == _procconn.EXIT)
        # A thread's start and end are let in neither as a fork nor as an exit.
        th = threading.Thread(target=lambda: None)
        th.start()
        th.join()
        tid = th.native_id
        assert not any(tid in (a, c) for _w, a, _b, c, _d in conn.read())
    finally:
        conn.close()


NOHUP = "nohup sleep 300 > /dev/null 2>&1 & echo $!"


@pytest.mark.parametrize("late", [True, False], ids=["root-ended-at-pin", "plain"])
def test_quick_nohup_escape_found_without_pidfds(monkeypatch: pytest.MonkeyPatch,
                                                  track: Tracker, late: bool) -> None:
    monkeypatch.setenv("PROCTABLE_DISABLE", "pidfd")
    if late:
        # The case that was lost: the shell has exited (an unreaped zombie) before
        # the lineage reads its row. Wait for that, for real, before pinning it.
        pin = _engine.Engine.pin

        def late_pin(self: Any, pid: int, start: Optional[int], handle: Optional[int]) -> Any:
            wait_zombie(pid, timeout=30.0)
            return pin(self, pid, start, handle)

        monkeypatch.setattr(_engine.Engine, "pin", late_pin)
    for i in range(20):
        lin = track.spawn(["sh", "-c", NOHUP], mode="scan", stdout=subprocess.PIPE)
        if i == 0:
            _events_or_skip(lin)
        assert lin.root is not None
        if late:  # the scenario is the one meant: the root was recorded as ended
            assert lin.root.pid not in lin._engine.reg.live
        escape = int(read_line(lin.process.stdout, 30.0))
        lin.process.stdout.close()  # type: ignore[union-attr]
        ident = track.pid(escape)
        members = {p.pid for p in lin.members()}
        assert escape in members, f"attempt {i}: the nohup escape {escape} was missed"
        report = lin.terminate(grace=2.0, kill_timeout=5.0)
        assert escape in {m.pid for m in report.members}
        deadline = time.monotonic() + 10.0
        while ident.alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not ident.alive(), f"attempt {i}: the escape outlived the teardown"
        lin.process.wait(timeout=10)
