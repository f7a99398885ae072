"""Real faults for the reliability tests: a seccomp launcher and a read-only cgroup mount.

``deny(rules, errno)`` is the argv prefix that runs a command with those system
calls answered by errno, through tests/faults/deny.c (compiled once per session
with the C compiler the build uses). Nothing here monkeypatches Python: the
kernel itself refuses, as a container runtime's profile or a sandbox would.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Optional

import pytest

from ._lineage import kill_identity

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / "faults" / "deny.c"

RULES = ("pidfd_open", "pidfd_send_signal", "waitid_pidfd", "pidfd_get_info",
         "netlink_connector", "clone3", "subreaper", "bpf")
ERRNOS = ("EPERM", "ENOSYS")

_built: Optional[str] = None


def launcher() -> str:
    """The compiled launcher's path (built on first use); skips without a compiler."""
    global _built
    if _built is not None:
        return _built
    if not sys.platform.startswith("linux"):
        pytest.skip("seccomp filters are Linux only")
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build tests/faults/deny.c")
    out = pathlib.Path(tempfile.mkdtemp(prefix="proctable-deny-")) / "deny"
    r = subprocess.run([cc, "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(out),
                        str(SOURCE)], capture_output=True, text=True, timeout=120, check=False)
    if r.returncode != 0:
        pytest.fail(f"building the seccomp launcher failed:\n{r.stderr}")
    # Readable and runnable by the uid the unprivileged tests drop to.
    os.chmod(out.parent, 0o755)
    os.chmod(out, 0o755)
    _built = str(out)
    return _built


def deny(rules: str, errno: str = "EPERM", ro_cgroup: bool = False) -> list[str]:
    """The argv prefix: ``[*deny(...), sys.executable, "-c", code]`` runs code denied."""
    argv = [launcher(), "--errno", errno]
    if ro_cgroup:
        argv.append("--ro-cgroup")
    return [*argv, rules, "--"]


def _marked_identities(mark: str) -> list[Any]:
    """Identities of running processes (not zombies) whose environment carries
    PROCTABLE_FAULT_MARK=mark: what a fault scenario started and left behind."""
    import proctable

    tag = f"PROCTABLE_FAULT_MARK={mark}".encode()
    out = []
    for p in proctable.snapshot(memory=False):
        if p.state == "Z" and (p.num_threads or 1) <= 1:
            continue
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                if tag in f.read().split(b"\0"):
                    out.append(p.identity)
        except OSError:
            continue
    return out


def run_marked(argv: list[str], mark: str,
               timeout: float = 180.0) -> tuple[int, str, str, list[int]]:
    """Run argv with PROCTABLE_FAULT_MARK=mark; (returncode, stdout, stderr, pids of
    marked processes it left running). Those are SIGKILLed, each through a pidfd
    while its pid is still that process. Output goes to files, not pipes: a process
    left behind holds what it inherited, and a pipe would then never end."""

    env = {**os.environ, "PROCTABLE_FAULT_MARK": mark}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as errs:
        try:
            rc = subprocess.run(argv, stdout=out, stderr=errs, timeout=timeout, env=env,
                                check=False).returncode
        finally:
            left = _marked_identities(mark)
            for ident in left:
                kill_identity(ident)
        out.seek(0)
        errs.seek(0)
        return rc, out.read(), errs.read(), [ident.pid for ident in left]
