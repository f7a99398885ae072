"""A durable supervisor's state directory: its checks, its lock, its records.

The layout (all the user's, 0700)::

    PATH/lock                 flock()ed by the one supervisor that holds PATH; its pid
    PATH/keys/<h>.json        one record per key: its last generation, and its session
    PATH/sessions/<name>.sock a session's keeper listens here (csrc/pt_session.c)
    PATH/sessions/<name>.end  what a session's helpers did while no supervisor was there

A key's record is written *before* its session's helper is started (the session's
name in it), then again with the identities the helper reported: whatever moment
a supervisor is killed at, the next one finds every session it may have started.
A record is plain JSON with a version; one that does not parse is set aside
(``<h>.json.bad``) with a warning and never stops the others; the keeper itself,
found by its socket, is the truth about a session (a record only says where to
look and what to run on a restart).

Nothing here is fsync()ed: what these files guard (processes) does not outlive a
reboot, and a supervisor's crash leaves the page cache whole.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import stat
import subprocess
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import _ended, _pidfd
from .._status import decode_wait_status
from ..errors import ProctableError, StateDirError
from ..lineage import Lineage, _session
from ..lineage._cgroup import own_cgroup, usable_parent
from ..lineage._session import reap_if_ours, wait_gone
from ..table import Identity, read
from ._policy import FixedArgs, RestartPolicy

__all__ = ["VERSION", "KeyRecord", "SessionRecord", "StateDir", "StateDirError"]

log = logging.getLogger("proctable.supervise")

VERSION = 1
MARKER = "PROCTABLE_SESSION"
"""The environment variable every durable session's command starts with (its value:
the state directory's id, a colon, the session's name): what finds the session's
processes, escapes included, where both of its helpers were killed. Only processes
that carry it are ever ended on a record's word: a record names pids, and a pid
alone is no proof (it may be another user's process, or reused)."""
MAX_GENERATION = (1 << 63) - 2
"""The largest generation a record may hold: the next start's number must still fit
the helper's (a C long)."""
_POLICY_FIELDS = ("max_restarts", "reset_after", "fast_exit", "max_fast_exits", "delay")
# The Popen keywords a durable session can record (for its restarts by a later
# supervisor): plain data only.
RECORDABLE = frozenset({"cwd", "env", "user", "group", "extra_groups", "umask",
                        "start_new_session", "executable", "ignore_signals", "stdin",
                        "stdout", "stderr"})


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def _ident(v: Any) -> Optional[Identity]:
    if v is None:
        return None
    if (not isinstance(v, list) or len(v) != 3 or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in v[:2])
            or not (v[2] is None or (isinstance(v[2], int) and not isinstance(v[2], bool)))
            or v[0] <= 0 or v[1] < 0):
        raise ValueError(f"not an identity: {v!r}")
    return Identity(v[0], v[1], v[2])


def _ident_out(i: Optional[Identity]) -> Any:
    return None if i is None else [i.pid, i.start_time, i.handle]


