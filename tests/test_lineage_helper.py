"""The lineage's native helper (proctable-lineage): what a user sees of it.

Each test here was first a reproducer of a defect of the Python stand-in and reaper
it replaced (issue: a lineage costs what a Popen costs), or of the signal state a
command inherited from its supervisor (issue: a clean signal state):

- a signal sent through ``lin.process`` reached only the stand-in;
- a wrong Popen keyword raised OSError(EBADF) (an fd closed twice);
- a cgroup-mode supervisor SIGKILLed mid-start left empty cgroup directories;
- a scan-mode root that exited between two looks was called "another process";
- a command inherited ignored SIGINT/SIGQUIT and a blocked SIGTERM.
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import random
import resource
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import proctable
from proctable.lineage import Lineage, _cgroup, _helper

from ._lineage import (
    CGROUP,
    MODES,
    SPAWN_MODES,
    Tracker,
    helpers_at_rest,
    kill_identity,
    left_by_a_killed_caller,
    no_idle_hub,
)
from ._reliability import SLOW
from ._supervise import MARK, running_marked
from .conftest import PY, wait_until

REAPER_MODES = [m for m in MODES if m != "scan"]


def _status_masks(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        return {k: int(v, 16) for k, _, v in (line.partition(":\t") for line in f)
                if k in ("SigIgn", "SigBlk", "SigCgt")}


def _exec_done(pid: int, name: str) -> bool:
    row = proctable.read(pid)
    return row is not None and row.name == name


# -- the helper itself -----------------------------------------------------------------


def test_the_helper_is_a_small_named_executable(track: Tracker) -> None:
    assert os.access(_helper.HELPER, os.X_OK)
    lin = track.spawn(["sleep", "300"], mode="subreaper")
    mirror = proctable.read(lin.process.pid)
    assert mirror is not None and mirror.name == "pt-mirror"
    reaper = [p for p in proctable.snapshot() if p.ppid == lin.process.pid]
    assert [p.name for p in reaper] == ["pt-reaper"]
    # What ps shows in its args column: the helper, then the command.
    with open(f"/proc/{lin.process.pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    assert os.path.basename(argv[0]) == b"proctable-lineage" and b"sleep" in argv
    lin.terminate(grace=1.0)



def _text_kib(pid: int) -> tuple[int, int]:
    """(size, Rss) in KiB of the helper program's executable mapping in pid."""
    size = rss = 0
    inside = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                inside = fields[1] == "r-xp" and fields[-1].endswith("proctable-lineage")
                if inside:
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    size += (hi - lo) // 1024
            elif inside and fields[0] == "Rss:":
                rss += int(fields[1])
    return size, rss


@pytest.mark.parametrize("mode", REAPER_MODES)
def test_the_waiting_helpers_hold_only_the_pages_they_use(track: Tracker, mode: str) -> None:
    """Issue 21 (1 MiB beside each command): once they wait, the mirror and the
    reaper drop their program's pages from their page tables (shed_pages), so a
    lineage's helpers do not each count the whole static C library in their RSS."""
    lin = track.spawn(["sleep", "300"], mode=mode)
    mirror = lin.process.pid
    reaper = next(p.pid for p in proctable.snapshot() if p.ppid == mirror)
    for pid in (mirror, reaper):
        size, _rss = _text_kib(pid)
        assert size > 0
        # Wait until it waits (it sheds then); what it touches after is a few pages.
        wait_until(lambda pid=pid, size=size: _text_kib(pid)[1] < size // 2,  # type: ignore[misc]
                   timeout=10)
    lin.terminate(grace=1.0)



def _guards_of(reaper: int) -> list[proctable.Proc]:
    return [p for p in proctable.snapshot() if p.ppid == reaper and p.name == "pt-guard"]


@pytest.mark.skipif(not CGROUP, reason="needs a writable cgroup v2 tree")
def test_a_cgroup_lineage_has_a_guard_outside_the_callers_group(track: Tracker) -> None:
    """The guard (pt-guard) ends the cgroup when the caller's whole group is killed:
    it is in a session of its own, never a member, and ends with the lineage."""
    lin = track.spawn(["sh", "-c", "sleep 300 & exec sleep 300"], mode="cgroup")
    mirror = lin.process.pid
    reaper = next(p.pid for p in proctable.snapshot() if p.ppid == mirror)
    wait_until(lambda: len(_guards_of(reaper)) == 1, timeout=10)
    guard = _guards_of(reaper)[0]
    assert guard.sid == guard.pid and guard.pgid == guard.pid  # its own session
    assert guard.pgid != os.getpgrp()
    wait_until(lambda: len(lin.members()) == 2, timeout=10)
    assert guard.pid not in {m.pid for m in lin.members()}
    lin.terminate(grace=1.0)
    # Gone with the lineage (the reaper reaps it before it ends).
    def guard_gone() -> bool:
        row = proctable.read(guard.pid)
        return row is None or row.start_time != guard.start_time

    wait_until(guard_gone, timeout=10)


