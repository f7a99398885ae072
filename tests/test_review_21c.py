"""Hostile review of three late changes (issue 21): the signal relay's dedup, the
cgroup mode's guard, and AsyncSupervisor's events().

Each test is a reproducer found by the review; each failed on the code it was
written against (or is marked xfail, strict, with the reason):

- a burst of a real-time signal sent to the caller's group reached the command
  about twice per copy (the reaper kept one direct copy per signal number, so the
  second relay of a burst was passed on);
- one real-time signal above SIGRTMIN+6 sent to the caller's group often reached
  the command twice: a signalfd hands out the lowest number first, so the relay
  (SIGRTMIN+6) was read before the direct copy it should have cancelled, and that
  copy then stayed for 5 s to drop the next relay of the same signal from the same
  sender, a send through lin.process;
- with RLIMIT_SIGPENDING exhausted, a real-time signal sent through lin.process
  never reached the command (the mirror's fallback kill() came without a sender);
- a caller's whole group SIGKILLed at random moments of its starts left an empty
  cgroup (the guard was forked after the mkdir, and in the group until setsid());
- AsyncSupervisor beside on_event: a stream taken before a start lost its events,
  and a reader that left kept everything queued for nobody.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import resource
import signal
import subprocess
import time

import pytest

import proctable
from proctable.supervise import AsyncSupervisor, Event

from ._lineage import CGROUP, SPAWN_MODES, Tracker, kill_identity, left_by_a_killed_caller
from ._supervise import MARK
from .conftest import PY, wait_until


def _guards_of(reaper: int) -> list[proctable.Proc]:
    return [p for p in proctable.snapshot() if p.ppid == reaper and p.name == "pt-guard"]

REAPER_MODES = [m for m in SPAWN_MODES if m not in ("scan", "auto")]

# The command: block sig, say ready, count the queued copies when asked.
_COUNT = """
import signal, sys
sig = int(sys.argv[1])
signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
print("ready", flush=True)
sys.stdin.readline()
n = 0
while signal.sigtimedwait({sig}, 0) is not None:
    n += 1
