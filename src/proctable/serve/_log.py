"""The sidecar's own log: what it says on stderr may never stop it answering.

A client that spawns the sidecar with its stderr on a pipe and never reads it (a
Node ``stdio: [..., "pipe"]`` left alone) fills that pipe within 64 KiB; a plain
``StreamHandler`` then blocks whichever thread logs next, the main loop included.
:class:`StderrLog` queues records (bounded) for a writer thread of its own, the
only thread that may block on the fd; past the bound a record is dropped and
counted, and the count is written in its place once the reader catches up.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
from typing import Any, Optional

from .._threads import NoThread, start_thread

__all__ = ["QUEUE_LIMIT", "StderrLog", "install"]

QUEUE_LIMIT = 256 << 10
"""Bytes of log lines waiting for a stderr nobody reads before more are dropped."""


class StderrLog(logging.Handler):
    """A logging handler whose ``emit`` never blocks: lines go to ``fd`` from a thread
    of its own; past ``limit`` bytes waiting, records are dropped and counted
    (``dropped``), and a line saying how many takes their place."""

    def __init__(self, fd: int = 2, limit: int = QUEUE_LIMIT, prefix: str = "proctable serve: "
                 ) -> None:
        super().__init__()
        self.fd = fd
        self.limit = limit
        self.dropped = 0          # records dropped so far, in all
        self._unsaid = 0          # dropped and not yet told in the stream
        self._queue: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._writing = False
        self._closed = False
        self._cond = threading.Condition()
        self.setFormatter(logging.Formatter(prefix + "%(message)s"))
        self._thread: Optional[threading.Thread] = None

    def _start(self) -> bool:
        if self._thread is None:
            try:
                self._thread = start_thread(self._run, "proctable-serve-log")
            except NoThread:
                return False
        return True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
        except Exception:  # a record that cannot be formatted: say so, never raise
            line = f"(a log record of {record.name} could not be formatted)\n".encode()
        self.put(line)

    def put(self, line: bytes) -> None:
        """Queue one line (never blocks); dropped and counted past the limit."""
        with self._cond:
            if self._closed or self._size + len(line) > self.limit or not self._start():
                self.dropped += 1
                self._unsaid += 1
                return
            self._tell_unsaid()
            self._queue.append(line)
            self._size += len(line)
            self._cond.notify()

    def _tell_unsaid(self) -> None:
        if self._unsaid:
            note = (f"proctable serve: {self._unsaid} log record(s) dropped: stderr was "
                    "not read\n").encode()
            self._unsaid = 0
            self._queue.append(note)
            self._size += len(note)

    def flush(self, timeout: float = 0.0) -> bool:  # type: ignore[override]
        """Wait at most timeout seconds until every queued line is written (and the
        count of dropped ones told): True if it was."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._unsaid and not self._closed and self._start():
                self._tell_unsaid()
                self._cond.notify()
            while self._queue or self._writing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        super().close()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                data = b"".join(self._queue)
                self._queue.clear()
                self._size = 0
                self._writing = True
            try:
                _write_all(self.fd, data)  # the only write that may block, on this thread
            except OSError:
                pass  # stderr is gone: nothing to tell anyone
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def install(fd: int = 2) -> StderrLog:
    """Send this process's log, warnings and uncaught thread errors to a StderrLog
    on fd (the sidecar owns its process: ``proctable serve`` calls this)."""
    handler = StderrLog(fd)
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.WARNING:
        root.setLevel(logging.WARNING)
    logging.captureWarnings(True)
    log = logging.getLogger("proctable.serve")

    def thread_error(args: Any) -> None:
        if args.exc_type is SystemExit:
            return
        log.error("thread %s ended with an error",
                  None if args.thread is None else args.thread.name,
                  exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    def unraisable(args: Any) -> None:
        log.error("%s: %r", args.err_msg or "an exception was ignored", args.object,
                  exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    threading.excepthook = thread_error
    sys.unraisablehook = unraisable
    return handler