@dataclass(frozen=True)
class SessionRecord:
    """One session (one generation of a key) as the supervisor that started it wrote it."""

    name: str
    generation: int
    args: tuple[Any, ...]
    popen: Mapping[str, Any] = field(default_factory=dict)
    output: str = "inherit"
    pty: Optional[tuple[int, int]] = None
    timeout: Optional[float] = None
    policy: Optional[Mapping[str, Any]] = None
    keeper: Optional[Identity] = None
    session: Optional[Identity] = None
    command: Optional[Identity] = None
    cgroup: Optional[str] = None
    inside: bool = False
    drop_output: bool = False
    deadline: Optional[float] = None  # its timeout's end, wall clock (time.time())
    stopping: Optional[str] = None    # a stop under way: "stop", "remove", "close", "timeout"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "generation": self.generation, "args": list(self.args),
                "popen": dict(self.popen), "output": self.output,
                "pty": None if self.pty is None else list(self.pty), "timeout": self.timeout,
                "policy": None if self.policy is None else dict(self.policy),
                "keeper": _ident_out(self.keeper), "session": _ident_out(self.session),
                "command": _ident_out(self.command), "cgroup": self.cgroup,
                "inside": self.inside, "drop_output": self.drop_output,
                "deadline": self.deadline, "stopping": self.stopping}

    @classmethod
    def from_json(cls, d: Any) -> SessionRecord:
        if not isinstance(d, dict):
            raise TypeError("a session is an object")
        name, gen, args = d["name"], d["generation"], d["args"]
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ValueError(f"bad session name {name!r}")
        if isinstance(gen, bool) or not isinstance(gen, int) or not 1 <= gen <= MAX_GENERATION:
            raise ValueError(f"bad generation {gen!r}")
        if not isinstance(args, list) or not args or not all(isinstance(a, str) for a in args):
            raise ValueError("bad args")
        popen = d.get("popen") or {}
        if not isinstance(popen, dict) or not set(popen) <= RECORDABLE:
            raise ValueError("bad popen keywords")
        pty = d.get("pty")
        if pty is not None and (not isinstance(pty, list) or len(pty) != 2
                                or not all(isinstance(x, int) and 0 < x < 65536 for x in pty)):
            raise ValueError("bad pty")
        policy = d.get("policy")
        if policy is not None and (not isinstance(policy, dict)
                                   or not set(policy) <= {*_POLICY_FIELDS, "fresh",
                                                          "fresh_args"}):
            raise ValueError("bad policy")
        fresh_args = None if policy is None else policy.get("fresh_args")
        if fresh_args is not None and (not isinstance(fresh_args, list) or not fresh_args
                                       or not all(isinstance(a, str) for a in fresh_args)):
            raise ValueError("bad policy's fresh_args")
        timeout = d.get("timeout")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError("bad timeout")
        output = d.get("output", "inherit")
        if output not in ("inherit", "events"):
            raise ValueError("bad output")
        cgroup = d.get("cgroup")
        if cgroup is not None and (not isinstance(cgroup, str) or not cgroup.startswith("/")):
            raise ValueError("bad cgroup")
        deadline = d.get("deadline")
        if deadline is not None and (isinstance(deadline, bool)
                                     or not isinstance(deadline, (int, float))):
            raise ValueError("bad deadline")
        stopping = d.get("stopping")
        if stopping not in (None, "stop", "remove", "close", "timeout"):
            raise ValueError("bad stopping")
        return cls(name, gen, tuple(args), popen, output,
                   None if pty is None else (pty[0], pty[1]), timeout, policy,
                   _ident(d.get("keeper")), _ident(d.get("session")), _ident(d.get("command")),
                   cgroup, bool(d.get("inside", False)), bool(d.get("drop_output", False)),
                   None if deadline is None else float(deadline), stopping)

    def restart_policy(self) -> Optional[RestartPolicy]:
        """The policy as recorded (a ``fresh`` factory is code: it cannot be, but the
        fixed args it names, ``fresh_args``, are)."""
        if self.policy is None:
            return None
        fresh_args = self.policy.get("fresh_args")
        return RestartPolicy(fresh=None if fresh_args is None else FixedArgs(fresh_args),
                             **{k: v for k, v in self.policy.items() if k in _POLICY_FIELDS})


def policy_fields(policy: Optional[RestartPolicy]) -> Optional[dict[str, Any]]:
    if policy is None:
        return None
    out: dict[str, Any] = {k: getattr(policy, k) for k in _POLICY_FIELDS}
    out["fresh"] = policy.fresh is not None
    fresh_args = getattr(policy.fresh, "fresh_args", None)
    if isinstance(fresh_args, list) and fresh_args and all(isinstance(a, str)
                                                           for a in fresh_args):
        out["fresh_args"] = list(fresh_args)
    return out


@dataclass(frozen=True)
class KeyRecord:
    key: str
    generation: int
    session: Optional[SessionRecord] = None

    def to_json(self) -> dict[str, Any]:
        return {"v": VERSION, "key": self.key, "generation": self.generation,
                "session": None if self.session is None else self.session.to_json()}

    @classmethod
    def from_json(cls, d: Any) -> KeyRecord:
        if not isinstance(d, dict) or d.get("v") != VERSION:
            raise ValueError(f"not a version-{VERSION} key record")
        key, gen = d["key"], d["generation"]
        if not isinstance(key, str) or not key:
            raise ValueError("bad key")
        if isinstance(gen, bool) or not isinstance(gen, int) or not 0 <= gen <= MAX_GENERATION:
            raise ValueError(f"bad generation {gen!r}")
        s = d.get("session")
        return cls(key, gen, None if s is None else SessionRecord.from_json(s))


