"""The seccomp launcher itself: each rule denies what it says, and only that."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ._faults import ERRNOS, deny
from ._reliability import linux_only
from .conftest import needs_root

pytestmark = linux_only

# Each probe prints "denied <errno>" or "allowed", and checks that the call's
# neighbours (the same syscall with other arguments) still work.
PROBES = {
    "pidfd_open": "os.pidfd_open(os.getpid())",
    "pidfd_send_signal": "signal.pidfd_send_signal(os.pidfd_open(os.getpid()), 0)",
    "waitid_pidfd": (
        "pid = os.fork()\n"
        "if pid == 0: os._exit(3)\n"
        "fd = os.pidfd_open(pid)\n"
        "try:\n"
        "    os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOWAIT)\n"
        "finally:\n"
        "    assert os.waitid(os.P_PID, pid, os.WEXITED).si_status == 3"),
    "pidfd_get_info": "fcntl.ioctl(os.pidfd_open(os.getpid()), 0xC040FF0B, bytearray(64), True)",
    "netlink_connector": (
        "socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).close()\n"
        "socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 11)"),
    "subreaper": (
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.prctl(1, 0, 0, 0, 0) == 0  # PR_SET_PDEATHSIG: another prctl\n"
        "if libc.prctl(36, 1, 0, 0, 0) != 0:\n"
        "    raise OSError(ctypes.get_errno(), 'prctl')"),
}

WRAP = """
import ctypes, errno, fcntl, os, signal, socket
try:
{body}
    print("allowed")
except OSError as e:
    print("denied", errno.errorcode[e.errno])
"""


def _probe(rule: str, err: str, body_rule: str) -> str:
    body = "\n".join("    " + line for line in PROBES[body_rule].splitlines())
    r = subprocess.run([*deny(rule, err), sys.executable, "-c", WRAP.format(body=body)],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize("err", ERRNOS)
@pytest.mark.parametrize("rule", sorted(PROBES))
def test_each_rule_denies_its_call_with_the_errno(rule: str, err: str) -> None:
    assert _probe(rule, err, rule) == f"denied {err}"
    assert _probe("none", err, rule) == "allowed"


@pytest.mark.parametrize(("rule", "other"), [
    ("pidfd_open", "netlink_connector"), ("pidfd_open", "subreaper"),
    ("netlink_connector", "pidfd_open"), ("subreaper", "waitid_pidfd"),
    ("waitid_pidfd", "pidfd_get_info"), ("pidfd_get_info", "pidfd_send_signal"),
])
def test_a_rule_denies_nothing_else(rule: str, other: str) -> None:
    assert _probe(rule, "EPERM", other) == "allowed"


def test_clone3_eperm_stops_threads_and_enosys_does_not() -> None:
    code = ("import threading\n"
            "try:\n"
            "    t = threading.Thread(target=lambda: None); t.start(); t.join(); print('ok')\n"
            "except RuntimeError: print('no threads')\n")
    out = {e: subprocess.run([*deny("clone3", e), sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=60,
                             check=False).stdout.strip() for e in ERRNOS}
    # glibc falls back to clone() only on ENOSYS, as on an old kernel.
    assert out == {"EPERM": "no threads", "ENOSYS": "ok"}


@needs_root
def test_ro_cgroup_makes_the_cgroup_mount_read_only() -> None:
    code = ("import os, errno\n"
            "try:\n"
            "    os.mkdir('/sys/fs/cgroup/unified/proctable-ro-probe')\n"
            "    os.rmdir('/sys/fs/cgroup/unified/proctable-ro-probe'); print('writable')\n"
            "except OSError as e: print(errno.errorcode[e.errno])\n")
    r = subprocess.run([*deny("none", ro_cgroup=True), sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "EROFS"
