"""What ``proctable top`` costs: its own process CPU time while it refreshes.

``proctable top`` runs on a pseudo-terminal (as in a terminal window, redrawing
in place) or in batch mode, beside ``procs`` extra sleeping processes; its CPU
time (utime + stime of its process, which load on the machine does not inflate
much) is read over a window after a warm-up, and given as % of one core.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import threading
import time
from typing import Any, Optional

from ..lineage import Lineage
from ..table import read, snapshot

__all__ = ["top_cost"]


def _cpu(pid: int) -> float:
    row = read(pid, memory=False)
    if row is None or row.utime is None or row.stime is None:
        raise RuntimeError(f"proctable top (pid {pid}) is gone")
    return row.utime + row.stime


def _drain(fd: int, stop: threading.Event, frames: list[int]) -> None:
    # A terminal that nobody reads fills up and blocks the writer: read it all.
    while not stop.is_set():
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                data = os.read(fd, 65536)
            except OSError:
                return
            if not data:
                return
            frames[0] += data.count(b"\033[J")


def top_cost(procs: int = 2000, seconds: float = 30.0, interval: float = 1.0,
             warmup: float = 3.0, batch: bool = False) -> dict[str, Any]:
    """CPU of ``proctable top -d interval`` over ``seconds``, with ``procs`` extra
    sleeping processes on the host; on a pseudo-terminal, or in batch mode."""
    from ._sleepers import Sleepers  # noqa: PLC0415 - the bench helpers load only here

    with Sleepers(procs) if procs else _Nothing():
        host = len(snapshot(memory=False))
        args = [sys.executable, "-m", "proctable", "top", "-d", str(interval)]
        master = slave = -1
        lin: Optional[Lineage] = None
        stop = threading.Event()
        frames = [0]
        if batch:
            p = subprocess.Popen([*args, "-n", "100000"], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL)
            assert p.stdout is not None
            reader = threading.Thread(target=_drain, args=(p.stdout.fileno(), stop, frames))
        else:
            master, slave = pty.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
            # On its own terminal, set up by the lineage's helper before exec (no
            # preexec_fn in a threaded process); scan mode: the Popen is top itself.
            lin = Lineage.spawn(args, mode="scan", terminal=slave)
            p = lin.process
            reader = threading.Thread(target=_drain, args=(master, stop, frames))
        reader.start()
        try:
            time.sleep(warmup)
            c0, t0, f0 = _cpu(p.pid), time.monotonic(), frames[0]
            time.sleep(seconds)
            c1, t1, f1 = _cpu(p.pid), time.monotonic(), frames[0]
        finally:
            if batch:
                p.terminate()
            else:
                os.write(master, b"q")
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
            if lin is not None:
                lin.terminate(grace=1.0)
            stop.set()
            reader.join(timeout=5)
            if p.stdout is not None:
                p.stdout.close()
            for fd in (master, slave):
                if fd >= 0:
                    os.close(fd)
    wall = t1 - t0
    return {
        "mode": "batch" if batch else "terminal",
        "host_processes": host,
        "interval": interval,
        "seconds": wall,
        "refreshes": (f1 - f0) if not batch else None,
        "cpu_seconds": c1 - c0,
        "cpu_percent_of_core": 100.0 * (c1 - c0) / wall,
        "load": os.getloadavg(),
    }


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":  # pragma: no cover
    import json

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for batch in (False, True):
        print(json.dumps(top_cost(procs=n, batch=batch)))