class StateDir:
    """An opened state directory: checked, locked, and its two folders' fds."""

    def __init__(self, path: str) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"state_dir must be a path, not {type(path).__name__}")
        self.path = os.path.abspath(os.fsdecode(path))
        self.fd = -1
        self.lock_fd = -1
        self.keys_fd = -1
        self.sessions_fd = -1
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _refuse(self, why: str) -> StateDirError:
        return StateDirError(f"state_dir {self.path}: {why}")

    def _open(self) -> None:
        path = self.path
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            try:
                os.mkdir(path, 0o700)
            except OSError as exc:
                raise self._refuse(f"cannot be made ({exc.strerror})") from None
            st = os.lstat(path)
        except OSError as exc:
            raise self._refuse(f"cannot be looked at ({exc.strerror})") from None
        if stat.S_ISLNK(st.st_mode):
            raise self._refuse("is a symbolic link: name the directory itself")
        if not stat.S_ISDIR(st.st_mode):
            raise self._refuse("is not a directory")
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise self._refuse(f"cannot be opened ({exc.strerror})") from None
        self._check(os.fstat(self.fd))
        try:
            if os.fstatvfs(self.fd).f_flag & os.ST_RDONLY:
                raise self._refuse("is on a read-only mount")
        except OSError:
            pass
        try:
            self.lock_fd = os.open("lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                                   0o600, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.EROFS:
                raise self._refuse("is on a read-only mount") from None
            raise self._refuse(f"its lock cannot be opened ({exc.strerror})") from None
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(self.lock_fd, 32, 0).decode(errors="replace").strip()
            except OSError:
                holder = ""
            raise self._refuse("is held by another supervisor"
                               + (f" (pid {holder})" if holder else "")
                               + ": one supervisor at a time") from None
        os.ftruncate(self.lock_fd, 0)
        os.pwrite(self.lock_fd, f"{os.getpid()}\n".encode(), 0)
        self.keys_fd = self._subdir("keys")
        self.sessions_fd = self._subdir("sessions")
        self.ident = self._id()

    def _id(self) -> str:
        """This directory's own random id (made once): it sets its sessions' markers
        apart from those of another directory's sessions of the same keys."""
        try:
            fd = os.open("id", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            ident = os.urandom(12).hex()
            tmp = f".id.{os.getpid()}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
                try:
                    os.write(fd, ident.encode())
                finally:
                    os.close(fd)
                os.rename(tmp, "id", src_dir_fd=self.fd, dst_dir_fd=self.fd)
            except OSError as exc:  # ENOSPC, EDQUOT
                raise self._refuse(f"its id file cannot be written ({exc.strerror})") from None
            return ident
        except OSError as exc:  # a symbolic link (ELOOP)
            raise self._refuse(f"its id file cannot be read ({exc.strerror})") from None
        try:
            with os.fdopen(fd, "rb") as f:
                ident = f.read(64).decode("ascii", "replace").strip()
        except OSError as exc:  # a directory (EISDIR)
            raise self._refuse(f"its id file cannot be read ({exc.strerror})") from None
        if len(ident) != 24 or not all(c in "0123456789abcdef" for c in ident):
            raise self._refuse("its id file is not one proctable wrote")
        return ident

    def marker(self, name: str) -> str:
        return f"{self.ident}:{name}"

    def _check(self, st: os.stat_result) -> None:
        if not stat.S_ISDIR(st.st_mode):
            raise self._refuse("is not a directory")
        if st.st_uid != os.geteuid():
            raise self._refuse(f"belongs to uid {st.st_uid}, not to this user "
                               f"(uid {os.geteuid()})")
        if st.st_mode & 0o077:
            raise self._refuse(f"has mode {stat.S_IMODE(st.st_mode):04o}: it must be "
                               f"reachable by its owner only (chmod 700 {self.path})")

    def _subdir(self, name: str) -> int:
        try:
            os.mkdir(name, 0o700, dir_fd=self.fd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise self._refuse(f"cannot make {name}/ ({exc.strerror})") from None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=self.fd)
        except OSError as exc:  # a file, or a symbolic link (ELOOP, ENOTDIR)
            raise self._refuse(f"its {name} is not a directory of its own "
                               f"({exc.strerror})") from None
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            os.close(fd)
            raise self._refuse(f"{name}/ must be this user's, mode 0700")
        return fd

    # -- records ---------------------------------------------------------------------

    def load(self) -> tuple[list[KeyRecord], list[str]]:
        """Every key's record, and what was set aside (each a sentence)."""
        records: list[KeyRecord] = []
        bad: list[str] = []
        for name in sorted(os.listdir(self.keys_fd)):
            if not name.endswith(".json") or name.startswith("."):
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                             dir_fd=self.keys_fd)
            except OSError as exc:
                bad.append(f"{name}: cannot be opened ({exc.strerror})")
                continue
            try:
                rec = _read_record(fd, name)
            except (ValueError, KeyError, TypeError, UnicodeDecodeError, OSError) as exc:
                why = f"{name}: {exc}"
                log.warning("state_dir %s: record %s set aside (%s)", self.path, name, exc)
                try:
                    os.rename(name, name + ".bad", src_dir_fd=self.keys_fd,
                              dst_dir_fd=self.keys_fd)
                except OSError:
                    pass
                bad.append(why)
                continue
            records.append(rec)
        return records, bad

    def write(self, rec: KeyRecord) -> None:
        """Write a key's record (whole, then renamed into place); OSError (ENOSPC...)
        as a StateDirError that names the directory."""
        name = key_hash(rec.key) + ".json"
        tmp = "." + name + ".tmp"
        data = json.dumps(rec.to_json(), separators=(",", ":")).encode()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=self.keys_fd)
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=self.keys_fd, dst_dir_fd=self.keys_fd)
        except OSError as exc:
            try:
                os.unlink(tmp, dir_fd=self.keys_fd)
            except OSError:
                pass
            if exc.errno in (errno.ENOSPC, errno.EDQUOT) and self._overwrite(name, data):
                return  # (a shorter record, in the blocks the old one holds)
            raise StateDirError(f"state_dir {self.path}: cannot write the record of key "
                                f"{rec.key!r} ({exc.strerror})") from exc

    def _overwrite(self, name: str, data: bytes) -> bool:
        """On a full disk: write data over the existing record in place, where it is no
        longer than what is there (its blocks are allocated already: a session's
        record cleared at its end is always shorter). Not atomic: a crash in between
        leaves a record that does not parse, which the next supervisor sets aside."""
        try:
            fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.keys_fd)
        except OSError:
            return False
        try:
            if os.fstat(fd).st_size < len(data):
                return False
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        except OSError:
            return False
        else:
            return True
        finally:
            os.close(fd)

    def end_of(self, name: str) -> Optional[list[str]]:
        """What the session's helpers wrote when it ended without a supervisor."""
        try:
            fd = os.open(name + ".end", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=self.sessions_fd)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            return f.read(4096).decode(errors="replace").split()

    def sweep(self, recorded: set[str]) -> None:
        """Remove what sessions that no record names left in sessions/ (a supervisor
        killed between clearing a key's record and removing its session's files): an
        .end, or a socket nobody listens on. A socket that answers is left alone: a
        keeper runs there."""
        try:
            entries = os.listdir(self.sessions_fd)
        except OSError:
            return
        for entry in entries:
            name, _, suffix = entry.partition(".")
            if not name or name in recorded or suffix not in ("sock", "end", "end.tmp"):
                continue
            if suffix == "sock":
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                try:
                    probe.settimeout(1.0)
                    probe.connect(f"/proc/self/fd/{self.sessions_fd}/{entry}")
                    continue  # a keeper answers: not ours to remove
                except ConnectionRefusedError:
                    pass
                except OSError:
                    continue
                finally:
                    probe.close()
            try:
                os.unlink(entry, dir_fd=self.sessions_fd)
            except OSError:
                pass

    def forget_session(self, name: str) -> None:
        for suffix in (".sock", ".end", ".end.tmp"):
            try:
                os.unlink(name + suffix, dir_fd=self.sessions_fd)
            except OSError:
                pass

    def close(self) -> None:
        """Release the lock and the fds (idempotent)."""
        for attr in ("sessions_fd", "keys_fd", "lock_fd", "fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                setattr(self, attr, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass


def _read_record(fd: int, name: str) -> KeyRecord:
    """The record in fd (closed here), checked: a file of this user's whose key is the
    one its name says."""
    st = os.fstat(fd)
    with os.fdopen(fd, "rb") as f:
        raw = f.read(1 << 22)
    if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
        raise ValueError("not a file of this user's")
    rec = KeyRecord.from_json(json.loads(raw))
    if key_hash(rec.key) + ".json" != name:
        raise ValueError("its key is not the one its name says")
    return rec


def session_name(key: str, generation: int) -> str:
    return f"{key_hash(key)}-{generation}"


def check_key(key: Hashable) -> str:
    if not isinstance(key, str):
        raise TypeError(f"the keys of a durable supervisor (state_dir) are strings, not "
                        f"{type(key).__name__}")
    if not key:
        raise ValueError("a key must not be empty")
    return key


# --- the sessions of a durable supervisor ------------------------------------------------


class Ghost(ProctableError):
    """A recorded session whose keeper is gone: what is known of its end."""

    def __init__(self, message: str, record: SessionRecord, status: str,
                 exit: Any, reason: str) -> None:
        super().__init__(message)
        self.record = record
        self.status = status
        self.exit = exit
        self.reason = reason


class Unanswered(ProctableError):
    """A recorded session whose keeper runs but did not answer (stopped, or a host
    too loaded): never forgotten, never ended for being slow. The supervisor holds
    its key: a start of it is refused, and a stop, remove or close ends the session
    (its keeper SIGKILLed by its identity, its guard ending the rest)."""

    def __init__(self, message: str, record: SessionRecord) -> None:
        super().__init__(message)
        self.record = record


@dataclass
class Session:
    """A running durable session as the runtime holds it."""

    record: SessionRecord
    conn: Any  # lineage._session.Connection


def check_popen(popen_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The Popen keywords of a durable start as plain data to record; ValueError for
    what a later supervisor could not run again (a file object, a callable)."""
    out: dict[str, Any] = {}
    for k, given in popen_kwargs.items():
        v = given
        if k not in RECORDABLE:
            raise ValueError(f"{k}= cannot be recorded for a durable session (state_dir): "
                             f"only {', '.join(sorted(RECORDABLE))}")
        if k in ("stdout", "stderr"):
            if v is not None and v != subprocess.DEVNULL:
                raise ValueError(f"a durable session's {k} is owned (output=\"events\") or "
                                 "discarded (subprocess.DEVNULL): a file of this process "
                                 "would not outlive it")
            v = None if v is None else "devnull"
        elif k == "stdin":
            if v not in (None, subprocess.DEVNULL, subprocess.PIPE):
                raise ValueError("a durable session's stdin is subprocess.PIPE (owned: "
                                 "write()) or subprocess.DEVNULL")
            v = {None: None, subprocess.DEVNULL: "devnull", subprocess.PIPE: "pipe"}[v]
        elif k == "env" and v is not None:
            v = {os.fsdecode(a): os.fsdecode(b) for a, b in dict(v).items()}
        elif k in ("cwd", "executable") and v is not None:
            v = os.fsdecode(v)
        elif k == "ignore_signals":
            v = [int(s) for s in v]
        elif k == "extra_groups" and v is not None:
            v = list(v)
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            raise ValueError(f"{k}={v!r} cannot be recorded for a durable session") from None
        out[k] = v
    return out


def popen_from_record(popen: Mapping[str, Any]) -> dict[str, Any]:
    kw = dict(popen)
    for k in ("stdin", "stdout", "stderr"):
        if kw.get(k) == "devnull":
            kw[k] = subprocess.DEVNULL
        elif kw.get(k) == "pipe":
            kw[k] = subprocess.PIPE
    return kw


class Sessions:
    """Starts, resumes and forgets the sessions of one state directory."""

    def __init__(self, state: StateDir, *, ring: int, orphan_timeout: Optional[float],
                 session_cgroup: Optional[str], mode: str) -> None:
        self.state = state
        self.ring = ring
        self.orphan_timeout = orphan_timeout
        self.session_cgroup = session_cgroup
        self.mode = mode

    def _cgroup_parent(self, name: str) -> Optional[str]:

        if self.mode == "subreaper":
            return None
        if self.session_cgroup is not None:
            return os.path.join(self.session_cgroup, f"pt-{name}")  # made by pt-session
        parent = usable_parent(None)
        if parent is None and self.mode == "cgroup":
            raise ProctableError("mode='cgroup' needs a writable cgroup v2 (root, or a "
                                 "delegated one); none here")
        return parent

    def start(self, key: str, generation: int, args: tuple[Any, ...], popen: dict[str, Any],
              output: str, pty: Optional[tuple[int, int]], timeout: Optional[float],
              policy: Optional[RestartPolicy], drop_output: bool = False
              ) -> tuple[Session, Any]:
        """Record, then start, a session; (the session, its lineage). The record is
        written first: a supervisor killed at any moment after leaves a session the
        next one finds. Nothing runs when this raises."""

        name = session_name(key, generation)
        recorded = check_popen(popen)
        deadline = None if timeout is None else time.time() + timeout
        srec = SessionRecord(name, generation, tuple(os.fsdecode(a) for a in args), recorded,
                             output, pty, timeout, policy_fields(policy),
                             drop_output=drop_output, deadline=deadline)
        self.state.forget_session(name)  # a leftover of the same name (never ours now)
        self.state.write(KeyRecord(key, generation, srec))
        kw = popen_from_record(recorded)
        # The marker that ties every process of the session to it, escapes included,
        # should both its helpers be killed (see _end_leftovers).
        env = kw.get("env")
        kw["env"] = {**(os.environ if env is None else env), MARKER: self.state.marker(name)}
        stdin_pipe = kw.get("stdin") is subprocess_pipe()
        if stdin_pipe or pty is not None:
            kw.pop("stdin", None)
        try:
            kept = _session.launch(
                list(srec.args), kw, dir_fd=self.state.sessions_fd, name=name,
                key_hex=key.encode("utf-8", "surrogatepass").hex(), generation=generation,
                ring=self.ring, orphan_timeout=self.orphan_timeout, pty=pty,
                pipes=output == "events" and pty is None, stdin_pipe=stdin_pipe,
                cgroup_parent=self._cgroup_parent(name), session_cgroup=self.session_cgroup,
                home=own_cgroup())
        except BaseException:
            self._unrecord(key, generation, name)
            raise
        srec = SessionRecord(name, generation, srec.args, recorded, output, pty, timeout,
                             srec.policy, kept.keeper, kept.session, kept.command, kept.cgroup,
                             kept.inside, drop_output, deadline)
        conn = None
        try:
            self.state.write(KeyRecord(key, generation, srec))
            conn = _session.connect(self.state.sessions_fd, name, kept.keeper, offset=0)
            lin = Lineage._over_keeper(kept.keeper, kept.session, kept.command, kept.cgroup,
                                       kept.inside, conn.release)
        except BaseException:
            if conn is not None:
                conn.detach()
                conn.close()
            _kill_session(srec)
            self._unrecord(key, generation, name)
            raise
        return Session(srec, conn), lin

    def resume(self, key: str, srec: SessionRecord) -> tuple[Session, Any]:
        """Take over a session that outlived its supervisor; Ghost where its keeper is
        gone (its leftovers ended first, with proof where it can be had)."""

        try:
            conn = _session.connect(self.state.sessions_fd, srec.name, srec.keeper)
        except (_session.KeeperGone, OSError) as exc:
            # A ghost only once its keeper is gone for sure (one on its way out, after its
            # own teardown, is given a moment): a live keeper's session is never ended
            # for being slow; it is held (see Unanswered).
            keeper = srec.keeper
            if keeper is not None and _is_keeper(keeper) and not wait_gone(keeper, 3.0):
                raise Unanswered(f"session {srec.name}: its keeper (pid {keeper.pid}) runs "
                                 f"but did not answer ({exc})", srec) from None
            raise self._ghost(srec, str(exc)) from None
        hello = conn.hello
        cmd = hello.command
        if srec.command is not None and (cmd.pid != srec.command.pid
                                         or cmd.start_time != srec.command.start_time):
            conn.detach()
            conn.close()
            raise ProctableError(f"session {srec.name}: its keeper runs pid {cmd.pid}, the "
                                 f"record says {srec.command.pid}: not adopted")
        try:
            lin = Lineage._over_keeper(hello.keeper, hello.session, cmd, hello.cgroup,
                                       srec.inside, conn.release)
        except BaseException:
            conn.detach()
            conn.close()
            raise
        return Session(srec, conn), lin

    def _ghost(self, srec: SessionRecord, why: str) -> Ghost:
        guard = srec.session
        if guard is not None and _is_ours(guard, "pt-session"):
            # Its keeper is gone and its guard still ends the rest: what it writes last
            # (the end file) says how the session ended. Bounded.
            wait_gone(guard, 15.0)
        end = self.state.end_of(srec.name)
        left = _end_leftovers(srec, self.state.marker(srec.name))
        if srec.session is not None:
            reap_if_ours(srec.session)  # (its guard, where it re-parented to us)
        raw = None
        if end and len(end) > 1 and end[1] != "-":
            try:
                raw = decode_wait_status(int(end[1]))
            except ValueError:
                raw = None
        natural = bool(end and len(end) > 3 and end[3] == "natural")
        if end and end[0] == "orphan_timeout":
            reason = "no supervisor came within its orphan_timeout: its helper ended it"
        elif end and end[0] == "terminated":
            reason = "its helper was told to end it (SIGTERM) while no supervisor was there"
        elif end and end[0] == "helper_killed":
            reason = "its helper was killed while no supervisor was there: the session " \
                     "was ended by its guard"
        else:
            reason = f"its helpers are gone ({why})"
        if end and len(end) > 2 and end[2] == "unproven":
            reason += " (the end of every process could not be proven then)"
        if left:
            reason += f"; {left} left of it ended now"
        if natural and raw is not None:
            status = "signaled" if raw.signal is not None else "exited"
        else:
            status = "killed"
        return Ghost(f"session {srec.name}: {reason}", srec, status, raw, reason)

    def stopping(self, key: str, srec: SessionRecord, purpose: str) -> SessionRecord:
        """A stop of the session begins: recorded first, so that a next supervisor
        (this one killed during the teardown) ends it the same way instead of taking
        the command's death for a crash. Best effort: a record that cannot be written
        (a full disk) is logged; the teardown goes on."""
        out = dataclasses.replace(srec, stopping=purpose)
        try:
            self.state.write(KeyRecord(key, srec.generation, out))
        except StateDirError as exc:
            log.warning("%s", exc)
            return srec
        return out

    def end_unanswered(self, srec: SessionRecord) -> Ghost:
        """End a held session: its keeper (still the recorded pt-keeper of this uid)
        SIGKILLed, then what its guard does (everything below it, its cgroup), then
        whatever carries its marker; what is known of it, as a Ghost."""
        keeper, guard = srec.keeper, srec.session
        if keeper is not None and _is_keeper(keeper):
            try:
                fd = _pidfd.open_pidfd(keeper.pid) if _pidfd.features().pidfd else None
            except ProcessLookupError:
                fd = None
            try:
                _pidfd.signal_pinned(keeper.pid, keeper.start_time, fd, 9)
            except OSError:
                pass
            finally:
                if fd is not None:
                    os.close(fd)
            wait_gone(keeper, 5.0)
        if guard is not None:
            wait_gone(guard, 15.0)  # it ends everything below it, then itself
        return self._ghost(srec, "ended: its keeper did not answer")

    def ended(self, key: str, generation: int, name: str) -> None:
        """A session's lineage is proven gone: its record keeps only the generation."""
        self._unrecord(key, generation, name)

    def _unrecord(self, key: str, generation: int, name: str) -> None:
        try:
            self.state.write(KeyRecord(key, generation, None))
        except StateDirError as exc:
            log.warning("%s", exc)
        self.state.forget_session(name)

    def close(self) -> None:
        self.state.close()


def subprocess_pipe() -> int:
    return subprocess.PIPE


def _is_ours(ident: Identity, name: str) -> bool:
    """ident names a live helper of this uid by that name (a record's pid may name
    anything)."""
    row = read(ident.pid)
    return (row is not None and row.start_time == ident.start_time and row.name == name
            and row.uid == os.geteuid() and not _ended.row_ended(row.state, row.num_threads))


def _is_keeper(ident: Identity) -> bool:
    return _is_ours(ident, "pt-keeper")


def _kill_session(srec: SessionRecord) -> None:
    """A session that must not run (its start failed half-way): SIGKILL its keeper,
    whose guard then ends everything below it; bounded."""

    for who in (srec.keeper, srec.session):
        if who is None:
            continue
        try:
            fd = _pidfd.open_pidfd(who.pid) if _pidfd.features().pidfd else None
        except ProcessLookupError:
            continue
        try:
            _pidfd.signal_pinned(who.pid, who.start_time, fd, 9)
        except OSError:
            pass
        finally:
            if fd is not None:
                os.close(fd)
        if who is srec.keeper and srec.session is not None:
            if wait_gone(srec.session, 12.0):  # the guard ends everything, then itself
                reap_if_ours(srec.session)
            return


def _end_leftovers(srec: SessionRecord, marker: str) -> str:
    """End what is left of a session whose helpers are gone, with proof that it is
    the session's: every process carrying its marker (escapes included), and the
    lineage's cgroup where the record names one that is this session's own (a
    proctable cgroup of its keeper's, of this uid). Never a process on the
    record's word alone: a record may be corrupted or forged, and its pids reused.
    A description of what was ended, or ""."""
    ended: list[str] = []
    n = _kill_marked(marker)
    if n:
        ended.append(f"{n} process(es) carrying its marker")
    cg = srec.cgroup
    if cg is not None and _own_lineage_cgroup(cg, srec, marker):
        try:
            with open(os.path.join(cg, "cgroup.events")) as f:
                populated = "populated 1" in f.read()
        except OSError:
            populated = False
        if populated:
            try:
                with open(os.path.join(cg, "cgroup.kill"), "w") as f:
                    f.write("1")
            except OSError as exc:
                log.warning("session %s: cannot kill its cgroup %s: %s", srec.name, cg, exc)
            ended.append(f"the processes of its cgroup {cg}")
        for _ in range(100):
            try:
                os.rmdir(cg)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
    return " and ".join(ended)


def _own_lineage_cgroup(path: str, srec: SessionRecord, marker: str) -> bool:
    """path is the lineage cgroup this session's keeper made: a cgroup directory of
    this uid named proctable-<caller>-<keeper pid>[-n] that carries the session's
    mark (the keeper sets the xattr ``user.proctable.session`` to the session's
    marker when it makes it). A name alone proves nothing: a forged or stale record
    (from before a reboot) may name another live lineage's cgroup. Where the kernel
    keeps no user xattrs on cgroupfs, an empty cgroup is the session's to remove, and
    a populated one only where one of its processes carries the marker."""
    base = os.path.basename(path.rstrip("/"))
    parts = base.split("-")
    keeper = srec.keeper
    if keeper is None or len(parts) not in (3, 4) or parts[0] != "proctable" \
            or not all(p.isdigit() for p in parts[1:]) or int(parts[2]) != keeper.pid:
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            and os.path.exists(os.path.join(path, "cgroup.events"))):
        return False
    try:
        return os.getxattr(path, "user.proctable.session") == marker.encode()
    except OSError as exc:
        if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENODATA):
            return False
        if exc.errno == errno.ENODATA:
            return False  # it keeps xattrs, and this one has no mark: not the session's
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            pids = [int(x) for x in f.read().split()]
    except OSError:
        return False
    want = f"{MARKER}={marker}".encode()
    return not pids or any(_environ_has(pid, want) for pid in pids)


