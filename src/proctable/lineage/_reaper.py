"""The lineage's own reaper, run as a fresh interpreter by ``Lineage.spawn``.

Standard library only, so it starts fast (``python -I -S``) and runs under any
Python 3.9+ the caller can execute. Two processes, so that the caller's Popen ends
with the command while whatever the command left behind stays captured::

    caller --Popen--> mirror --fork--> reaper --posix_spawn--> command
                                      (subreaper)

mirror (the caller's child): forwards SIGTERM/SIGINT/SIGHUP sent by a process
  (not the terminal's, which reached the command already) to the reaper, and exits
  with the command's own status as soon as the command ends: the same code, or the
  same signal raised on itself. So ``lin.process.returncode`` is the command's.
  The mirror raises the signal without dumping a core of its own, so its status
  loses the core-dump bit: before it exits it writes the command's real wait
  status (one decimal line) on ``--exit-fd``, which the caller reads.
reaper: ``PR_SET_CHILD_SUBREAPER``, so every orphan of the run re-parents to it and
  nothing escapes upward; reaps everything; forwards signals to the command (to
  the orphans it adopted, once the command is gone); tells the mirror the
  command's status; exits only when nothing is left below it. When the caller
  dies (``PR_SET_PDEATHSIG`` through the mirror, and a pidfd on the caller), it
  kills everything below it, so a run does not outlive a SIGKILLed supervisor.

In cgroup mode the reaper moves itself into the lineage's cgroup, starts the
command there (the child is born inside, before it execs), and moves back out,
so that ``populated 0`` of that cgroup means the lineage is gone.

Protocol on ``--status-fd`` (one line): ``ok <reaper> <command> <start_time> <inside>
<handle>`` (the inode of a pidfd of the command, 0 if none),
or ``error <errno> <message>`` when the command cannot be started.

Where the kernel has no ``/proc/<pid>/task/<tid>/children`` (``CONFIG_PROC_CHILDREN``
off; ``PROCTABLE_DISABLE=proc_children`` pretends so), the reaper finds its
children by scanning ``/proc`` for processes whose parent it is.

Every process here is single-threaded; the fork below is of a fresh interpreter
that never started a thread.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import select
import signal
import sys
import time
from typing import Any, Optional

# The mirror's exit code when the reaper died before it told the command's status.
REAPER_LOST = 125

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SI_KERNEL = 0x80  # si_code of a signal the kernel sent (a terminal's ^C, a hangup)

# The mirror's and the reaper's wake-up: also their parent-death signal. A
# real-time signal, so that it never collides with what users send.
WAKE = signal.SIGRTMIN + 5
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_WAITED = {signal.SIGCHLD, WAKE, *FORWARDED}
_CORE = {signal.SIGQUIT, signal.SIGILL, signal.SIGTRAP, signal.SIGABRT, signal.SIGBUS,
         signal.SIGFPE, signal.SIGSEGV, signal.SIGSYS, signal.SIGXCPU, signal.SIGXFSZ}

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _write(fd: int, text: str) -> None:
    try:
        os.write(fd, text.encode())
    except OSError:
        pass  # the reader is gone: nothing to tell


def _write_pid(procs_file: str) -> bool:
    try:
        fd = os.open(procs_file, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"0")  # "0" moves the writing process itself
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        line = f.read()
    return int(line[line.rindex(b")") + 2:].split()[19])


def _no_children_file() -> bool:
    words = os.environ.get("PROCTABLE_DISABLE", "")
    return "proc_children" in {w.strip().lower() for w in words.split(",")}


def _children() -> list[int]:
    """Our direct children (we have one thread: the main one holds them all)."""
    me = os.getpid()
    if not _no_children_file():
        try:
            with open(f"/proc/{me}/task/{me}/children", "rb") as f:
                return [int(x) for x in f.read().split()]
        except FileNotFoundError:
            pass  # no CONFIG_PROC_CHILDREN: scan for them
        except OSError:
            return []
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                line = f.read()
        except OSError:
            continue  # exited meanwhile
        if int(line[line.rindex(b")") + 2:].split()[1]) == me:
            out.append(int(name))
    return out


def _quiet_stdio() -> None:
    # Hold no pipe of the caller's open longer than the command does.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        try:
            os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)


def _exited(fd: int) -> bool:
    # proctable._ended.pidfd_ended, restated: this interpreter imports nothing of proctable.
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(0))


class _Caller:
    """The process that spawned the lineage: has it ended? Through a pidfd where a
    sandbox lets us open one; else by its (pid, start time), read while it was
    surely alive (it is the mirror's parent then)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd = -1
        try:
            self.fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            self.fd = -1  # denied (EPERM, ENOSYS) or an old kernel: by start time
        try:
            self.start = _start_time(pid)
        except (OSError, ValueError, IndexError):
            self.start = -1

    def ended(self) -> bool:
        if self.fd >= 0:
            return _exited(self.fd)
        try:
            return _start_time(self.pid) != self.start
        except (OSError, ValueError, IndexError):
            return True  # no such process any more

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _wake_mirror(mirror: int, mirror_fd: int) -> None:
    """WAKE the mirror: through its pidfd, else by pid while it is still our parent
    (an unreaped parent's pid cannot name another process)."""
    if mirror_fd >= 0:
        try:
            signal.pidfd_send_signal(mirror_fd, WAKE)
        except OSError:
            pass  # a sandbox may deny the call itself: by pid below
        else:
            return
    if os.getppid() == mirror:
        try:
            os.kill(mirror, WAKE)
        except OSError:
            pass


def _become(raw: int) -> int:
    """Exit the way the command did: its code, or its signal raised on ourselves."""
    if os.WIFSIGNALED(raw):
        sig = os.WTERMSIG(raw)
        if sig in _CORE:
            try:
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the command dumped, not us
            except (OSError, ValueError):
                pass
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP have no disposition to set
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        time.sleep(0.5)
        return 128 + sig
    if os.WIFEXITED(raw):
        return os.WEXITSTATUS(raw)
    return 1


# --- the reaper ---------------------------------------------------------------

class _Args:
    def __init__(self, argv: list[str]) -> None:
        self.ppid = 0
        self.status_fd = -1
        self.cgroup: Optional[str] = None
        self.home: Optional[str] = None
        self.exe: Optional[str] = None
        self.exit_fd = -1
        self.restore_signals = True
        i = 0
        while i < len(argv):
            a = argv[i]
            if a == "--":
                self.cmd = argv[i + 1:]
                break
            if a == "--keep-signals":
                self.restore_signals = False
                i += 1
                continue
            value = argv[i + 1]
            if a == "--ppid":
                self.ppid = int(value)
            elif a == "--status-fd":
                self.status_fd = int(value)
            elif a == "--cgroup":
                self.cgroup = value
            elif a == "--home":
                self.home = value
            elif a == "--exe":
                self.exe = value
            elif a == "--exit-fd":
                self.exit_fd = int(value)
            else:
                raise SystemExit(f"proctable reaper: unknown option {a}")
            i += 2
        else:
            raise SystemExit("proctable reaper: no command after --")
        if not self.cmd:
            raise SystemExit("proctable reaper: empty command")


def _kill_all(cgroup: Optional[str]) -> None:
    """The caller is gone: kill everything below us (children by pid: unreaped, they
    cannot be reused), reap, repeat as orphans re-parent to us; bounded."""
    if cgroup is not None:
        try:
            with open(os.path.join(cgroup, "cgroup.kill"), "w") as f:
                f.write("1")
        except OSError:
            pass
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            break
        time.sleep(0.01)
    if cgroup is not None:
        for _ in range(100):
            try:
                os.rmdir(cgroup)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def _spawn(a: _Args, mask: set[Any], sigdef: tuple[int, ...]) -> int:
    """Start the command: posix_spawn, or fork and exec where a sandbox refuses what
    posix_spawn runs on (glibc's posix_spawn uses clone3 and falls back only on
    ENOSYS, so a seccomp EPERM for clone3 fails it; fork() uses clone). This
    process has one thread, so a fork is safe here. An exec failure in the child
    comes back through a close-on-exec pipe as its errno."""
    try:
        if a.exe is not None:
            return os.posix_spawn(a.exe, a.cmd, os.environ, setsigmask=mask, setsigdef=sigdef)
        return os.posix_spawnp(a.cmd[0], a.cmd, os.environ, setsigmask=mask, setsigdef=sigdef)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOSYS, errno.EAGAIN):
            raise
    r, w = os.pipe()  # both close-on-exec
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, until exec
        try:
            os.close(r)
            for sig in sigdef:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if a.exe is not None:
                os.execve(a.exe, a.cmd, os.environ)
            else:
                os.execvpe(a.cmd[0], a.cmd, os.environ)
        except OSError as e:
            os.write(w, str(e.errno or errno.ENOEXEC).encode())
        except BaseException:
            os.write(w, str(errno.ENOEXEC).encode())
        os._exit(127)
    os.close(w)
    try:
        data = b""
        while True:
            chunk = os.read(r, 16)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
    if data:
        os.waitpid(pid, 0)  # it never ran the command: reap it here
        err = int(data)
        raise OSError(err, os.strerror(err))
    return pid


