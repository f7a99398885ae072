"""cgroup v2 for lineages: find a writable cgroup, make a child, read it, freeze and kill it.

Only cgroups this module created are ever written to (besides moving the
lineage's own reaper into one, which the reaper does itself), and each is removed
again by its owner.
"""

from __future__ import annotations

import errno
import os
import select
import time
from typing import Optional

from .._pidfd import disabled

__all__ = ["Cgroup", "own_cgroup", "usable_parent", "v2_mount"]

def _unescape(path: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    if "\\" not in path:
        return path
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and len(path[i + 1:i + 4]) == 3 and path[i + 1:i + 4].isdigit():
            out.append(chr(int(path[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


_mount_cache: tuple[Optional[tuple[int, int]], Optional[tuple[str, str]]] = (None, None)


def v2_mount() -> Optional[tuple[str, str]]:
    """(mount point, root inside the hierarchy) of the cgroup2 mount we see, or None.

    Read once per mount namespace (every spawn asks; mountinfo costs ~0.1 ms)."""
    global _mount_cache
    try:
        st = os.stat("/proc/self/ns/mnt")
        ns: Optional[tuple[int, int]] = (st.st_dev, st.st_ino)
    except OSError:
        ns = None
    if ns is not None and _mount_cache[0] == ns:
        return _mount_cache[1]
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep or right.split(" ", 1)[0] != "cgroup2":
            continue
        fields = left.split()
        found = _unescape(fields[4]), _unescape(fields[3])
        break
    _mount_cache = (ns, found)
    return found


def own_cgroup() -> Optional[str]:
    """The directory of the cgroup v2 this process is in, or None without cgroup v2."""
    mount = v2_mount()
    if mount is None:
        return None
    point, root = mount
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            path = line[3:]
            break
    else:
        return None
    if path.endswith(" (deleted)"):
        return None
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        path = path[len(root.rstrip("/")):] or "/"
    full = os.path.normpath(os.path.join(point, path.lstrip("/")))
    return full if os.path.isdir(full) else None


def usable_parent(parent: Optional[str] = None) -> Optional[str]:
    """A cgroup v2 directory we may make children in and move processes through, or None.

    ``parent`` is one the user names; by default the cgroup this process is in.
    """
    if "cgroup" in disabled():  # PROCTABLE_DISABLE=cgroup: as on a host without one
        return None
    path = parent if parent is not None else own_cgroup()
    if path is None or not os.path.isdir(path):
        return None
    procs = os.path.join(path, "cgroup.procs")
    if not (os.access(path, os.W_OK | os.X_OK) and os.access(procs, os.W_OK)):
        return None
    return path


class Cgroup:
    """A lineage's own cgroup (its reaper made it); read through fds kept open."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._procs = os.open(os.path.join(path, "cgroup.procs"), os.O_RDONLY | os.O_CLOEXEC)
        self.events_fd = os.open(os.path.join(path, "cgroup.events"),
                                 os.O_RDONLY | os.O_CLOEXEC)

    def _read(self, fd: int) -> bytes:
        chunks, off = [], 0
        while True:
            data = os.pread(fd, 65536, off)
            if not data:
                break
            chunks.append(data)
            off += len(data)
        return b"".join(chunks)

    def procs(self) -> list[int]:
        """The pids in this cgroup now (exited ones are not listed)."""
        return [int(x) for x in self._read(self._procs).split()]

    def events(self) -> dict[str, int]:
        words = self._read(self.events_fd).split()
        return {words[i].decode(): int(words[i + 1]) for i in range(0, len(words) - 1, 2)}

    def populated(self) -> bool:
        """``populated 1`` in cgroup.events: a live process is in it or below it."""
        return self.events().get("populated", 1) != 0

    def _write(self, name: str, value: bytes) -> bool:
        try:
            fd = os.open(os.path.join(self.path, name), os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False  # an older kernel without this file
        try:
            os.write(fd, value)
        finally:
            os.close(fd)
        return True

    def freeze(self, timeout: float) -> bool:
        """Freeze every process in it; True once the kernel says ``frozen 1`` (bounded)."""
        if not self._write("cgroup.freeze", b"1"):
            return False
        return self._wait("frozen", 1, timeout)

    def thaw(self) -> None:
        self._write("cgroup.freeze", b"0")

    def kill(self) -> bool:
        """SIGKILL every process in it at once (cgroup.kill, Linux 5.14+)."""
        return self._write("cgroup.kill", b"1")

    def _wait(self, key: str, value: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        p = select.poll()
        p.register(self.events_fd, select.POLLPRI)
        while True:
            if self.events().get(key) == value:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # cgroup.events signals a change with POLLPRI; re-check at least every 10 ms.
            p.poll(min(left, 0.01) * 1000)

    def wait_empty(self, timeout: float) -> bool:
        return self._wait("populated", 0, timeout)

    def close_fds(self) -> None:
        """Close our fds (the cgroup itself stays)."""
        for fd in (self._procs, self.events_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._procs = self.events_fd = -1

    def remove(self, timeout: float = 1.0) -> bool:
        """Close our fds and rmdir it, retrying while the kernel says busy (bounded)."""
        self.close_fds()
        deadline = time.monotonic() + timeout
        while True:
            try:
                os.rmdir(self.path)
            except FileNotFoundError:
                return True
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    return False
                time.sleep(0.005)
            else:
                return True