@pytest.mark.skipif(not CGROUP, reason="needs a writable cgroup2")
def test_the_reaper_alone_killed_leaves_the_lineage_to_its_caller(track: Tracker) -> None:
    """The other half of the guard: Found by a hostile review of the cgroup mode's guard
    (issue 21)."""
    # The caller lives on: the guard kills nothing, does not linger, and the
    # caller's teardown still ends the command, its escape and the cgroup.
    lin = track.spawn(["sh", "-c", "setsid sleep 300 & exec sleep 300"], mode="cgroup")
    mirror = lin.process.pid
    reaper = next(p for p in proctable.snapshot() if p.ppid == mirror)
    wait_until(lambda: len(_guards_of(reaper.pid)) == 1, timeout=10)
    guard = _guards_of(reaper.pid)[0]
    wait_until(lambda: len(lin.members()) == 2, timeout=10)
    members = lin.members()
    kill_identity(reaper.identity)

    def gone(p: proctable.Proc) -> bool:
        row = proctable.read(p.pid)
        return row is None or row.start_time != p.start_time or row.state == "Z"

    wait_until(lambda: gone(guard), timeout=10)  # 2 s of looking, then it leaves
    assert not any(gone(m) for m in members), "the guard killed a live caller's lineage"
    lin.terminate(grace=1.0)
    wait_until(lambda: all(gone(m) for m in members), timeout=10)


@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_nothing_of_the_helper_reaches_the_command(track: Tracker, mode: str) -> None:
    lin = track.spawn(["sleep", "300"], mode=mode)
    assert lin.root is not None
    pid = lin.root.pid
    # Look once the command sleeps in its nanosleep: before that its own start-up
    # opens and closes fds (the loader's libc, setlocale's locale archive), and a
    # look between two of them saw [0, 1, 2] then [0, 1, 2, 3] (failed once in ten
    # loaded runs). A leak is an fd that is still there then.
    def asleep() -> bool:
        try:
            with open(f"/proc/{pid}/wchan") as f:
                return _exec_done(pid, "sleep") and "nanosleep" in f.read()
        except OSError:
            return False

    wait_until(asleep)
    fds = sorted(int(n) for n in os.listdir(f"/proc/{pid}/fd"))
    assert fds == [0, 1, 2], fds
    lin.terminate(grace=1.0)


# -- lin.process tells the truth --------------------------------------------------------


@pytest.mark.parametrize("mode", SPAWN_MODES)
@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGQUIT, signal.SIGWINCH])
def test_any_signal_sent_through_the_process_reaches_the_command(
        track: Tracker, mode: str, sig: int) -> None:
    name = signal.Signals(sig).name[3:]
    lin = track.spawn(["sh", "-c", f"trap 'exit 7' {name}; echo ready; "
                       "while :; do sleep 0.05; done"], mode=mode, stdout=subprocess.PIPE)
    assert lin.process.stdout is not None
    assert lin.process.stdout.readline() == b"ready\n"
    lin.process.send_signal(sig)
    assert lin.process.wait(timeout=20) == 7
    assert lin.process.exit_status == proctable.ExitStatus(7, None, False, 7 << 8)
    lin.process.stdout.close()
    lin.terminate(grace=1.0)


@pytest.mark.parametrize("mode", REAPER_MODES)
def test_kill_of_the_process_ends_the_commands_lineage(track: Tracker, mode: str) -> None:
    lin = track.spawn(["sh", "-c", "setsid sleep 300 & nohup sleep 301 >/dev/null 2>&1 & "
                       "sleep 302"], mode=mode)
    wait_until(lambda: len(lin.members()) >= 4)
    idents = lin.identities()
    lin.process.kill()
    # returncode is the command's own: the reaper killed it, and said so.
    assert lin.process.wait(timeout=20) == -signal.SIGKILL
    status = lin.process.exit_status  # type: ignore[attr-defined]
    assert status is not None and status.signal == signal.SIGKILL
    wait_until(lambda: not any(i.alive() for i in idents), timeout=20)
    report = lin.terminate(grace=1.0)
    assert not report.unresolved
    assert lin.health == [], lin.health


@pytest.mark.parametrize("mode", REAPER_MODES)
def test_returncode_is_the_commands_even_when_the_mirror_dies_after_it(
        track: Tracker, mode: str) -> None:
    lin = track.spawn(["sh", "-c", "exit 4"], mode=mode)
    assert lin.root is not None
    # The command has ended; its mirror may still be on its way out.
    wait_until(lambda: not lin.root.alive())  # type: ignore[union-attr]
    try:
        lin.process.kill()
    except ProcessLookupError:
        pass
    assert lin.process.wait(timeout=20) == 4
    lin.terminate(grace=1.0)


@pytest.mark.parametrize("mode", REAPER_MODES)
def test_the_exit_watcher_hears_the_command_end_from_the_reaper(
        track: Tracker, mode: str) -> None:
    """The reaper tells the command's status on the status pipe as soon as it reaped
    the command, and the exit watcher waits on that pipe beside the mirror's pidfd:
    the exit is known while the mirror (stopped here) has not ended."""
    lin = track.spawn(["sh", "-c", "read x; exit 3"], mode=mode, stdin=subprocess.PIPE)
    mirror = lin.process
    os.kill(mirror.pid, signal.SIGSTOP)  # our unreaped child: its pid names no other
    try:
        with proctable.ExitWatcher() as watcher:
            fut = watcher.watch(mirror)
            assert mirror.stdin is not None
            mirror.stdin.close()  # the command reads EOF and exits 3
            status = fut.result(timeout=20)
            assert status.code == 3
            assert mirror.poll() is None  # the mirror is stopped, not ended
    finally:
        os.kill(mirror.pid, signal.SIGCONT)
    assert mirror.wait(timeout=20) == 3
    lin.terminate(grace=1.0)


