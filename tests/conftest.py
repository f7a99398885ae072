"""Shared helpers: real processes, bounded waits, cleanup by pid."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

import proctable
from proctable import _pidfd
from proctable.exits._watcher import _reset_default_watcher

PY = sys.executable

# A prefix that runs a command with SIGINT and SIGQUIT at their default action: a
# suite run as a background job (both ignored) passes them on ignored to a plain
# Popen, and a test that interrupts its child with SIGINT (or ^C on a terminal)
# must not depend on how the suite itself was started.
DEFAULT_SIGNALS = [PY, "-c", "import os, signal, sys\n"
                   "for s in (signal.SIGINT, signal.SIGQUIT):\n"
                   "    signal.signal(s, signal.SIG_DFL)\n"
                   "os.execvp(sys.argv[1], sys.argv[1:])\n"]


def build_c(d: Path, name: str, source: str, *flags: str, skip_if_broken: bool = False) -> str:
    """Compile a test's C program (source) into d/name with the system compiler;
    its path. Skips the test where there is no compiler; a program that does not
    build fails it (skips instead with skip_if_broken: one that only some hosts
    can build)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip(f"no C compiler here to build {name}")
    src = d / f"{name}.c"
    src.write_text(source)
    exe = d / name
    r = subprocess.run([cc, "-O1", *flags, "-o", str(exe), str(src)], capture_output=True,
                       text=True, timeout=120, check=False)
    if r.returncode != 0:
        (pytest.skip if skip_if_broken else pytest.fail)(
            f"{name} does not build here: {r.stderr[-500:]}")
    return str(exe)


