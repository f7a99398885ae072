"""A soak of the supervisor under churn: nothing lost, nothing left running, nothing growing.

    python scripts/soak.py --seconds 1800          # the documented 30-minute run
    python scripts/soak.py --seconds 60 --json     # what the suite runs

A Supervisor runs --keys keys whose commands randomly exit 0, crash, die by a
signal, ignore SIGTERM, or leave an escaped child (setsid, nohup ... &) behind;
restart policies with random delays bring them back; a driver randomly stops,
removes and re-adds keys. Beside it: a churn helper starts and reaps --churn
unrelated processes a second, a Scanner refreshes the table, and an
ExitWatcher watches unrelated processes. All along it checks, from the outside:

- per key, generations only grow; exactly one ``exited`` per generation, after
  its ``created``; nothing of a generation after ``deleted``;
- after ``stop(key)`` or ``remove(key)`` returns, no generation of it starts
  until the driver starts it again (stop always wins over a pending restart);
- after ``remove(key)`` returns, no process of that key runs (found by a marker
  in its environment, which escaped children inherit, in the process table:
  not by asking the supervisor); after ``close()``, none of any key;
- every watch resolves exactly once;
- this process's RSS and open fds stay flat (sampled after a warm-up).

It prints a summary (JSON with --json) and exits 1 if anything was violated.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from typing import Any, Optional

import proctable
from proctable import RestartPolicy, Supervisor

PY = sys.executable
MARK = f"proctable-soak-{os.getpid()}"

# What one run of a key does. The key's marker is in the environment of every
# process it starts (PROCTABLE_SOAK), which its escaped children inherit too.
BEHAVIOURS = {
    "exit0": "import time, random; time.sleep(random.uniform(0.05, 1.5))",
    "crash": "import time, random, sys; time.sleep(random.uniform(0.05, 1.0)); sys.exit(3)",
    "signal": ("import os, time, random, signal; time.sleep(random.uniform(0.05, 1.0)); "
               "os.kill(os.getpid(), random.choice([signal.SIGKILL, signal.SIGSEGV]))"),
    "ignore_term": ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                    "time.sleep(30)"),
    "escape": ("import subprocess, time; "
               "subprocess.Popen(['setsid', 'sleep', '300']); "
               "subprocess.Popen(['sh', '-c', 'nohup sleep 301 >/dev/null 2>&1 &']); "
               "time.sleep(0.3)"),
    "long": "import time; time.sleep(60)",
}

CHURN = r"""
import os, sys, time
rate = float(sys.argv[1])
gap = 1.0 / rate if rate > 0 else 1.0
n = 0
while True:
    t = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    n += 1
    if n % 100 == 0:
        sys.stdout.write(f"{n}\n"); sys.stdout.flush()
    left = gap - (time.monotonic() - t)
    if left > 0:
        time.sleep(left)
"""


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def pidfd_count() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]"
        except OSError:
            pass  # closed meanwhile
    return n


def marked_pids(key: str) -> list[tuple[int, str]]:
    """(pid, name) of every live process whose environment carries key's marker."""
    tag = f"PROCTABLE_SOAK={MARK}:{key}".encode()
    out = []
    for p in proctable.snapshot(memory=False):
        if p.state == "Z" and (p.num_threads or 1) <= 1:
            continue  # a zombie is not running (its parent has yet to reap it)
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if tag in env:
            out.append((p.pid, p.name))
    return out