@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_sigstop_sent_through_the_process_stops_the_command(
        track: Tracker, mode: str) -> None:
    """SIGSTOP sent through ``lin.process`` stopped the mirror, not the command (which
    ran on; ``wait()`` then hung past the command's exit). Found by an outside review of
    the native helper (issues 21 and 25)."""
    lin = track.spawn(["sleep", "300"], mode=mode)
    root = lin.root
    assert root is not None
    wait_until(lambda: _exec_done(root.pid, "sleep"))
    lin.process.send_signal(signal.SIGSTOP)

    def stopped() -> bool:
        row = proctable.read(root.pid)
        return row is not None and row.state in ("T", "t")

    deadline = time.monotonic() + 10
    while not stopped() and time.monotonic() < deadline:
        time.sleep(0.01)
    was_stopped = stopped()
    lin.process.send_signal(signal.SIGCONT)
    lin.terminate(grace=1.0)
    assert was_stopped, "SIGSTOP through lin.process did not stop the command"


# -- a signal to the command's group or the caller's: each copy once -------------------


_COUNT_SIGNALS = """
import signal, sys
sig = int(sys.argv[1])
signal.pthread_sigmask(signal.SIG_BLOCK, {sig})  # queued, each copy counted
print("ready", flush=True)
sys.stdin.readline()
n = 0
while signal.sigtimedwait({sig}, 0) is not None:
    n += 1
print(n, flush=True)
"""


