"""SpawnedProcess: the Popen of ``Lineage.spawn``, whose command's whole wait status
(the core-dump bit included) comes from the lineage's reaper, with the fds that
carry it closed when the Popen is collected."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import weakref
from typing import TYPE_CHECKING, Any, Optional

from .. import _pidfd
from .._fdwait import readable
from .._status import ExitStatus, decode_wait_status

if TYPE_CHECKING:
    pass

__all__ = ["SpawnedProcess"]


def _close_box(box: list[Optional[int]]) -> None:
    fd, box[0] = box[0], None
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


class SpawnedProcess(subprocess.Popen):  # type: ignore[type-arg]
    """``Lineage.spawn``'s Popen. Its ``returncode`` is the command's own, and
    :attr:`exit_status` is the command's full wait status, the core-dump bit
    included, which a returncode cannot carry.

    In the cgroup and subreaper modes this Popen is the lineage helper's mirror
    process (``pt-mirror``): every signal sent through it reaches the command,
    its death (``kill()``) ends the command's lineage, and it exits the way the
    command did. The command's raw status comes on a pipe (from the mirror, or
    from the reaper where the mirror was killed first), and is what ``returncode``
    is made of. In scan mode this Popen is the command itself."""

    _exit_box: Optional[list[Optional[int]]] = None  # the helper's status pipe
    _pidfd_box: Optional[list[Optional[int]]] = None  # scan: a pidfd of the command
    _command_box: Optional[list[Optional[int]]] = None  # mirror: a pidfd of the command
    _exit_status: Optional[ExitStatus] = None
    _raw: Optional[int] = None  # the command's raw status, once told
    _lost = False  # the helper ended without telling it: unknown
    _status_lock: threading.Lock  # set with the status pipe: one reader of it at a time

    def _attach_exit_pipe(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._status_lock = threading.Lock()
        self._exit_box = [fd]
        weakref.finalize(self, _close_box, self._exit_box)

    def _attach_pidfd(self, fd: int) -> None:
        self._pidfd_box = [fd]
        weakref.finalize(self, _close_box, self._pidfd_box)

    def _attach_command(self, fd: int) -> None:
        self._command_box = [fd]
        weakref.finalize(self, _close_box, self._command_box)

    def send_signal(self, sig: int) -> None:
        """Send sig to the command: through the mirror, which passes every signal on,
        except SIGSTOP, which no process can catch to pass on: that one goes to the
        command itself (through a pidfd of it)."""
        box = self._command_box
        if sig == signal.SIGSTOP and box is not None and box[0] is not None:
            self.poll()
            if self.returncode is not None:
                return
            try:
                signal.pidfd_send_signal(box[0], sig)
            except ProcessLookupError:
                pass  # the command ended already
            except OSError:
                super().send_signal(sig)  # pidfd signals denied here: the mirror only
            return
        super().send_signal(sig)

    def _take_status(self, timeout: float = 0.0) -> None:
        """Read the command's raw status from the helper's pipe if it is there (wait
        at most ``timeout`` for it). EOF with no line: nobody knows it."""
        box = self._exit_box
        fd = None if box is None else box[0]
        if box is None or fd is None or self._raw is not None:
            return
        if timeout > 0:  # outside the lock: the exit watcher's thread must not wait on it
            try:
                readable([fd], timeout)
            except (OSError, ValueError):  # closed meanwhile by a thread that read it
                pass
        # Two threads read here at once (a teardown's wait() and the exit watcher's
        # command_status()): one reads and closes, the other sees it done.
        with self._status_lock:
            fd = box[0]
            if fd is None or self._raw is not None:
                return
            try:
                data = os.read(fd, 64)
            except BlockingIOError:
                return  # not told yet: the command runs on
            except OSError:
                data = b""
            _close_box(box)
            try:
                self._raw = int(data.split(b"\n", 1)[0])
            except ValueError:
                self._lost = True  # the helper ended without a status: nobody knows it

    def _handle_exitstatus(self, sts: int, *args: Any, **kwargs: Any) -> None:
        # The mirror's own status stands for the command's only where the helper
        # could not tell the real one. A mirror killed by a signal (kill()) has its
        # reaper kill the command's lineage and tell the command's status: wait
        # for it, bounded.
        if self._exit_box is not None and not os.WIFSTOPPED(sts):
            self._take_status(2.0 if os.WIFSIGNALED(sts) else 0.5)
            if self._raw is not None:
                sts = self._raw
        super()._handle_exitstatus(sts, *args, **kwargs)  # type: ignore[misc]

    @property
    def exit_status(self) -> Optional[ExitStatus]:
        """The command's exit status once this Popen's returncode is set (after
        ``wait()`` or ``poll()``); None before, and None where it is unknown."""
        rc = self.returncode
        if rc is None:
            return None
        if self._exit_status is None:
            status = self._read_status()
            if status is None and self._lost:
                return None  # unknown is not the mirror's own 125
            self._exit_status = status or ExitStatus.from_returncode(rc)
        return self._exit_status

    @property
    def status_lost(self) -> bool:
        """The lineage's reaper died (killed from outside) before it could tell the
        command's status: that status is unknown (the returncode is the mirror's)."""
        if self._exit_box is None:
            return False
        self._take_status()
        return self._lost

    def exit_wake_fd(self) -> Optional[int]:
        """A new fd (the caller's to close) that polls readable once the command's
        status can be read (the helper's status pipe: the reaper writes it as soon as
        the command is reaped, before the mirror ends); None where there is none or
        it was read already. The exit watcher waits on it beside the mirror's pidfd."""
        box = self._exit_box
        if box is None:
            return None
        with self._status_lock:
            fd = box[0]
            if fd is None or self._raw is not None:
                return None
            try:
                return os.dup(fd)
            except OSError:
                return None  # no fd left: the mirror's end tells it, a moment later

    def command_status(self) -> Optional[ExitStatus]:
        """The command's whole wait status as soon as the command has ended, before
        anyone reaps this Popen (the exit watcher asks here first: the mirror's
        own death cannot carry the core-dump bit); None while it runs or where
        it is not known."""
        if self._exit_status is not None:
            return self._exit_status
        if self._exit_box is None:
            return self.exit_status
        self._take_status()
        if self._raw is None:
            return None
        try:
            self._exit_status = decode_wait_status(self._raw)
        except ValueError:
            return None
        return self._exit_status

    def _settle(self) -> None:
        """Read the status now if the command has ended, and close the fds kept to
        read it (called when the lineage releases everything). A scan-mode command
        is our own child: its status is read without reaping it (the Popen's
        wait() still gets it), so the pidfd kept for it can go now. The mirror's
        pidfd of its command goes too (its lineage is over)."""
        if self._command_box is not None:
            _close_box(self._command_box)
        if self.returncode is not None:
            _ = self.exit_status
            return
        box = self._pidfd_box
        if box is None or box[0] is None or self._exit_status is not None:
            return
        try:
            raw = _pidfd.peek_child(self.pid, box[0])
        except (ChildProcessError, OSError):
            return  # not ours to read (reaped elsewhere): the pidfd's exit info later
        if raw is None:
            return  # it runs on (a teardown that did not end it): keep the pidfd
        try:
            self._exit_status = decode_wait_status(raw)
        except ValueError:
            return
        _close_box(box)

    def _read_status(self) -> Optional[ExitStatus]:
        self._take_status()
        raw = self._raw
        box = self._pidfd_box
        if raw is None and box is not None and box[0] is not None:
            try:
                raw = _pidfd.exit_info(box[0])
            except OSError:
                raw = None
            _close_box(box)
        if raw is None:
            return None
        try:
            return decode_wait_status(raw)
        except ValueError:
            return None


# --- the engine --------------------------------------------------------------------------
