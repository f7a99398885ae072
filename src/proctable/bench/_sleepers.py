"""The bench's population: sleeping processes started by one helper process and
stopped by pid. The helper and every sleeper die with their parent
(PR_SET_PDEATHSIG), the helper kills and reaps them when its stdin closes, and
``Sleepers.close()`` waits for all of that with bounded waits, then checks every pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import TracebackType
from typing import Callable, Optional

from .. import _ended
from .._fdwait import readable
from ..table import read, snapshot

__all__ = ["CHAIN", "Sleepers"]

# The helper: forks n sleepers (each execs `sleep`, dies with the helper) and
# one chain of CHAIN processes (each the child of the one before, in its own
# process group) for the subtree rows; prints their pids; when its stdin
# closes (or reads anything), kills them all and reaps them, then exits.
_HELPER = r"""
import os, signal, sys
parent, n, chain = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
try:
    import ctypes
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except Exception:
    _prctl = None
def die_with_parent(expected):
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)          # PR_SET_PDEATHSIG
    if os.getppid() != expected:           # the parent died before that
        os._exit(0)
def become_sleeper(parent_pid):
    die_with_parent(parent_pid)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        os.execv("/bin/sleep", ["sleep", "3600"])
    except OSError:
        os.execvp("sleep", ["sleep", "3600"])
signal.signal(signal.SIGINT, signal.SIG_IGN)   # the bench stops us, by closing our stdin
die_with_parent(parent)
if _prctl is not None:
    _prctl(36, 1)                          # PR_SET_CHILD_SUBREAPER: the chain's orphans come here
me = os.getpid()
out = sys.stdout
pids, batch = [], []
try:
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                become_sleeper(me)
            finally:
                os._exit(127)
        pids.append(pid)
        batch.append(str(pid))
        if len(batch) == 100 or i == n - 1:
            out.write("pids " + " ".join(batch) + "\n")
            out.flush()
            batch = []
    if chain:
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, 0)
                up = me
                for depth in range(chain):
                    die_with_parent(up)
                    out.write("chain %d\n" % os.getpid())
                    out.flush()
                    up = os.getpid()
                    if depth + 1 == chain or os.fork() != 0:
                        become_sleeper(os.getppid())
            finally:
                os._exit(127)
        pids.append(pid)
    out.write("ready\n")
    out.flush()
    sys.stdin.buffer.read(1)
finally:
    signal.alarm(20)                       # bounded: the reaping below cannot hang
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)   # a chain member's child dies with it
        except OSError:
            pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
"""

CHAIN = 5  # the subtree of the descendants rows: a root and 4 below it


class Sleepers:
    """n sleeping processes (and a 5-process chain) that die with this process.

    Use as a context manager, or call ``close()``: it closes the helper's
    stdin (the helper then kills and reaps every sleeper), waits for the
    helper (bounded), kills it by pid if it does not exit, and finally checks
    every sleeper pid: whatever still holds the start time it had is killed.
    Spawn from the main thread (PR_SET_PDEATHSIG follows the spawning thread).
    """

    def __init__(
        self, n: int, chain: int = CHAIN, progress: Optional[Callable[[int, int], None]] = None
    ) -> None:
        self.n = n
        self.pids: list[int] = []
        self.chain: list[int] = []
        self._idents: list[tuple[int, int]] = []
        self._helper: Optional[subprocess.Popen[bytes]] = None
        try:
            self._spawn(n, chain, progress)
        except BaseException:
            self.close()
            raise

    def _spawn(
        self, n: int, chain: int, progress: Optional[Callable[[int, int], None]]
    ) -> None:
        self._helper = subprocess.Popen(
            [sys.executable, "-c", _HELPER, str(os.getpid()), str(n), str(chain)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C reaches the bench, which stops it by pid
        )
        assert self._helper.stdout is not None
        fd = self._helper.stdout.fileno()
        deadline = time.monotonic() + 60 + n * 0.02
        pending = b""
        ready = False
        while not ready or len(self.chain) < chain:  # the chain reports on its own
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"starting {n} sleepers took too long")
            r = readable([fd], min(left, 1.0))
            if not r:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the sleeper helper exited (status {self._helper.poll()})")
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                word, *rest = raw.decode("ascii", "replace").split() or [""]
                if word == "pids":
                    self.pids.extend(int(x) for x in rest)
                    if progress is not None:
                        progress(len(self.pids), n)
                elif word == "chain":
                    self.chain.append(int(rest[0]))
                elif word == "ready":
                    ready = True
        if len(self.pids) != n or len(self.chain) != chain:
            raise RuntimeError(f"the sleeper helper started {len(self.pids)} of {n} sleepers")
        # The chain's leaves may still be between fork and exec: wait (bounded)
        # until every pid shows, then remember each one's start time.
        want = [*self.pids, *self.chain]
        deadline = time.monotonic() + 30
        while True:
            table = snapshot()
            rows = [table.get(pid) for pid in want]
            if all(r is not None and r.name == "sleep" for r in rows) or (
                time.monotonic() > deadline
            ):
                break
            time.sleep(0.01)
        helper = read(self._helper.pid)
        self._idents = [(r.pid, r.start_time) for r in [helper, *rows] if r is not None]

    @property
    def all_pids(self) -> list[int]:
        return [*self.pids, *self.chain]

    @property
    def idents(self) -> list[tuple[int, int]]:
        """(pid, start time) of the helper and every sleeper, the chain's included."""
        return list(self._idents)

    def close(self, timeout: float = 20.0) -> None:
        """Stop every sleeper and the helper; returns within about timeout + 2 s."""
        helper, self._helper = self._helper, None
        if helper is not None:
            try:
                if helper.stdin is not None:
                    helper.stdin.close()
            except OSError:
                pass
            try:
                helper.wait(timeout)
            except subprocess.TimeoutExpired:
                helper.kill()  # its sleepers die with it (PR_SET_PDEATHSIG)
                try:
                    helper.wait(2.0)
                except subprocess.TimeoutExpired:
                    pass
            if helper.stdout is not None:
                helper.stdout.close()
        # Whatever still holds a sleeper's (pid, start time) is a sleeper left behind.
        for pid, start in self._idents:
            row = read(pid, memory=False)
            if not _ended.ended(None, row, start):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self._idents = []

    def __enter__(self) -> Sleepers:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()