@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_a_signal_to_the_commands_group_reaches_it_once(track: Tracker, mode: str) -> None:
    """A signal sent to the command's process group (``start_new_session=True``, then
    ``os.killpg``) reached it two or three times (the mirror and the reaper passed it
    on). Found by an outside review of the native helper (issues 21 and 25)."""
    # start_new_session=True, then os.killpg(...) (as process managers stop a job):
    # the mirror and the reaper are in that group too, and each passes the signal
    # on. A queued signal shows every copy; a second SIGINT/SIGTERM means "now"
    # to many programs.
    sig = signal.SIGRTMIN + 1
    lin = track.spawn([PY, "-c", _COUNT_SIGNALS, str(int(sig))], mode=mode,
                      start_new_session=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert lin.process.stdin is not None and lin.process.stdout is not None
    assert lin.process.stdout.readline() == b"ready\n"
    # The command's group (start_new_session: it leads a session and group of its own;
    # the mirror stays in the caller's group, this test's: never signal that one).
    assert lin.root is not None
    assert os.getpgid(lin.root.pid) != os.getpgrp()
    os.killpg(os.getpgid(lin.root.pid), sig)
    helpers_at_rest(lin.process.pid)  # every copy is queued at the command by then
    lin.process.stdin.write(b"count\n")
    lin.process.stdin.close()
    count = lin.process.stdout.readline()
    lin.process.stdout.close()
    assert lin.process.wait(timeout=20) == 0
    lin.terminate(grace=1.0)
    assert count == b"1\n", f"the command got the group's signal {count!r} times"


# The barrier of helpers_at_rest() for the callers in a process of their own.
_AT_REST = textwrap.dedent(inspect.getsource(helpers_at_rest))

# A caller's last steps: ask the command for its count, and end the lineage.
_ASK_COUNT = """
lin.process.stdin.write(b"count\\n")
lin.process.stdin.close()
got = lin.process.stdout.readline()
lin.process.stdout.close()
lin.process.wait(timeout=20)
lin.terminate(grace=1.0)
"""

# The caller, in a group of its own: `group` killpg's of its own group, then
# `direct` sends through lin.process, then the command's count (`session`:
# the command leads a session of its own, start_new_session=True).
_CALLER = """
import os, resource, signal, subprocess, sys, time
from proctable.lineage import Lineage
""" + _AT_REST + """
mode, sig, group, direct, limit, session, count = (
    sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
    sys.argv[6] == "1", sys.argv[7])
signal.signal(sig, signal.SIG_IGN)  # this process is in the group it signals
lin = Lineage.spawn([sys.executable, "-c", count, str(sig)], mode=mode,
                    start_new_session=session, stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE)
assert lin.process.stdout is not None and lin.process.stdin is not None
assert lin.process.stdout.readline() == b"ready\\n"
if limit >= 0:  # the helpers' own queue limit (the command keeps the caller's)
    mirror = lin.process.pid
    with open(f"/proc/{mirror}/task/{mirror}/children") as f:
        reaper = int(f.read().split()[0])
    for pid in (mirror, reaper):
        resource.prlimit(pid, resource.RLIMIT_SIGPENDING, (limit, limit))
for _ in range(group):
    os.killpg(os.getpgrp(), sig)
for _ in range(direct):
    helpers_at_rest(lin.process.pid)  # what came before is passed on, or dropped
    lin.process.send_signal(sig)
helpers_at_rest(lin.process.pid)  # every copy is queued at the command by then
""" + _ASK_COUNT + "print(got.decode().strip())\n"


def _copies(mode: str, sig: int, group: int, direct: int, limit: int = -1,
            session: bool = False) -> int:
    r = subprocess.run([PY, "-c", _CALLER, mode, str(sig), str(group), str(direct), str(limit),
                        "1" if session else "0", _COUNT_SIGNALS], capture_output=True, text=True,
                       timeout=60, start_new_session=True, check=False)  # a group of its own
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


@pytest.mark.parametrize("mode", SPAWN_MODES)
@pytest.mark.parametrize(("session", "copies"), [(False, 1), (True, 0)],
                         ids=["in-the-group", "own-session"])
def test_a_signal_to_the_callers_group_reaches_the_command_as_it_would_a_popen(
        mode: str, session: bool, copies: int) -> None:
    """Issue 21 (open last round): the mirror and the reaper stay in the caller's group,
    so a killpg of it reached the command directly and again through the mirror. Now as
    with a Popen: once when the command is in that group, not at all when it leads a
    session of its own (start_new_session=True).

    Found by an outside review of the native helper (issues 21 and 25)."""
    got = _copies(mode, signal.SIGRTMIN + 1, group=1, direct=0, session=session)  # queued
    assert got == copies, f"the command got {got} copies"


@pytest.mark.parametrize("mode", REAPER_MODES)
@pytest.mark.parametrize("sig", [signal.SIGRTMIN + 1, signal.SIGRTMIN + 10, signal.SIGRTMAX],
                         ids=["RTMIN+1", "RTMIN+10", "RTMAX"])
def test_a_burst_to_the_callers_group_reaches_the_command_once_per_copy(
        mode: str, sig: int) -> None:
    """A burst of a real-time signal sent to the caller's group reached the command
    about twice per copy: the reaper kept one direct copy per signal number, so the
    second relay of a burst was passed on. Found by a hostile review of the signal
    relay's dedup (issue 21)."""
    # As a Popen child in that group: each queued copy once. Was 5 of 3 (RTMIN+1)
    # and 4 or 5 of 3 (RTMIN+10) in both modes.
    assert _copies(mode, sig, group=3, direct=0) == 3


@pytest.mark.parametrize("mode", REAPER_MODES)
def test_a_high_realtime_signal_to_the_group_then_through_lin_process(mode: str) -> None:
    """One real-time signal above SIGRTMIN+6 sent to the caller's group often reached
    the command twice: a signalfd hands out the lowest number first, so the relay
    (SIGRTMIN+6) was read before the direct copy it should have cancelled, and that copy
    then stayed for 5 s to drop the next relay of the same signal from the same sender,
    a send through lin.process. Found by a hostile review of the signal relay's dedup
    (issue 21)."""
    # One to the group (was passed on again: 2 copies in 1 run of 2, subreaper),
    # then two through lin.process, each exactly once.
    sig = signal.SIGRTMIN + 10
    for _ in range(3 if SLOW else 1):
        assert _copies(mode, sig, group=1, direct=2) == 3


@pytest.mark.parametrize("mode", REAPER_MODES)
@pytest.mark.parametrize(("group", "direct"), [(0, 3), (2, 0), (1, 2)],
                         ids=["through-lin-process", "to-the-group", "both"])
def test_a_realtime_signal_arrives_once_per_copy_at_the_signal_queue_limit(
        mode: str, group: int, direct: int) -> None:
    """With RLIMIT_SIGPENDING exhausted, a real-time signal sent through lin.process
    never reached the command (the mirror's fallback kill() came without a sender).
    Found by a hostile review of the signal relay's dedup (issue 21)."""
    # The helpers' RLIMIT_SIGPENDING exhausted (0): the mirror's sigqueue fails, and
    # its fallback, a plain kill(), reached the reaper without its sender (the kernel
    # drops what it cannot queue): taken for a direct copy, and dropped (0 of 3
    # through lin.process). The relay now goes as a line on the mirror's socket.
    assert resource.getrlimit(resource.RLIMIT_SIGPENDING)[0] > 16
    assert _copies(mode, signal.SIGRTMIN + 1, group=group, direct=direct,
                   limit=0) == group + direct


_REPORT_SIGNAL = """
import os, signal, sys, time
sig = int(sys.argv[1])
signal.signal(sig, lambda s, f: os.write(1, f"got {s}\\n".encode()))
print("ready", flush=True)
while True:
    time.sleep(0.05)  # (one long sleep could keep a handler waiting: see below)
"""


@pytest.mark.parametrize("mode", SPAWN_MODES)
# SIGCHLD was lost once in ~1,300 loaded tests in subreaper mode: passed on to the
# reaper as itself, it merged with a SIGCHLD of the reaper's own children pending
# there. The mirror now relays every signal as a queued real-time one.
@pytest.mark.parametrize("sig", [signal.SIGCHLD, signal.SIGRTMIN + 5],
                         ids=["SIGCHLD", "SIGRTMIN+5"])
def test_the_signals_the_helper_uses_itself_reach_the_command_too(
        track: Tracker, mode: str, sig: int) -> None:
    """The signal still went missing under load, about 1 run in 500 with two CPU burners
    beside (issue 30, item 9), but not in the helper: the reaper's kill() of the command
    succeeded each time (its log), and a plain Popen of the same command lost it as
    often (5 of 3,000 SIGCHLD, 1 of 1,500 SIGUSR2; a C command with a handler: 0 of
    1,500). CPython runs a handler between bytecodes: a signal that lands after its last
    look and before ``time.sleep(300)`` starts waits for that sleep to end. The command
    sent it right after "ready", into that window; it now sleeps in short slices, as a
    real program's loop does.

    First found by an outside review of the native helper (issues 21 and 25): SIGCHLD
    and SIGRTMIN+5 sent through ``lin.process`` never reached the command."""
    # The mirror drops what it takes for its own wake-ups (SIGCHLD, and SIGRTMIN+5,
    # its parent-death signal): sent through lin.process they never arrive.
    lin = track.spawn([PY, "-c", _REPORT_SIGNAL, str(int(sig))], mode=mode,
                      stdout=subprocess.PIPE)
    assert lin.process.stdout is not None
    assert lin.process.stdout.readline() == b"ready\n"
    lin.process.send_signal(sig)
    ready, _, _ = select.select([lin.process.stdout], [], [], 10.0)
    got = lin.process.stdout.readline() if ready else b"nothing in 10 s"
    lin.process.stdout.close()
    lin.terminate(grace=1.0)
    assert got == f"got {int(sig)}\n".encode(), got


# -- bad input: the exception subprocess gives, no fd closed twice -----------------------


def _open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def _no_lingering_hub() -> None:
    """No event hub lingers (bounded): it keeps its socket and pipe for LINGER_SECONDS
    after its last lineage, so an fd count taken beside it counts them or not
    depending on what ran just before."""
    no_idle_hub()


@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_a_wrong_popen_keyword_is_a_type_error(mode: str) -> None:
    _no_lingering_hub()
    before = _open_fds()
    # An fd of ours that a double close would hit if it took the freed number.
    with open(os.devnull, "rb") as bystander:
        for _ in range(5):
            with pytest.raises(TypeError, match="bogus"):
                Lineage.spawn(["true"], mode=mode, bogus=1)
            os.fstat(bystander.fileno())  # still open
    _no_lingering_hub()  # (a subreaper or scan spawn subscribed to it before it failed)
    assert _open_fds() <= before | set(range(3))


def test_a_wrong_popen_keyword_to_the_supervisor_is_a_type_error() -> None:
    with proctable.Supervisor(grace=0.5) as sup, pytest.raises(TypeError, match="bogus"):
        sup.start("k", ["true"], bogus=1)


@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_a_missing_command_is_file_not_found(mode: str) -> None:
    with pytest.raises(FileNotFoundError) as info:
        Lineage.spawn(["/nonexistent/proctable-test-cmd"], mode=mode)
    assert info.value.filename == "/nonexistent/proctable-test-cmd"


@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_an_argument_list_over_arg_max_names_the_command(mode: str) -> None:
    """An argument list too long for exec (E2BIG) raised an OSError naming the
    lineage's helper, whose argv carries the command (issue 30, item 10, found by the
    outside review): it names the command, as subprocess does, and leaves no fd."""
    big = ["x" * (100 << 10)] * int(os.sysconf("SC_ARG_MAX") // (100 << 10) + 2)
    with pytest.raises(OSError) as info:
        Lineage.spawn(["true", *big], mode=mode)
    assert info.value.errno == errno.E2BIG
    assert info.value.filename == "true"
    before = _open_fds()  # after a first spawn (the shared proc-connector opens once)
    for _ in range(3):
        with pytest.raises(OSError) as info:  # with an executable, that one (as subprocess)
            Lineage.spawn(["mytrue", *big], mode=mode, executable="/bin/true")
        assert info.value.errno == errno.E2BIG and info.value.filename == "/bin/true"
    assert _open_fds() <= before


@pytest.mark.parametrize("value", [[signal.SIGKILL], ["HUP"], "1", [0], [10_000]])
def test_bad_ignore_signals_are_refused(value: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        Lineage.spawn(["true"], ignore_signals=value)  # type: ignore[arg-type]


# -- Popen's keywords, as subprocess takes them ----------------------------------------


@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_pass_fds_are_not_held_by_the_helper(track: Tracker, mode: str) -> None:
    """``pass_fds`` were held open by the mirror and the reaper for as long as they
    lived, so a reader never saw EOF when the command closed its end. Found by an
    outside review of the native helper (issues 21 and 25)."""
    # subprocess: the reader sees EOF as soon as the command closes the write end.
    r, w = os.pipe()
    try:
        code = f"import os, time; os.close({w}); print('closed', flush=True); time.sleep(300)"
        lin = track.spawn([PY, "-c", code], mode=mode, pass_fds=[w], stdout=subprocess.PIPE)
        os.close(w)
        w = -1
        assert lin.process.stdout is not None
        ready, _, _ = select.select([lin.process.stdout], [], [], 20.0)
        assert ready and lin.process.stdout.readline() == b"closed\n"
        # The command holds no copy any more: EOF, unless a helper holds one.
        eof, _, _ = select.select([r], [], [], 10.0)
        assert eof and os.read(r, 1) == b"", "the write end is still held open"
        lin.process.stdout.close()
        lin.terminate(grace=1.0)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to 65534")
@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_user_keyword_drops_privileges(track: Tracker, mode: str) -> None:
    """``user=`` (root dropping privileges) failed in cgroup and auto modes with a
    PermissionError that named the command. Found by an outside review of the native
    helper (issues 21 and 25)."""
    # subprocess.Popen(["id", "-u"], user=65534) works as root.
    lin = track.spawn(["id", "-u"], mode=mode, user=65534, group=65534,
                      stdout=subprocess.PIPE)
    assert lin.process.stdout is not None
    out = lin.process.stdout.read()
    lin.process.stdout.close()
    assert lin.process.wait(timeout=20) == 0
    assert out == b"65534\n"
    lin.terminate(grace=1.0)


@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_executable_is_looked_up_in_path(track: Tracker, mode: str) -> None:
    """``executable=`` was not looked up in PATH (subprocess does). Found by an outside
    review of the native helper (issues 21 and 25)."""
    # subprocess.run(["foo", "-c", "exit 3"], executable="sh").returncode == 3
    lin = track.spawn(["foo", "-c", "exit 3"], mode=mode, executable="sh")
    assert lin.process.wait(timeout=20) == 3
    lin.terminate(grace=1.0)


# -- scan mode: a root that ends between two looks is ours -------------------------------


def test_scan_spawns_of_quick_exits_side_by_side_are_all_tracked(track: Tracker) -> None:
    mark = f"scan-race-{os.getpid()}"  # unique: other runs of the suite share the host
    errors: list[BaseException] = []
    lineages: list[Lineage] = []
    lock = threading.Lock()

    def spawner() -> None:
        for _ in range(15):
            try:
                lin = Lineage.spawn(["sh", "-c", "setsid sleep 300 & exit 0"], mode="scan",
                                    interval=0.02, env={**os.environ, MARK: mark})
            except BaseException as exc:
                errors.append(exc)
                continue
            with lock:
                lineages.append(lin)
                track.lineages.append(lin)

    threads = [threading.Thread(target=spawner) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]
    assert len(lineages) == 60
    for lin in lineages:
        lin.process.wait(timeout=20)
        report = lin.terminate(grace=1.0)
        # The setsid'd escape was found and ended by every one of them.
        assert any(m.proc.sid == m.pid for m in report.members), report
    assert not _marked(mark)


def _marked(value: str) -> list[int]:
    """Live processes whose environment carries MARK=value (what the table shows,
    not what the lineage says)."""
    return running_marked(value).get(value, [])


# -- a supervisor SIGKILLed mid-start leaves no cgroup ------------------------------------


def _kill_once_it_says(child: subprocess.Popen[bytes], line: bytes, delay: float = 0.0,
                       group: bool = False) -> None:
    """Once child has written line to its stdout pipe, and delay seconds later,
    SIGKILL it, or with group its whole group (it leads one of its own: timeout -s
    KILL, kill -9 -PGID); child is reaped whatever happens."""
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == line
        time.sleep(delay)
        if group:
            os.killpg(child.pid, signal.SIGKILL)
        else:
            child.kill()
        child.wait(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=20)
        if child.stdout is not None:
            child.stdout.close()


@pytest.mark.skipif(not CGROUP, reason="no writable cgroup v2 here")
@pytest.mark.parametrize("run", range(6))
def test_no_cgroup_is_left_by_a_supervisor_killed_at_any_moment(run: int) -> None:
    """Its mark was the same in every run of the suite, so a run of it beside
    another on the same host (another worktree's) takes that run's commands for
    its own leftovers, and kills them. It failed once here at load 9 with a marked
    shell and its sleep left (not seen again in 48 runs, 30 of them loaded; a
    concurrent run's commands fit what it showed). Each mark is now this
    worker's own."""
    mark = f"cg-kill-{os.getpid()}-{run}"
    parent = _cgroup.own_cgroup()
    assert parent is not None
    code = textwrap.dedent(f"""
        import os, sys, proctable
        os.environ[{MARK!r}] = {mark!r}
        sup = proctable.Supervisor(grace=0.2, mode="cgroup")
        print("ready", flush=True)
        for i in range(100):
            sup.submit_start(f"k{{i % 7}}", ["sh", "-c", "setsid sleep 300 & sleep 300"])
        sup.flush_events(30)
        print("done", flush=True)
        import time; time.sleep(300)
    """)
    child = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE)
    _kill_once_it_says(child, b"ready\n", random.Random(run).uniform(0.0, 0.6) + run * 0.05)
    dirs, running = left_by_a_killed_caller(child.pid, mark)
    assert not dirs and not running, (dirs, running)


# -- a caller killed with its whole group leaves nothing -------------------------------


@pytest.mark.parametrize("mode", [
    pytest.param(m, marks=pytest.mark.xfail(
        strict=True, reason="open (issue 21): the helpers stay in the supervisor's process "
        "group (a group of their own let the kernel SIGHUP the supervisor's group), so a "
        "kill of that group takes them with it; cgroup mode has a guard outside it, "
        "subreaper mode nothing that could find the escapes")) if m == "subreaper" else m
    for m in REAPER_MODES])
def test_a_supervisor_killed_with_its_process_group_leaves_nothing(mode: str) -> None:
    """A supervisor SIGKILLed together with its process group (``timeout -s KILL``,
    ``kill -9 -PGID``) took the helpers with it: escapes kept running and the lineage's
    cgroup directory stayed. Found by an outside review of the native helper (issues 21
    and 25)."""
    # timeout -s KILL, or kill -9 -PGID: the supervisor and everything of its group.
    # cgroup mode: the reaper's guard (pt-guard, its own session) ends the cgroup.
    parent = _cgroup.own_cgroup() if mode == "cgroup" else None
    if mode == "cgroup":
        assert CGROUP and parent is not None
    value = f"pgkill-{mode}-{os.getpid()}"  # unique: other runs share the host
    code = textwrap.dedent(f"""
        import os, proctable
        os.environ[{MARK!r}] = {value!r}
        lins = [proctable.Lineage.spawn(["sh", "-c", "setsid sleep 300 & sleep 300"],
                                        mode={mode!r}) for _ in range(3)]
        import time
        deadline = time.monotonic() + 60
        # Ready once every escape runs (sh, the setsid'd sleep, the other sleep).
        while any(len(lin.members()) < 3 for lin in lins) and time.monotonic() < deadline:
            time.sleep(0.02)
        print("ready", flush=True)
        time.sleep(300)
    """)
    child = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE,
                             start_new_session=True)
    _kill_once_it_says(child, b"ready\n", group=True)
    # A live reaper or guard ends all of it in milliseconds: 5 s is plenty. The open
    # (xfail) subreaper case waits 1 s for what nothing ends, as long as it costs the
    # suite (whoever closes issue 21 there gives it the 5 s with the xfail gone).
    dirs, running = left_by_a_killed_caller(child.pid, value,
                                            timeout=5.0 if mode == "cgroup" else 1.0)
    assert not dirs and not running, (dirs, running)


_STARTS = """
import os, sys, proctable
os.environ[{mark!r}] = {value!r}
print("go", flush=True)
lins = []
while True:
    lins.append(proctable.Lineage.spawn(["sh", "-c", "setsid sleep 300 & sleep 300"],
                                        mode="cgroup"))
"""


@pytest.mark.skipif(not CGROUP, reason="needs a writable cgroup2")
def test_a_caller_group_killed_at_random_moments_of_its_starts_leaves_nothing() -> None:
    """A caller's whole group SIGKILLed at random moments of its starts left an empty
    cgroup (the guard was forked after the mkdir, and in the group until setsid()).
    Found by a hostile review of the cgroup mode's guard (issue 21)."""
    # timeout -s KILL of a supervisor while it starts lineages: whatever the moment,
    # no proctable-<pid>-* cgroup and no escape is left once the guards are done.
    rng = random.Random(2112)
    left: list[tuple[float, list[str], int]] = []
    for run in range(8 if SLOW else 3):
        value = f"group-killed-starts-{run}-{os.getpid()}"  # unique: runs share the host
        child = subprocess.Popen([PY, "-c", _STARTS.format(mark=MARK, value=value)],
                                 stdout=subprocess.PIPE, start_new_session=True)
        delay = rng.uniform(0.05, 0.6)
        _kill_once_it_says(child, b"go\n", delay, group=True)
        dirs, rows = left_by_a_killed_caller(child.pid, value, timeout=5.0)
        if dirs or rows:
            left.append((round(delay, 3), dirs, len(rows)))
    assert not left, f"(delay, cgroups, escapes) left: {left}"


# -- the signal state a command starts with ------------------------------------------------

_SIGNAL_STATE = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    import proctable
    mode, keep = sys.argv[1], [int(s) for s in sys.argv[2].split(",") if s]
    for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    out = {}

    def masks(pid):
        with open(f"/proc/{pid}/status") as f:
            return {k: int(v, 16) for k, _, v in (l.partition(":\\t") for l in f)
                    if k in ("SigIgn", "SigBlk")}

    def run():
        # The spawning thread blocks SIGTERM (as sigwait users do).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        lin = proctable.Lineage.spawn(["sleep", "300"], mode=mode, ignore_signals=keep)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            row = proctable.read(lin.root.pid)
            if row is not None and row.name == "sleep":
                break
            time.sleep(0.01)
        out["masks"] = masks(lin.root.pid)
        t0 = time.monotonic()
        lin.terminate(grace=10.0)
        out["teardown"] = time.monotonic() - t0
        sup = proctable.Supervisor(mode=mode)
        sup.start("k", ["sleep", "300"])
        t0 = time.monotonic()
        sup.stop("k", grace=10.0)
        out["stop"] = time.monotonic() - t0
        sup.close()

    t = threading.Thread(target=run)
    t.start()
    t.join(120)
    print(json.dumps(out))
""")


@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_a_command_starts_with_a_clean_signal_state(mode: str) -> None:
    r = subprocess.run([PY, "-c", _SIGNAL_STATE, mode, ""], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["masks"] == {"SigIgn": 0, "SigBlk": 0}, out
    # SIGTERM reaches it: teardown and stop() end well inside the 10 s grace.
    assert out["teardown"] < 5.0 and out["stop"] < 5.0, out


@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_ignore_signals_keeps_nohups_semantics(mode: str) -> None:
    r = subprocess.run([PY, "-c", _SIGNAL_STATE, mode, str(int(signal.SIGHUP))],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["masks"] == {"SigIgn": 1 << (signal.SIGHUP - 1), "SigBlk": 0}, out


@pytest.mark.parametrize("mode", SPAWN_MODES)
def test_ctrl_c_on_a_terminal_runs_the_shells_trap(track: Tracker, mode: str) -> None:
    """A shell on a pseudo-terminal (terminal=): its session, its controlling
    terminal, and ^C reaching its INT trap though this process ignores SIGINT."""
    master, slave = os.openpty()
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        lin = track.spawn(["sh", "-c", "trap 'exit 9' INT; test -t 0 && echo tty; "
                           "echo sid=$(ps -o sid= -p $$); while :; do sleep 0.05; done"],
                          mode=mode, terminal=slave)
    finally:
        signal.signal(signal.SIGINT, old)
        os.close(slave)
    try:
        assert lin.root is not None
        seen = b""
        deadline = time.monotonic() + 20
        while not (b"sid=" in seen and seen.split(b"sid=")[1].count(b"\n") >= 1):
            if time.monotonic() > deadline:
                pytest.fail(f"no prompt: {seen!r}")
            if select.select([master], [], [], 0.5)[0]:
                seen += os.read(master, 4096)
        assert b"tty" in seen
        sid = int(seen.split(b"sid=")[1].split()[0])
        assert sid == lin.root.pid  # it leads its own session
        assert _status_masks(lin.root.pid)["SigIgn"] & (1 << (signal.SIGINT - 1)) == 0
        os.write(master, b"\x03")
        assert lin.process.wait(timeout=20) == 9
        lin.terminate(grace=1.0)
    finally:
        os.close(master)


def test_terminal_must_be_a_terminal() -> None:
    r, w = os.pipe()
    try:
        with pytest.raises(ValueError, match="not a terminal"):
            Lineage.spawn(["true"], terminal=r)
        with pytest.raises(TypeError):
            Lineage.spawn(["true"], terminal="tty")  # type: ignore[arg-type]
    finally:
        os.close(r)
        os.close(w)


if sys.platform != "linux":  # pragma: no cover
    pytest.skip("Linux only", allow_module_level=True)


# -- a terminal's ^C (SI_KERNEL) -------------------------------------------------------


_COUNT_HANDLED = """
import signal, sys, time
sig = int(sys.argv[1])
n = 0
def on(s, f):
    global n
    n += 1
signal.signal(sig, on)
print("ready", flush=True)
sys.stdin.readline()
time.sleep(0.1)
print(n, flush=True)
"""


_TTY_CALLER = """
import fcntl, os, signal, subprocess, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the pty is our terminal (we lead a session)
from proctable.lineage import Lineage
""" + _AT_REST + """
mode, count = sys.argv[1], sys.argv[2]
# The terminal's ^C reaches us too: we say so (then the kernel has signalled the
# whole foreground group, helpers and command).
signal.signal(signal.SIGINT, lambda s, f: os.write(1, b"interrupted\\n"))
lin = Lineage.spawn([sys.executable, "-c", count, str(int(signal.SIGINT))], mode=mode,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
assert lin.process.stdout is not None and lin.process.stdin is not None
assert lin.process.stdout.readline() == b"ready\\n"
print("ready", flush=True)
# Python runs a handler on the main thread only: the kernel may give the SIGINT to
# one of the lineage's threads, and a main thread blocked in a read would then
# never run it (once in ten loaded runs). It wakes every 0.1 s until the line.
import select
while not select.select([0], [], [], 0.1)[0]:
    pass
sys.stdin.readline()  # the ^C has been typed and a line after it
helpers_at_rest(lin.process.pid)  # every copy is queued at the command by then
""" + _ASK_COUNT + 'print("count", got.decode().strip(), flush=True)\n'


@pytest.mark.parametrize("mode", REAPER_MODES)
def test_a_terminals_interrupt_reaches_the_command_once(mode: str) -> None:
    """The same review of the signal relay's dedup (issue 21) checked that a signal the
    kernel sends (SI_KERNEL) is not passed on again."""
    # ^C typed at the caller's terminal: the kernel signals the foreground group
    # (SI_KERNEL), which holds the command; nobody may pass it on again.
    import pty
    import select as sel

    master, slave = pty.openpty()
    child = subprocess.Popen([PY, "-c", _TTY_CALLER, mode, _COUNT_HANDLED], stdin=slave,
                             stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out = b""

    def read_until(token: bytes, timeout: float = 30.0, after: bytes = b"") -> None:
        nonlocal out

        def seen() -> bool:
            return token in (out.split(after, 1)[1] if after and after in out else
                             (b"" if after else out))

        deadline = time.monotonic() + timeout
        while not seen() and time.monotonic() < deadline:
            r, _, _ = sel.select([master], [], [], 0.5)
            if r:
                try:
                    out += os.read(master, 4096)
                except OSError:
                    break
        assert seen(), out

    try:
        read_until(b"ready")
        os.write(master, b"\x03")
        read_until(b"interrupted", after=b"ready")  # the kernel sent it (SI_KERNEL)
        os.write(master, b"go\n")
        read_until(b"count ")
        read_until(b"\n", timeout=10, after=b"count ")  # the whole line of the count
        assert child.wait(timeout=30) == 0, out
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=20)
        os.close(master)
    got = out.split(b"count ", 1)[1].split(b"\r", 1)[0].split(b"\n", 1)[0]
    assert got == b"1", out