def _reaper(a: _Args, orig_mask: set[Any], caller: _Caller, to_mirror: int,
            mirror: int) -> int:
    _prctl(PR_SET_PDEATHSIG, WAKE)
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    except OSError as e:
        # A sandbox that denies it (EPERM, ENOSYS): nothing was started, and the
        # caller can choose another backend ("nosubreaper" tells it so).
        _write(a.status_fd, f"nosubreaper {e.errno or 0} PR_SET_CHILD_SUBREAPER: "
                            f"{e.strerror or e}\n")
        _write(to_mirror, "error\n")
        return 126
    mirror_fd = -1
    if os.getppid() == mirror:
        try:
            mirror_fd = os.pidfd_open(mirror)
        except (OSError, AttributeError):
            mirror_fd = -1  # by pid, while it is our parent (_wake_mirror)
    # We must see our children's exits even where the caller ignored SIGCHLD.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    inside = a.cgroup is not None and _write_pid(os.path.join(a.cgroup, "cgroup.procs"))
    if a.cgroup is not None and not inside:
        _write(a.status_fd, f"error {errno.EACCES} cannot move into cgroup {a.cgroup}\n")
        _write(to_mirror, "error\n")
        return 126
    setsigdef = (signal.SIGPIPE, signal.SIGXFSZ) if a.restore_signals else ()
    try:
        cmd = _spawn(a, orig_mask, setsigdef)
    except OSError as e:
        if inside and a.home is not None:
            _write_pid(os.path.join(a.home, "cgroup.procs"))
        _write(a.status_fd, f"error {e.errno or 0} {e.strerror or e}\n")
        _write(to_mirror, "error\n")
        return 127 if e.errno == errno.ENOENT else 126
    if inside:
        # Back out, so that the lineage's cgroup holds the lineage only.
        inside = not (a.home is not None and _write_pid(os.path.join(a.home, "cgroup.procs")))
    try:
        start = _start_time(cmd)  # our unreaped child: its pid cannot name another
    except (OSError, ValueError, IndexError):
        start = -1
    handle = 0  # the inode of a pidfd of it (a pidfs handle, where pidfds live on pidfs)
    try:
        fd = os.pidfd_open(cmd)
        try:
            handle = os.fstat(fd).st_ino
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        pass
    _write(a.status_fd, f"ok {os.getpid()} {cmd} {start} {int(inside)} {handle}\n")
    os.close(a.status_fd)
    _quiet_stdio()

    cmd_status: Optional[int] = None
    while True:
        info = signal.sigtimedwait(_WAITED, 1.0)
        try:
            while True:
                pid, raw = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                if pid == cmd:
                    cmd_status = raw
                    _write(to_mirror, f"exit {raw}\n")
                    _wake_mirror(mirror, mirror_fd)
        except ChildProcessError:
            if cmd_status is not None:
                return 0  # nothing is left below us
        if info is not None and info.si_signo in FORWARDED and info.si_code != SI_KERNEL:
            targets = [cmd] if cmd_status is None else _children()
            for pid in targets:
                try:
                    os.kill(pid, info.si_signo)  # our unreaped children: safe by pid
                except OSError:
                    pass
        if caller.ended():
            _kill_all(a.cgroup)
            return 0