def _environ_has(pid: int, want: bytes) -> bool:
    """pid's environment holds want (read through a live thread where the main one
    has exited: its own environ file is empty then)."""
    paths = [f"/proc/{pid}/environ"]
    try:
        paths += [f"/proc/{pid}/task/{t}/environ" for t in os.listdir(f"/proc/{pid}/task")
                  if t != str(pid)]
    except OSError:
        pass
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read(1 << 20)
        except OSError:
            continue
        if data:
            return want in data.split(b"\0")
    return False


def _kill_marked(marker: str) -> int:
    """SIGKILL every process of this uid whose environment carries the session's
    marker (pidfd opened before the look, so a reused pid is never hit); how many."""
    want = f"{MARKER}={marker}".encode()
    me = os.getpid()
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            fd = _pidfd.open_pidfd(pid) if _pidfd.features().pidfd else None
        except (ProcessLookupError, OSError):
            continue
        try:
            row = read(pid)
            if row is None or (os.geteuid() != 0 and row.uid != os.geteuid()):
                continue
            if not _environ_has(pid, want):
                continue
            if _pidfd.signal_pinned(pid, row.start_time, fd, 9):
                killed.append(Identity(pid, row.start_time))
        except OSError:
            continue
        finally:
            if fd is not None:
                os.close(fd)
    for ident in killed:
        wait_gone(ident, 5.0)
    return len(killed)


def _handle(fd: int) -> Optional[int]:
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return None