class Checker:
    """The event-order invariants, checked as events arrive."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events = 0
        self.kinds: dict[str, int] = defaultdict(int)
        self.violations: list[str] = []
        self.last_gen: dict[str, int] = {}
        self.open_gens: dict[str, set[int]] = defaultdict(set)   # created, no exited yet
        self.exited: dict[str, set[int]] = defaultdict(set)
        self.deleted: dict[str, int] = {}                         # key -> gen at deleted
        self.stopped: set[str] = set()   # stop()/remove() returned, no start() since
        self.started = 0

    def bad(self, text: str) -> None:
        if len(self.violations) < 200:
            self.violations.append(text)

    def __call__(self, ev: Any) -> None:
        with self.lock:
            self.events += 1
            self.kinds[ev.kind] += 1
            key, gen = ev.key, ev.generation
            if ev.kind == "created":
                self.started += 1
                if key in self.stopped:
                    self.bad(f"{key}: generation {gen} started after stop()/remove() returned")
                if gen <= self.last_gen.get(key, 0):
                    self.bad(f"{key}: created generation {gen} after {self.last_gen[key]}")
                self.last_gen[key] = gen
                self.open_gens[key].add(gen)
                self.deleted.pop(key, None)
            elif ev.kind == "exited":
                if gen in self.exited[key]:
                    self.bad(f"{key}: a second exited for generation {gen}")
                if gen not in self.open_gens[key]:
                    self.bad(f"{key}: exited for generation {gen} without created")
                self.open_gens[key].discard(gen)
                self.exited[key].add(gen)
            elif ev.kind == "deleted":
                if self.open_gens[key]:
                    self.bad(f"{key}: deleted while generations {self.open_gens[key]} "
                             "had no exited")
                self.deleted[key] = gen
            elif key in self.deleted and ev.kind != "teardown_failed":
                self.bad(f"{key}: {ev.kind} of generation {gen} after deleted")


def args_for(key: object, rng: random.Random) -> list[str]:
    return [PY, "-c", BEHAVIOURS[rng.choice(list(BEHAVIOURS))]]


def policy(rng: random.Random) -> RestartPolicy:
    # A clean exit reruns with a new random behaviour; a crash with the same one.
    return RestartPolicy(fresh=lambda key: args_for(key, rng),
                         delay=rng.choice([0.0, 0.0, 0.05, 0.2]), max_restarts=10**6,
                         max_fast_exits=10**6, fast_exit=0.0)


def env_for(key: str) -> dict[str, str]:
    return {**os.environ, "PROCTABLE_SOAK": f"{MARK}:{key}"}


def run(seconds: float, keys: int, churn: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    check = Checker()
    stop = threading.Event()
    churner = subprocess.Popen([PY, "-c", CHURN, str(churn)], stdout=subprocess.PIPE,
                               stdin=subprocess.DEVNULL)
    churned = [0]

    def read_churn() -> None:
        assert churner.stdout is not None
        for line in churner.stdout:
            churned[0] = int(line)

    scans = [0]
    # (time, fds open minus the Scanner's own and the pidfds, live lineages): a
    # lineage holds a few fds (pipes, its cgroup) and a pidfd per member, so fds
    # follow how many keys run; what must stay flat is the fds per live lineage.
    fd_samples: list[tuple[float, int, int]] = []
    sup_ref: list[Any] = []
    fds_start = fd_count()
    watched = {"asked": 0, "resolved": 0, "twice": 0}
    watcher = proctable.ExitWatcher()

    def scan_loop() -> None:
        with proctable.Scanner() as s:
            while not stop.wait(0.2):
                table = s.refresh()
                scans[0] += 1
                if sup_ref:
                    running = sum(1 for k in names if sup_ref[0].lineage(k) is not None)
                    fd_samples.append((time.monotonic(),
                                       fd_count() - s.open_fds - pidfd_count(), running))
                if len({p.pid for p in table}) != len(table):
                    check.bad("a Scanner table listed a pid twice")
                # Watch a few unrelated, short-lived processes (the churn's).
                kids = table.children(churner.pid)
                for p in kids[:3]:
                    try:
                        fut = watcher.watch(p.identity)
                    except proctable.ProctableError:
                        continue
                    watched["asked"] += 1
                    seen: list[int] = []

                    def done(_f: Any, seen: list[int] = seen) -> None:
                        seen.append(1)
                        with check.lock:
                            watched["resolved"] += 1
                            if len(seen) > 1:
                                watched["twice"] += 1

                    fut.add_done_callback(done)

    names = [f"k{i}" for i in range(keys)]
    threads = [threading.Thread(target=read_churn, daemon=True),
               threading.Thread(target=scan_loop, daemon=True)]
    for t in threads:
        t.start()

    sup = Supervisor(on_event=check, grace=0.5, kill_timeout=2.0)
    sup_ref.append(sup)
    live: set[str] = set()
    removed_left: list[str] = []
    ops = defaultdict(int)
    t0 = time.monotonic()
    warm_at = t0 + min(10.0, seconds / 4)
    rss0 = fds0 = None
    rss_samples: list[int] = []
    try:
        for k in names:
            sup.start(k, args_for(k, rng), restart=policy(rng), env=env_for(k))
            live.add(k)
        # The time asked for; on a machine too loaded to fit a remove and a stop in
        # it, on until each happened (bounded: four times the time).
        while (time.monotonic() - t0 < seconds
               or (not (ops["remove"] and ops["stop"])
                   and time.monotonic() - t0 < 4 * seconds)):
            if rss0 is None and time.monotonic() >= warm_at:
                rss0, fds0 = rss_kib(), fd_count()
            if rss0 is not None:
                rss_samples.append(rss_kib())
            k = rng.choice(names)
            r = rng.random()
            if time.monotonic() - t0 > seconds / 2 and k in live:
                # On a loaded machine few operations fit in a short run: make sure
                # each kind happened at least once.
                if not ops["remove"]:
                    r = 0.0
                elif not ops["stop"]:
                    r = 0.2
            try:
                if k in live and r < 0.15:
                    sup.remove(k)
                    with check.lock:
                        check.stopped.add(k)
                    ops["remove"] += 1
                    live.discard(k)
                    left = marked_pids(k)
                    if left:
                        removed_left.append(f"{k}: {left}")
                        check.bad(f"{k}: processes ran after remove() returned: {left}")
                elif k in live and r < 0.30:
                    sup.stop(k)
                    with check.lock:
                        check.stopped.add(k)
                    ops["stop"] += 1
                elif r < 0.60:
                    with check.lock:
                        check.stopped.discard(k)
                    sup.start(k, args_for(k, rng), restart=policy(rng), env=env_for(k))
                    ops["start"] += 1
                    live.add(k)
            except proctable.TeardownError as e:
                check.bad(f"{k}: TeardownError {e}")
            time.sleep(rng.uniform(0.0, 0.05))
    finally:
        stop.set()
        close_t0 = time.monotonic()
        sup.close()
        close_s = time.monotonic() - close_t0
        for t in threads[1:]:
            t.join(5)
        watcher.close()
        churner.kill()
        churner.wait(10)
        threads[0].join(5)
    left_after_close = [(k, p) for k in names for p in marked_pids(k)]
    if left_after_close:
        check.bad(f"processes of closed keys still run: {left_after_close[:10]}")
    rss1 = rss_kib()
    # fds: per live lineage (beyond the fds this process had before the
    # supervisor), the first and the last tenth of the run after the warm-up; the
    # Scanner's kept fds and the pidfds left out (they follow the host's process
    # count and the members' count).
    ratios = [(n - fds_start) / running for t, n, running in fd_samples
              if t >= warm_at and running >= 5]
    tenth = max(1, len(ratios) // 10)

    def median(xs: list[float]) -> Optional[float]:
        return round(sorted(xs)[len(xs) // 2], 2) if xs else None

    fds_early, fds_late = median(ratios[:tenth]), median(ratios[-tenth:])
    return {
        "seconds": round(time.monotonic() - t0, 1),
        "keys": keys,
        "seed": seed,
        "events": check.events,
        "by_kind": dict(check.kinds),
        "processes_started_by_supervisor": check.started,
        "unrelated_processes_churned": churned[0],
        "scanner_refreshes": scans[0],
        "watches": watched,
        "operations": dict(ops),
        "close_seconds": round(close_s, 2),
        "rss_kib": {"after_warmup": rss0, "end": rss1,
                    "max": max(rss_samples) if rss_samples else None},
        "fds": {"start": fds_start, "after_warmup": fds0, "after_close": fd_count(),
                "per_lineage_early": fds_early, "per_lineage_late": fds_late,
                "per_lineage_max": round(max(ratios), 2) if ratios else None},
        "violations": check.violations,
    }


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1800.0)
    ap.add_argument("--keys", type=int, default=50)
    ap.add_argument("--churn", type=float, default=300.0,
                    help="unrelated processes started and reaped a second")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(2**32)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    res = run(a.seconds, a.keys, a.churn, seed)
    if a.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k}: {v}")
    return 1 if res["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