# --- the mirror ---------------------------------------------------------------

def _tell_status(exit_fd: int, raw: int) -> None:
    """The command's real wait status, for the caller (before the mirror's own exit)."""
    if exit_fd >= 0:
        _write(exit_fd, f"{raw}\n")
        try:
            os.close(exit_fd)
        except OSError:
            pass


def _mirror(child: int, from_reaper: int, ppid: int, exit_fd: int) -> int:
    os.set_blocking(from_reaper, False)
    buf = b""
    child_status: Optional[int] = None
    while True:
        info = signal.sigtimedwait(_WAITED, 5.0)
        try:
            while True:
                data = os.read(from_reaper, 256)
                if not data:
                    break
                buf += data
        except BlockingIOError:
            pass
        if b"\n" in buf:
            line = buf.split(b"\n", 1)[0].split()
            if line[0] == b"exit":
                _tell_status(exit_fd, int(line[1]))
                return _become(int(line[1]))
            return 127  # the command could not start; the reaper said why
        if (info is not None and info.si_signo in FORWARDED and info.si_code != SI_KERNEL
                and child_status is None):
            try:
                os.kill(child, info.si_signo)  # our unreaped child
            except OSError:
                pass
        if child_status is None:
            try:
                pid, raw = os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                pid, raw = child, 0
            if pid == child:
                child_status = raw
        if child_status is not None and b"\n" not in buf:
            try:
                more = os.read(from_reaper, 256)
            except BlockingIOError:
                more = b""
            if more:
                buf += more
                continue
            # The reaper died without a word (killed from outside): the command's
            # status can no longer be known. Exit REAPER_LOST, with no status line,
            # so that the caller says "unknown" instead of inventing one.
            return REAPER_LOST
        if os.getppid() != ppid:
            return 125  # the caller is gone; the reaper (its pidfd on the caller) ends the run


def main(argv: Optional[list[str]] = None) -> int:
    a = _Args(sys.argv[1:] if argv is None else argv)
    orig_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
    _prctl(PR_SET_PDEATHSIG, WAKE)
    if os.getppid() != a.ppid:
        return 125  # the caller died before we could watch it
    caller = _Caller(a.ppid)
    if os.getppid() != a.ppid:
        return 125
    os.set_inheritable(a.status_fd, False)
    if a.exit_fd >= 0:
        os.set_inheritable(a.exit_fd, False)
    from_reaper, to_mirror = os.pipe()
    mirror = os.getpid()
    child = os.fork()
    if child == 0:
        os.close(from_reaper)
        if a.exit_fd >= 0:
            os.close(a.exit_fd)  # the mirror's to write
        code = 70
        try:
            code = _reaper(a, orig_mask, caller, to_mirror, mirror)
        except BaseException as exc:  # report, never return into the mirror's code
            _write(2, f"proctable reaper: {exc!r}\n")
        os._exit(code)
    os.close(to_mirror)
    os.close(a.status_fd)
    caller.close()
    _quiet_stdio()
    return _mirror(child, from_reaper, a.ppid, a.exit_fd)


if __name__ == "__main__":
    sys.exit(main())