print(n, flush=True)
"""

# The caller, in a group of its own: `group` killpg's of its own group, then
# `direct` sends through lin.process, then the command's count.
_CALLER = """
import os, resource, signal, subprocess, sys, time
from proctable.lineage import Lineage
mode, sig, group, direct, limit, count = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                          int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
signal.signal(sig, signal.SIG_IGN)  # this process is in the group it signals
lin = Lineage.spawn([sys.executable, "-c", count, str(sig)], mode=mode,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
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
    time.sleep(0.1)
    lin.process.send_signal(sig)
time.sleep(1.0)  # every copy is on its way by then (a missing one fails nothing)
lin.process.stdin.write(b"count\\n")
lin.process.stdin.close()
got = lin.process.stdout.readline()
lin.process.stdout.close()
lin.process.wait(timeout=20)
lin.terminate(grace=1.0)
print(got.decode().strip())
"""


def _copies(mode: str, sig: int, group: int, direct: int, limit: int = -1) -> int:
    r = subprocess.run([PY, "-c", _CALLER, mode, str(sig), str(group), str(direct), str(limit),
                        _COUNT], capture_output=True, text=True, timeout=60,
                       start_new_session=True, check=False)  # a group of its own to signal
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


@pytest.mark.parametrize("mode", REAPER_MODES)
@pytest.mark.parametrize("sig", [signal.SIGRTMIN + 1, signal.SIGRTMIN + 10, signal.SIGRTMAX],
                         ids=["RTMIN+1", "RTMIN+10", "RTMAX"])
def test_a_burst_to_the_callers_group_reaches_the_command_once_per_copy(
        mode: str, sig: int) -> None:
    # As a Popen child in that group: each queued copy once. Was 5 of 3 (RTMIN+1)
    # and 4 or 5 of 3 (RTMIN+10) in both modes.
    assert _copies(mode, sig, group=3, direct=0) == 3


@pytest.mark.parametrize("mode", REAPER_MODES)
def test_a_high_realtime_signal_to_the_group_then_through_lin_process(mode: str) -> None:
    # One to the group (was passed on again: 2 copies in 1 run of 2, subreaper),
    # then two through lin.process, each exactly once.
    sig = signal.SIGRTMIN + 10
    for _ in range(3):
        assert _copies(mode, sig, group=1, direct=2) == 3


@pytest.mark.parametrize("mode", REAPER_MODES)
@pytest.mark.parametrize(("group", "direct"), [(0, 3), (2, 0), (1, 2)],
                         ids=["through-lin-process", "to-the-group", "both"])
def test_a_realtime_signal_arrives_once_per_copy_at_the_signal_queue_limit(
        mode: str, group: int, direct: int) -> None:
    # The helpers' RLIMIT_SIGPENDING exhausted (0): the mirror's sigqueue fails, and
    # its fallback, a plain kill(), reached the reaper without its sender (the kernel
    # drops what it cannot queue): taken for a direct copy, and dropped (0 of 3
    # through lin.process). The relay now goes as a line on the mirror's socket.
    assert resource.getrlimit(resource.RLIMIT_SIGPENDING)[0] > 16
    assert _copies(mode, signal.SIGRTMIN + 1, group=group, direct=direct,
                   limit=0) == group + direct



# -- the cgroup mode's guard ------------------------------------------------------------

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
    # timeout -s KILL of a supervisor while it starts lineages: whatever the moment,
    # no proctable-<pid>-* cgroup and no escape is left once the guards are done.
    rng = random.Random(2112)
    left: list[tuple[float, list[str], int]] = []
    for run in range(8):
        value = f"r21c-starts-{run}-{os.getpid()}"  # unique: other runs share the host
        child = subprocess.Popen([PY, "-c", _STARTS.format(mark=MARK, value=value)],
                                 stdout=subprocess.PIPE, start_new_session=True)
        delay = rng.uniform(0.05, 0.6)
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == b"go\n"
            time.sleep(delay)
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=20)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=20)
            if child.stdout is not None:
                child.stdout.close()
        dirs, rows = left_by_a_killed_caller(child.pid, value, timeout=5.0)
        if dirs or rows:
            left.append((round(delay, 3), dirs, len(rows)))
    assert not left, f"(delay, cgroups, escapes) left: {left}"


@pytest.mark.skipif(not CGROUP, reason="needs a writable cgroup2")
def test_the_reaper_alone_killed_leaves_the_lineage_to_its_caller(track: Tracker) -> None:
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


# -- AsyncSupervisor.events() beside on_event ---------------------------------------------


def test_events_called_before_a_start_yields_that_starts_events() -> None:
    # it = sup.events() before the start, iterated after it (a reader made early,
    # as in a class that takes the stream in its constructor): its events were lost,
    # queueing began at the generator's first step, not at the call.
    async def main() -> list[str]:
        seen: list[Event] = []
        sup = AsyncSupervisor(on_event=seen.append, grace=1.0, kill_timeout=2.0)
        stream = sup.events()
        await sup.start("a", ["true"])
        deadline = time.monotonic() + 30
        while not any(e.kind == "exited" for e in seen):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await sup.close()
        return [e.kind async for e in stream]

    kinds = asyncio.run(main())
    assert kinds[:2] == ["created", "exited"], kinds  # was []


def test_an_events_iterator_given_up_keeps_nothing_after_it() -> None:
    # A reader that takes what it waits for and leaves (break: the generator is
    # closed) while on_event goes on: every later event, and each removed key's
    # last output_buffer of output, stayed queued for nobody (the growth the
    # change was for).
    bound = 64 << 10

    async def main() -> int:
        seen: list[Event] = []
        async with AsyncSupervisor(on_event=seen.append, output_buffer=bound,
                                   grace=1.0, kill_timeout=2.0) as sup:
            stream = sup.events()
            await sup.start("first", ["true"])
            async for ev in stream:
                if ev.kind == "exited":
                    break
            await stream.aclose()  # type: ignore[attr-defined]
            await sup.remove("first")
            for k in range(6):
                await sup.start(k, ["sh", "-c", f"head -c {bound} /dev/zero"],
                                output="events")
            deadline = time.monotonic() + 60
            while sum(1 for e in seen if e.kind == "exited" and e.key != "first") < 6:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            for k in range(6):
                await sup.remove(k)
            return sum(sup._unread_size.values()) + sup._queue.qsize()

    held = asyncio.run(main())
    assert held == 0, f"{held} bytes and events kept for an events() given up"


def test_an_events_stream_dropped_unread_keeps_nothing() -> None:
    # events() called and never iterated (no first step, so no finally runs):
    # the supervisor kept queueing for it for ever.
    bound = 64 << 10

    async def main() -> int:
        seen: list[Event] = []
        async with AsyncSupervisor(on_event=seen.append, output_buffer=bound,
                                   grace=1.0, kill_timeout=2.0) as sup:
            stream = sup.events()
            del stream
            gc.collect()
            for k in range(3):
                await sup.start(k, ["sh", "-c", f"head -c {bound} /dev/zero"],
                                output="events")
            deadline = time.monotonic() + 60
            while sum(1 for e in seen if e.kind == "exited") < 3:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            for k in range(3):
                await sup.remove(k)
            return sum(sup._unread_size.values()) + sup._queue.qsize()

    held = asyncio.run(main())
    assert held == 0, f"{held} bytes and events kept for an events() dropped unread"


# -- a terminal's ^C (SI_KERNEL) ----------------------------------------------------------

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
time.sleep(0.5)
print(n, flush=True)
"""

_TTY_CALLER = """
import fcntl, os, signal, subprocess, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the pty is our terminal (we lead a session)
from proctable.lineage import Lineage
mode, count = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's ^C reaches us too
lin = Lineage.spawn([sys.executable, "-c", count, str(int(signal.SIGINT))], mode=mode,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
assert lin.process.stdout is not None and lin.process.stdin is not None
assert lin.process.stdout.readline() == b"ready\\n"
print("ready", flush=True)
sys.stdin.readline()  # the ^C has been typed and a line after it
lin.process.stdin.write(b"count\\n")
lin.process.stdin.close()
got = lin.process.stdout.readline()
lin.process.stdout.close()
lin.process.wait(timeout=20)
lin.terminate(grace=1.0)
print("count", got.decode().strip(), flush=True)
"""


@pytest.mark.parametrize("mode", REAPER_MODES)
def test_a_terminals_interrupt_reaches_the_command_once(mode: str) -> None:
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
        time.sleep(1.0)  # every copy is on its way by then (a missing one fails nothing)
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
