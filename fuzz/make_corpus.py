"""Collect the seed corpus of fuzz/fuzz_stat.c: real /proc/<pid>/stat lines.

Run as root on Linux (``python fuzz/make_corpus.py``): it writes one file per
line into fuzz/corpus/. Every seed is a line the kernel printed, taken from
processes set up here to cover the shapes the parser must handle: kernel
threads, init, a zombie (exit code and signal), a stopped process, comm names
with ')' , '(' , spaces, a newline and bytes that are not UTF-8. The 64-byte
comm is the longest real kernel-thread line with its comm widened to 64 bytes
(the kernel allows it for kernel threads; none may run on this host), and its
65-byte twin must be refused.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import re
import signal
import time

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "corpus"
PR_SET_NAME = 15
_libc = ctypes.CDLL(None, use_errno=True)


def stat_line(pid: int) -> bytes:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read()


def child(name: bytes, then: str) -> int:
    """Fork a child that renames itself (comm) and then exits or pauses."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        _libc.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
        os.write(w, b"x")
        os.close(w)
        if then == "exit7":
            os._exit(7)
        if then == "pause":
            while True:
                signal.pause()
        os._exit(0)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    return pid


def wait_state(pid: int, state: bytes) -> bytes:
    for _ in range(2000):
        line = stat_line(pid)
        if line[line.rindex(b")") + 2:][:1] == state:
            return line
        time.sleep(0.001)
    raise RuntimeError(f"pid {pid} never reached state {state!r}")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    seeds: dict[str, bytes] = {}
    seeds["init"] = stat_line(1)
    seeds["kthreadd"] = stat_line(2)
    seeds["self"] = stat_line(os.getpid())

    # Kernel threads: children of kthreadd, one per distinct name shape.
    kthreads = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                line = stat_line(int(d))
            except OSError:
                continue
            rest = line[line.rindex(b")") + 2:].split()
            if rest[1] == b"2":
                kthreads.append(line)
    kthreads.sort(key=lambda ln: ln.index(b")"))
    shapes: dict[bytes, bytes] = {}
    for line in kthreads:
        comm = line[line.index(b"(") + 1:line.rindex(b")")]
        shapes.setdefault(re.sub(rb"[0-9]+", b"0", comm), line)
    for i, line in enumerate(sorted(shapes.values())[:24]):
        seeds[f"kthread_{i:02d}"] = line
    longest = kthreads[-1]

    # A zombie that exited 7, one killed by SIGKILL, a stopped process.
    z = child(b"zombie7", "exit7")
    seeds["zombie_exit7"] = wait_state(z, b"Z")
    os.waitpid(z, 0)
    k = child(b"killed", "pause")
    os.kill(k, signal.SIGKILL)
    seeds["zombie_sigkill"] = wait_state(k, b"Z")
    os.waitpid(k, 0)
    s = child(b"stopped", "pause")
    os.kill(s, signal.SIGSTOP)
    seeds["stopped"] = wait_state(s, b"T")
    os.kill(s, signal.SIGKILL)
    os.waitpid(s, 0)

    # comm names that a naive parser gets wrong (comm is at most 15 bytes here).
    for tag, name in (
        ("paren_space", b"a) b (c) ) S"),
        ("paren_only", b")"),
        ("open_paren", b"(("),
        ("spaces", b"   "),
        ("newline", b"x\n) R 1 2"),
        ("not_utf8", b"\xff\xfe)\xc3("),
        ("digits", b"1 (2) S 3"),
    ):
        p = child(name, "pause")
        seeds[f"comm_{tag}"] = stat_line(p)
        os.kill(p, signal.SIGKILL)
        os.waitpid(p, 0)

    # The longest kernel-thread comm, widened to 64 bytes (the most the kernel
    # prints), and to 65 (one too many: PT_ENOCOMM).
    open_, close_ = longest.index(b"("), longest.rindex(b")")
    comm = longest[open_ + 1:close_]
    for n in (64, 65):
        wide = (comm + b"-" + b"x" * n)[:n]
        seeds[f"comm_{n}_bytes"] = longest[:open_ + 1] + wide + longest[close_:]
    # A kernel before 3.5 prints 44 fields: no field 52.
    seeds["pre_3_5_fields"] = b" ".join(seeds["self"].split(b" ")[:44]) + b"\n"

    for name, line in seeds.items():
        (OUT / name).write_bytes(line)
    print(f"{len(seeds)} seeds in {OUT}")


if __name__ == "__main__":
    main()