def lasting_differences(rounds: list[tuple[dict[str, Any], dict[str, Any]]],
                        moving: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """The (pid, attribute) pairs on which two readers' tables (pid -> info dict,
    as JSON gives them) disagree in every round that has the same process in both
    (by create_time); attributes in moving are not compared. On a shared host
    processes come, go and change between two reads, and such a difference proves
    nothing; one that lasts through every round does."""
    lasting: Optional[set[tuple[str, str]]] = None

    def same(k: str, x: Any, y: Any) -> bool:
        # A kernel worker's name ends with the workqueue it serves at this moment
        # ("kworker/u8:2-events_unbound"): a busy one moves between two reads,
        # every round (seen once under load).
        if k == "name" and isinstance(x, str) and isinstance(y, str) and \
                x.startswith("kworker/") and y.startswith("kworker/"):
            return x.split("-", 1)[0] == y.split("-", 1)[0]
        return bool(x == y)

    for a, b in rounds:
        differ = {(pid, k) for pid in set(a) & set(b)
                  if a[pid].get("create_time") == b[pid].get("create_time")
                  for k in a[pid] if k not in moving and not same(k, a[pid][k], b[pid].get(k))}
        lasting = differ if lasting is None else lasting & differ
    return sorted(lasting or ())


def run_in_pid_namespace(code: str, *args: str, timeout: float = 180
                         ) -> subprocess.CompletedProcess[str]:
    """``python -c code *args`` as pid 1 of a private pid namespace with its own
    /proc (``unshare -p -f --mount-proc``), in a session of its own; skips where
    no such namespace can be made."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare(1) to make a private pid namespace")
    r = subprocess.run([unshare, "-p", "-f", "--mount-proc", PY, "-c", code, *args],
                       capture_output=True, text=True, timeout=timeout, check=False,
                       start_new_session=True)
    if r.returncode != 0 and ("Operation not permitted" in r.stderr
                              or "Permission denied" in r.stderr):
        pytest.skip(f"no private pid namespace here: {r.stderr.strip()[-200:]}")
    return r

# The leaked-process plugin's tests run small test files in a pytest of their own.
pytest_plugins = ["pytester"]


def wait_until(
    pred: Callable[[], object], timeout: float = 10.0, interval: float = 0.005
) -> object:
    """Poll pred until it returns a true value; fail the test after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s: {pred}")
        time.sleep(interval)


def wait_zombie(pid: int, timeout: float = 10.0) -> proctable.Proc:
    """Wait until pid is a whole-process zombie (state Z, one thread)."""

    def is_zombie() -> Optional[proctable.Proc]:
        p = proctable.read(pid)
        return p if p is not None and p.state == "Z" and p.num_threads == 1 else None

    return wait_until(is_zombie, timeout)  # type: ignore[return-value]


class Procs:
    """Processes a test started: killed and reaped by pid at the end."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[bytes]] = []
        self.pids: list[int] = []  # forked children (os.fork) to reap

    def popen(self, args: list[str], **kw: object) -> subprocess.Popen[bytes]:
        p: subprocess.Popen[bytes] = subprocess.Popen(args, **kw)  # type: ignore[call-overload]
        self.popens.append(p)
        return p

    def py(self, code: str, **kw: object) -> subprocess.Popen[bytes]:
        return self.popen([PY, "-c", code], **kw)

    def cleanup(self) -> None:
        # What they started in turn (a shell's `sleep`) is the test's too: found
        # before the parents die (an orphan leaves their tree), ended by identity.
        running = [p.pid for p in self.popens if p.returncode is None] + self.pids
        below: list[proctable.Identity] = []
        if running:
            table = proctable.snapshot(memory=False)
            below = [d.identity for pid in running for d in table.descendants(pid)]
        for p in self.popens:
            if p.returncode is None:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:  # pragma: no cover
                    pass
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        for ident in below:
            if ident.alive():
                proctable.terminate(ident, grace=0.0, kill_timeout=5.0)


@pytest.fixture
def procs() -> Iterator[Procs]:
    ps = Procs()
    try:
        yield ps
    finally:
        ps.cleanup()


def is_root() -> bool:
    return os.geteuid() == 0


needs_root = pytest.mark.skipif(not is_root(), reason="needs root (to drop to uid 65534)")


def run_as_nobody(fn: Callable[[], object], timeout: float = 20.0, uid: int = 65534) -> object:
    """Run fn in a forked child that dropped to uid/gid 65534 (or ``uid``); return
    its repr'd result.

    The child reports over a pipe with repr(); exceptions come back as
    ("error", repr(exc)). The child is reaped here, and killed if it overruns.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            result = ("ok", fn())
        except BaseException as exc:  # report everything to the parent
            result = ("error", repr(exc))
        os.write(w, repr(result).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        import select

        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail("unprivileged child did not answer in time")
            ready, _, _ = select.select([r], [], [], left)
            if not ready:
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
    import ast

    return ast.literal_eval(b"".join(chunks).decode())


# Exit-source modes: the tests of the watcher and of terminate run once per mode.
EXIT_MODES = {"native": "", "no_pidfd_info": "pidfd_info", "no_pidfd": "pidfd"}
KERNEL_PIDFD, KERNEL_PIDFD_INFO = _pidfd._probe_kernel().pidfd, _pidfd._probe_kernel().info


@pytest.fixture(params=list(EXIT_MODES))
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test with a set of sources turned off; the shared watcher follows."""
    name: str = request.param
    if name != "no_pidfd" and not KERNEL_PIDFD:
        pytest.skip("no pidfds on this kernel")
    monkeypatch.setenv(_pidfd.DISABLE_ENV, EXIT_MODES[name])
    _reset_default_watcher()
    try:
        yield name
    finally:
        _reset_default_watcher()


@pytest.fixture
def track() -> Iterator[Any]:
    """Lineages and pids a test started, torn down / killed by pid at the end (and
    every cgroup the test created removed): see tests/_lineage.py."""
    from ._lineage import tracker

    yield from tracker()


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """A fresh state directory for a durable supervisor (0700); at the end nothing of
    its sessions may run: see tests/_durable.py."""
    from ._durable import state_dir

    yield from state_dir(tmp_path)
