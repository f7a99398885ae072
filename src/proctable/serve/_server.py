"""The sidecar's loop: a Supervisor, its clients, and the protocol object between them.

Threads, and what each may block on:

- the main thread reads (stdin, or the listening socket and every client's socket,
  with one selector and the signal wake-up fd), feeds each peer's
  :class:`~._protocol.Protocol`, and starts each request. It blocks on nothing
  but the selector: a call that takes time runs on a future's callback
  (``start``, ``stop``, ``remove``, ``adopt``) or on a short worker thread
  (``close``, ``write``, ``ps``, ``members``);
- one writer thread per client, which writes what is queued for it. A response
  or lifecycle notification sent while nothing is queued and the writer is idle
  is written at once by the sending thread where that cannot block (a socket
  with MSG_DONTWAIT, a pipe with a free slot), saving the writer's wake-up. Its queue
  holds responses and lifecycle notifications without limit (they are never
  dropped; a client whose backlog of them passes ``BACKLOG_LIMIT`` is
  disconnected, its keys left running) and ``output`` notifications up to
  ``OUTPUT_BUDGET`` bytes; output past that is dropped for that client only, and
  counted, and a ``lost`` notification tells the count before the key's next
  notification to it. So a client that stops reading stalls nobody;
- the Supervisor's own threads. Its dispatch thread calls :meth:`Server._on_event`,
  which only queues lines (it never waits), so the wire carries each key's events
  in the order of the Python API.

A response comes after every notification its request caused: the callback that
answers hands the response to the Supervisor's dispatch thread, which queues it once
it has delivered every event emitted before it.
"""

from __future__ import annotations

import base64
import errno
import itertools
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Optional, Union

from .. import __version__
from .._jsonobjects import probe_object, proc_object
from .._output import Output
from .._pidfd import features
from ..errors import (
    AccessDenied,
    GenerationEnded,
    InputBlocked,
    NoSuchProcess,
    ProctableError,
    StartCancelled,
    SupervisorClosed,
    TeardownError,
)
from ..exits import ExitFuture, ExitWatcher, exit_probe, terminate
from ..lineage import _hub
from ..lineage._cgroup import usable_parent
from ..lineage.subreaper import SubreaperBackend
from ..supervise import KINDS, Event, RestartPolicy, Supervisor
from ..supervise._dispatch import output_events
from ..supervise._policy import FixedArgs
from ..table import Identity, identity, reader, snapshot
from ._client import BACKLOG_LIMIT, OUTPUT_BUDGET, WRITE_TIMEOUT, _Backlog, _Client, _consume
from ._objects import (
    event_params,
    exit_params,
    identity_result,
    member_params,
    output_frame,
    output_line,
    proc_brief,
    status_fields,
)
from ._order import _LATER, _KeyOrder, _Later
from ._protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MAX_LINE,
    METHODS,
    VERSION,
    Answer,
    Protocol,
    Reply,
    Request,
    RpcError,
)

__all__ = ["BACKLOG_LIMIT", "FRESH_TIMEOUT", "OUTPUT_BUDGET", "TAIL_LIMIT", "WRITE_TIMEOUT",
           "Server"]

log = logging.getLogger("proctable.serve")

TAIL_LIMIT = 256 << 10
"""Bytes of each key's output kept for ``tail`` (hello's ``tail_limit``)."""
FRESH_TIMEOUT = 5.0
"""Seconds the sidecar waits for a client's answer to ``fresh`` (``restart.fresh_timeout``)."""
_HAS_OUTPUT = "output" in KINDS  # the output engine is in this build's Supervisor
_FLUSH_WAIT = 30.0


class Server:
    """The sidecar: one Supervisor shared by every client, the methods, the events."""

    def __init__(self, *, grace: float = 3.0, kill_timeout: float = 3.0, mode: str = "auto",
                 max_line: int = MAX_LINE, state_dir: Optional[str] = None,
                 on_adopt: str = "keep", ring_size: int = 1 << 20,
                 orphan_timeout: Optional[float] = None,
                 session_cgroup: Optional[str] = None,
                 write_timeout: float = WRITE_TIMEOUT) -> None:
        self.max_line = max_line
        self.grace = grace
        self.kill_timeout = kill_timeout
        self._clients_lock = threading.Lock()
        self.clients: list[_Client] = []
        self._generations: dict[str, dict[tuple[int, int], int]] = {}
        self._gen_lock = threading.Lock()
        self._watcher: Optional[ExitWatcher] = None
        self._watcher_lock = threading.Lock()
        self._closed = False
        self._caps: Optional[dict[str, Any]] = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._order = _KeyOrder()
        self._asks = itertools.count(1)  # the ids of our requests to clients
        # Which client paces each key's output (the one that started it; see _pacer).
        self._pacers: dict[str, _Client] = {}
        self.ending = False  # the loop ends (a detach was asked for)
        self.closed_keys = False  # close was called: the shutdown closes, never detaches
        self._backlog = _Backlog(self)
        durable = state_dir is not None
        self.sup = Supervisor(on_event=self._on_event, grace=grace, kill_timeout=kill_timeout,
                              mode=mode, tail_size=TAIL_LIMIT, write_timeout=write_timeout,
                              _output_sink=self._on_output, state_dir=state_dir,
                              on_adopt=on_adopt if durable else "keep",
                              ring_size=ring_size if durable else 1 << 20,
                              orphan_timeout=orphan_timeout if durable else None,
                              session_cgroup=session_cgroup if durable else None)
        self.durable = durable
        self.write_timeout = float(write_timeout)  # checked by the Supervisor
        self._methods: dict[str, Callable[[_Client, Request], Any]] = {
            "hello": self._hello, "version": self._hello, "start": self._start,
            "stop": self._stop, "remove": self._remove, "adopt": self._adopt,
            "list": self._list, "write": self._write, "resize": self._resize,
            "signal": self._signal, "tail": self._tail, "members": self._members,
            "ps": self._ps, "probe": self._probe, "watch": self._watch, "close": self._close,
            "terminate": self._terminate, "detach": self._detach,
        }
        assert set(self._methods) == set(METHODS)

    def wake(self) -> None:
        """Make the main loop look again (a writer saw its peer leave)."""
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    # -- clients ------------------------------------------------------------------------

    def add_client(self, rfd: int, wfd: int, sock: Optional[socket.socket],
                   name: str) -> _Client:
        c = _Client(self, rfd, wfd, sock, name)
        with self._clients_lock:
            self._backlog.move_into(c)  # what came while no client was there, first
            self.clients = [*self.clients, c]
        return c

    def drop_client(self, c: _Client) -> None:
        with self._clients_lock:
            self.clients = [x for x in self.clients if x is not c]
        c.finish()

    def feed(self, c: _Client, data: bytes) -> None:
        """Bytes from a client: answer what is no request, start every request."""
        items = c.proto.receive(data) if data else c.proto.end()
        c.hold()
        try:
            for item in items:
                if isinstance(item, Answer):
                    c.send(item.line)
                elif isinstance(item, Reply):
                    c.answered(item)
                else:
                    self.dispatch(c, item)
        finally:
            c.release()

    def dispatch(self, c: _Client, req: Request) -> None:
        try:
            result = self._methods[req.method](c, req)
        except RpcError as err:
            self._error(c, req, err)
            return
        except Exception as exc:  # a bug of ours: said, never a dead sidecar
            log.exception("serve: %s failed", req.method)
            self._error(c, req, RpcError(INTERNAL_ERROR, f"internal error: {exc!r}"))
            return
        if isinstance(result, _Later):
            return  # answered by a callback
        self._reply(c, req, result)

    def _reply(self, c: _Client, req: Request, result: Any) -> None:
        if req.id is not None:
            c.send(Protocol.response(req.id, result))

    def _error(self, c: _Client, req: Request, err: RpcError) -> None:
        if req.id is not None:
            c.send(Protocol.error(req.id, err))

    # -- events ---------------------------------------------------------------------------

    def _targets(self) -> list[_Client]:
        """Whom a notification goes to: every client, or the backlog while there is none
        (under the clients lock, so that a client being added gets it either way)."""
        return self.clients or [self._backlog]

    def _pacer(self, key: str) -> Optional[_Client]:
        """The client whose reading paces key's output: the one that started it while it
        is connected, else the client connected longest; None without a client."""
        c = self._pacers.get(key)
        if c is not None and c.reachable:
            return c
        for c in self.clients:
            if c.reachable:
                return c
        return None

    def _on_output(self, out: Output) -> None:
        """On the supervisor's dispatch thread, in its place among the events: what a
        generation wrote, as output lines, one per client (never waits). The key's
        pacing client gets every line, and only once it has written one is it
        consumed (the supervisor then reads on for the key); the others get what fits
        their budget."""
        evs = output_events(out)
        if not evs:
            return
        key = str(out.key)
        with self._clients_lock:
            targets = self._targets()
            pacer = None if out.bound.drop else self._pacer(key)
            for ev in evs:
                data = ev.data or b""
                text = b""
                frame: Union[bytes, tuple[bytes, bytes]] = b""
                n = len(data) + ev.dropped
                end = (ev.offset or 0) + len(data)
                for c in targets:
                    if c.binary:
                        line = frame = frame or output_frame(ev)
                    else:
                        line = text = text or output_line(ev)
                    if c is pacer:
                        c.send_output(key, ev.generation, line, n, (out, len(data), end))
                    else:
                        c.send_output(key, ev.generation, line, n)
                if pacer is None:
                    _consume([(out, len(data), end)])

    def _on_event(self, ev: Event) -> None:
        """On the supervisor's dispatch thread: queue one line per client; never waits."""
        key = str(ev.key)
        if ev.kind == "output":  # (only where no output sink takes them: never here)
            return
        if ev.kind == "created" and ev.identity is not None:
            with self._gen_lock:
                gens = self._generations.setdefault(key, {})
                gens[(ev.identity.pid, ev.identity.start_time)] = ev.generation
                while len(gens) > 8:
                    del gens[next(iter(gens))]
        elif ev.kind == "deleted":
            with self._gen_lock:
                self._generations.pop(key, None)
        line = Protocol.notification("event", event_params(ev))
        with self._clients_lock:
            for c in self._targets():
                c.send(line, key)

    def _generation_of(self, key: str, ident: Identity) -> int:
        with self._gen_lock:
            gen = self._generations.get(key, {}).get((ident.pid, ident.start_time))
        return self.sup.generation(key) if gen is None else gen

    def _answer_after_events(self, c: _Client, req: Request, fut: Future[Any],
                             result: Callable[[Any], Any]) -> _Later:
        """Answer req when fut is done, after every event emitted so far is queued:
        the answer is queued by the supervisor's dispatch thread once it has queued
        those events (no thread waits for it)."""
        def answer(f: Future[Any]) -> None:
            try:
                value = f.result()
            except BaseException as exc:
                self._error(c, req, _rpc_error(exc, req, self.write_timeout))
                return
            try:
                self._reply(c, req, result(value))
            except Exception as exc:
                log.exception("serve: answering %s", req.method)
                self._error(c, req, RpcError(INTERNAL_ERROR, f"internal error: {exc!r}"))

        def done(f: Future[Any]) -> None:
            self.sup._after_events(lambda: answer(f))
        fut.add_done_callback(done)
        return _LATER

    def _in_thread(self, c: _Client, req: Request, work: Callable[[], Any]) -> _Later:
        """Run work on a worker thread; answer with its result or its error."""
        def run() -> None:
            try:
                value = work()
            except RpcError as err:
                self._error(c, req, err)
                return
            except BaseException as exc:
                self._error(c, req, _rpc_error(exc, req, self.write_timeout))
                return
            self._reply(c, req, value)
        c.workers.submit(run, req.method)
        return _LATER

    def _in_order(self, c: _Client, req: Request, work: Callable[[], Any]) -> _Later:
        """Run work on a worker in its key's turn (see _KeyOrder); answer with its result
        or its error."""
        def run() -> None:
            try:
                value = work()
            except BaseException as exc:
                self._error(c, req, _rpc_error(exc, req, self.write_timeout))
                return
            self._reply(c, req, value)

        def refuse(exc: BaseException) -> None:
            self._error(c, req, RpcError("failed", str(exc), {"key": req.params["key"]}))
        self._order.run(req.params["key"], run, lambda job: c.workers.submit(job, req.method),
                        refuse)
        return _LATER

    def _gate(self, key: str, fut: Future[Any]) -> Future[Any]:
        self._order.gate(key, fut)
        return fut

    # -- methods ------------------------------------------------------------------------

    def capabilities(self) -> dict[str, Any]:
        if self._caps is None:
            self._caps = _capabilities()
        return self._caps

    def _hello(self, c: _Client, req: Request) -> Any:
        binary = req.params.get("output") == "binary"

        def answer() -> None:
            try:
                result = self._hello_result(binary)
            except BaseException as exc:
                self._error(c, req, _rpc_error(exc, req, self.write_timeout))
                return
            # The answer and the switch to frames under the lock output is sent under:
            # every output line after the answer is a frame, none before it.
            with self._clients_lock:
                self._reply(c, req, result)
                c.binary = binary
        if self._caps is not None:
            answer()
        else:  # the first call looks at the host (BPF, the connector): a worker's job
            c.workers.submit(answer, req.method)
        return _LATER

    def _hello_result(self, binary: bool = False) -> Any:
        return {"protocol": VERSION, "output": "binary" if binary else "base64",
                "version": __version__, "pid": os.getpid(), "uid": os.geteuid(),
                "methods": sorted(METHODS), "notifications": ["event", "output", "exit", "lost"],
                "requests": ["fresh"],
                "max_line": self.max_line, "output_budget": OUTPUT_BUDGET,
                "tail_limit": TAIL_LIMIT, "write_timeout": self.write_timeout,
                "state_dir": self.sup.state_dir,
                "adoption_problems": list(self.sup.adoption_problems),
                "capabilities": {**self.capabilities(), "durable": self.durable}}

    def _start(self, c: _Client, req: Request) -> Any:
        p = req.params
        key = p["key"]
        kw = _popen_kwargs(p)
        output = p.get("output", "events")
        pty = p.get("pty")
        if not _HAS_OUTPUT:
            asked = pty is not None or p.get("stdin") == "pipe"
            if asked or (output == "events" and "output" in p):
                raise RpcError("not_supported", "this proctable has no output engine "
                               "(output events, pty, stdin pipe)")
            if output == "events":
                output = "discard"  # never the sidecar's stdout: that is the protocol
        if _HAS_OUTPUT:
            if pty is not None:
                kw["pty"] = (pty["rows"], pty["cols"])
            elif output == "events":
                kw["output"] = "events"
        if "pty" not in kw:
            if output == "discard":
                kw["stdout"] = kw["stderr"] = subprocess.DEVNULL
            elif output == "stderr":
                kw["stdout"] = sys.stderr.fileno()
            kw["stdin"] = subprocess.PIPE if p.get("stdin") == "pipe" else subprocess.DEVNULL
        if p.get("drop_output"):
            kw["drop_output"] = True
        try:
            policy = self._policy(c, key, p.get("restart"), p["args"])
            fut = self._gate(key, self.sup.submit_start(key, p["args"], policy,
                                                        p.get("timeout"), **kw))
        except (TypeError, ValueError) as exc:
            raise RpcError(-32602, str(exc)) from None
        except ProctableError as exc:  # (a durable key held: its session did not answer)
            raise RpcError("failed", str(exc), {"key": key}) from None
        self._pacers[key] = c  # its output is paced by this client's reading
        return self._answer_after_events(
            c, req, fut, lambda ident: identity_result(ident, self._generation_of(key, ident)))

    def _policy(self, c: _Client, key: str, r: Optional[dict[str, Any]],
                args: Optional[list[str]]) -> Optional[RestartPolicy]:
        if r is not None and r.get("fresh") == "ask":
            return _policy(r, self._fresh_from(c, key, r, args))
        return _policy(r)

    def _fresh_from(self, c: _Client, key: str, r: dict[str, Any],
                    args: Optional[list[str]]) -> Callable[[Any], Optional[list[str]]]:
        """restart.fresh "ask": a fresh factory that asks client c (docs/serve.md, "The
        fresh request"). It runs on a supervisor worker of its own and may block."""
        timeout = r.get("fresh_timeout", FRESH_TIMEOUT)
        fixed = r.get("fresh_args")
        ran = [args]  # what the run that exited ran: the args asked with, and the fallback

        def fresh(_key: Any) -> Optional[list[str]]:
            # The client that started the key, else (it left: a reconnect) the one
            # that paces it now; with none, the fallback at once.
            asked = c if c.reachable else self._pacer(key)
            reply = None if asked is None else self._ask(
                asked, "fresh", {"key": key, "generation": self.sup.generation(key),
                                 "args": ran[0]}, key, timeout)
            if reply is not None and reply.error is not None \
                    and reply.error.get("code") == -32601:
                reply = None  # a client that answers no fresh: as if it had not answered
            if reply is None:  # no answer in time, or no client to ask: the fallback
                ran[0] = fixed or ran[0]
                log.warning("key %r: no answer to fresh within %gs; rerunning %s", key,
                            timeout, "fresh_args" if fixed else "the same args")
                return ran[0]
            if reply.error is not None:
                raise ProctableError("the client answered fresh with an error: "
                                     f"{reply.error.get('message')}")
            if reply.result is None:
                return None  # the client said stop: gave_up
            answer = reply.result
            if not isinstance(answer, list) or not answer or not all(
                    isinstance(a, str) and "\x00" not in a for a in answer):
                raise ProctableError("the client's fresh answer is not null or a non-empty "
                                     f"list of strings: {str(answer)[:200]}")
            ran[0] = list(answer)
            return ran[0]
        return _Asking(fresh, fixed)

    def _ask(self, c: _Client, method: str, params: dict[str, Any], key: str,
             timeout: float) -> Optional[Reply]:
        """Send client c a request of ours, after every event emitted so far (so a
        fresh comes after its exited and restarting); its answer, or None."""
        self.sup.flush_events(_FLUSH_WAIT)
        id_ = f"{method}-{next(self._asks)}"
        asked = c.ask(id_, Protocol.request(id_, method, params), key)
        reply = asked.wait(timeout)
        if reply is None:
            c.forget(id_)  # a late answer is ignored
        return reply

    def _adopt(self, c: _Client, req: Request) -> Any:
        p = req.params
        key = p["key"]
        ident = _pinned(p["pid"], p["start_time"])
        kw = _popen_kwargs(p)
        if "args" in p:
            kw["stdin"] = subprocess.DEVNULL
            kw["stdout"] = kw["stderr"] = subprocess.DEVNULL
        policy = self._policy(c, key, p.get("restart"), p.get("args"))
        fut = self._gate(key, self.sup.submit_adopt(key, ident, policy, p.get("args"), **kw))
        return self._answer_after_events(
            c, req, fut, lambda i: identity_result(i, self._generation_of(key, i)))

    def _stop(self, c: _Client, req: Request) -> Any:
        try:  # a grace past what the supervisor waits on (MAX_SECONDS) is a bad param
            fut = self.sup.submit_stop(req.params["key"], req.params.get("grace"))
        except (TypeError, ValueError) as exc:
            raise RpcError(-32602, str(exc), {"param": "grace"}) from None
        return self._answer_after_events(c, req, fut, status_fields)

    def _remove(self, c: _Client, req: Request) -> Any:
        try:
            fut = self.sup.submit_remove(req.params["key"], req.params.get("grace"))
        except (TypeError, ValueError) as exc:
            raise RpcError(-32602, str(exc), {"param": "grace"}) from None
        return self._answer_after_events(c, req, fut, lambda _v: {})

    def _close(self, c: _Client, req: Request) -> Any:
        self.closed_keys = True  # (a durable sidecar closes, then, rather than detaches)

        def work() -> Any:
            self.sup.close(req.params.get("grace"))
            self.sup.flush_events(_FLUSH_WAIT)
            return {}
        return self._in_thread(c, req, work)

    def _detach(self, c: _Client, req: Request) -> Any:
        """A durable sidecar leaves every session running and ends (after this answer):
        the next ``proctable serve --state`` on the same directory takes them back."""
        if not self.durable:
            raise RpcError("not_supported", "detach needs a durable sidecar "
                           "(proctable serve --state PATH)")
        self.ending = True
        self.wake()
        return {}

    def _list(self, c: _Client, req: Request) -> Any:
        out = []
        for key in sorted(str(k) for k in self.sup.keys()):  # noqa: SIM118 - a method
            lin = self.sup.lineage(key)
            root = None if lin is None else lin.root
            out.append({"key": key, "state": self.sup.state(key),
                        "generation": self.sup.generation(key),
                        "running": self.sup.running(key),
                        "pid": None if root is None else root.pid,
                        "start_time": None if root is None else root.start_time,
                        "mode": None if lin is None else lin.mode,
                        "last_input": self._last_input(key)})
        return {"keys": out}

    def _last_input(self, key: str) -> Optional[dict[str, Any]]:
        last = getattr(self.sup, "last_input", None)
        try:
            seen = None if last is None else last(key)
        except KeyError:  # removed since keys() was read
            return None
        if seen is None:
            return None
        t, data = seen
        return {"time": round(t, 6), "data_b64": base64.b64encode(data).decode("ascii")}

    def _known(self, key: str) -> None:
        if key not in self.sup:
            raise RpcError("no_such_key", f"no key {key!r}", {"key": key})

    def _members(self, c: _Client, req: Request) -> Any:
        key = req.params["key"]

        def work() -> Any:
            self._known(key)
            lin = self.sup.lineage(key)
            if lin is None or lin.closed:
                return member_params([], [])
            try:
                return member_params(lin.members(), lin.suspects())
            except ProctableError:  # closed under us: it has no members now
                return member_params([], [])
        return self._in_order(c, req, work)

    def _signal(self, c: _Client, req: Request) -> Any:
        key = req.params["key"]
        sig = _signum(req.params["signal"])

        def work() -> Any:
            self._known(key)
            lin = self.sup.lineage(key)
            root = None if lin is None else lin.root
            if root is None or not self.sup.running(key):
                raise RpcError("no_such_process", f"key {key!r} runs no process", {"key": key})
            try:
                # Through a pidfd proven to be of the root (Supervisor.signal): a pidfd
                # opened by pid alone could be of a process that took the root's pid.
                sent = self.sup.signal(key, sig)
            except (AccessDenied, PermissionError) as exc:
                raise RpcError("failed", f"signal refused: {exc}") from None
            return {"sent": sent, "pid": root.pid, "start_time": root.start_time}
        return self._in_order(c, req, work)

    def _io(self, name: str) -> Callable[..., Any]:
        fn = getattr(self.sup, name, None)
        if fn is None:
            raise RpcError("not_supported", f"this proctable's Supervisor has no {name}()")
        return fn  # type: ignore[no-any-return]

    def _write(self, c: _Client, req: Request) -> Any:
        p = req.params
        write = self._io("write")
        close_stdin = self._io("close_stdin") if p.get("eof") else None

        def work() -> Any:
            n = write(p["key"], p["data_b64"])
            if close_stdin is not None:
                close_stdin(p["key"])
            return {"written": n}
        return self._in_order(c, req, work)

    def _resize(self, c: _Client, req: Request) -> Any:
        p = req.params
        resize = self._io("resize")
        return self._in_order(c, req, lambda: resize(p["key"], p["rows"], p["cols"]) or {})

    def _tail(self, c: _Client, req: Request) -> Any:
        p = req.params
        tail = self._io("tail")
        asked = p.get("bytes", 65536)
        since = p.get("since")
        generation = p.get("generation")

        def work() -> Any:
            if generation is not None and since is None:
                raise RpcError(-32602, "tail's generation names the generation of since: "
                               "give since too")
            if since is not None:
                r = tail(p["key"], asked, since=since, generation=generation)
                return {"data_b64": base64.b64encode(r.data).decode("ascii"), "asked": asked,
                        "given": len(r.data), "generation": r.generation, "since": r.since,
                        "offset": r.offset, "dropped": r.dropped, "end": r.end,
                        "limit": None if self.durable else TAIL_LIMIT}
            data: bytes = tail(p["key"], asked)
            return {"data_b64": base64.b64encode(data).decode("ascii"), "asked": asked,
                    "given": len(data), "limit": TAIL_LIMIT}
        return self._in_order(c, req, work)

    def _ps(self, c: _Client, req: Request) -> Any:
        p = req.params
        try:
            pattern = re.compile(p["name"]) if "name" in p else None
        except re.error as exc:
            raise RpcError(-32602, f"name is not a regular expression: {exc}",
                           {"param": "name"}) from None
        pids = set(p.get("pids", ())) or None
        uids = set(p.get("uids", ())) or None
        kthreads = p.get("kernel_threads", False)

        def work() -> Any:
            table = snapshot()
            rows = [proc_object(r) for r in table
                    if (kthreads or not r.kernel_thread)
                    and (pids is None or r.pid in pids)
                    and (uids is None or r.uid in uids)
                    and (pattern is None or pattern.search(r.name))]
            denied = [{"pid": d.pid, "uid": d.uid} for d in table.denied
                      if pids is None or d.pid in pids]
            return {"procs": rows, "denied": denied}
        return self._in_thread(c, req, work)

    def _probe(self, c: _Client, req: Request) -> Any:
        pid = req.params["pid"]
        return probe_object(pid, exit_probe(pid, req.params.get("start_time")))

    def _watch(self, c: _Client, req: Request) -> Any:
        if req.id is None:
            return None  # a notification is never answered: no response, and no exit
        pid = req.params["pid"]
        st = req.params.get("start_time")
        with self._watcher_lock:
            if self._watcher is None:
                self._watcher = ExitWatcher()
            watcher = self._watcher
        target: Any = pid if st is None else Identity(pid, st)
        try:
            fut = watcher.watch(target)
        except ProctableError as exc:
            raise _rpc_error(exc, req, self.write_timeout) from None
        pinned = fut.identity
        start_time = pinned.start_time if pinned is not None else st

        def done(f: Future[Any]) -> None:
            assert isinstance(f, ExitFuture)
            exc = f.exception() if not f.cancelled() else ProctableError("the watch was closed")
            status = None if exc is not None else f.result()
            c.send(Protocol.notification("exit", {"watch": req.id, **exit_params(
                pid, start_time, status, exc, f.source)}))
        self._reply(c, req, {"pid": pid, "start_time": start_time})
        fut.add_done_callback(done)  # after the response: `exit` never comes before it
        return _LATER

    def _terminate(self, c: _Client, req: Request) -> Any:
        p = req.params
        pid, start_time = p["pid"], p["start_time"]
        if pid == os.getpid():
            raise RpcError(INVALID_PARAMS, "pid is the sidecar itself: end its input, or "
                           "send it SIGTERM", {"param": "pid"})
        grace = p.get("grace", self.grace)
        kill_timeout = p.get("kill_timeout", self.kill_timeout)

        def work() -> Any:
            ident = _pinned(pid, start_time)  # no_such_process: gone, or another process
            try:
                status = terminate(ident, grace, kill_timeout)  # signals that identity only
            except PermissionError as exc:
                raise RpcError("failed", f"terminate refused: {exc}",
                               {"pid": pid, "errno": "EPERM"}) from None
            if status is not None:
                return {**status_fields(status), "outcome": "exited"}
            if ident.alive():  # SIGKILL and its kill_timeout went by: it runs on
                row = ident.current(memory=False)
                raise RpcError("teardown_failed", f"pid {pid} still runs after SIGKILL and "
                               f"{kill_timeout:g}s", {"pid": pid, "survivors": [
                                   {"pid": pid, "start_time": start_time,
                                    "name": None if row is None else proc_brief(row)["name"]}]})
            return {**status_fields(None), "outcome": "unknown"}  # ended; status unreadable
        return self._in_thread(c, req, work)

    # -- the end ------------------------------------------------------------------------

    def shutdown(self) -> int:
        """Close every key side by side, deliver what is left, stop. The exit code:
        0, or 1 when a teardown could not prove every member gone. A durable sidecar
        detaches instead (every session goes on for the next sidecar), unless a
        client called ``close``."""
        code = 0
        if self.durable and not self.closed_keys:
            self.sup.detach()
        else:
            try:
                self.sup.close()
            except TeardownError as exc:
                log.error("%s", exc)  # noqa: TRY400 - names the survivors; no traceback
                code = 1
            self.sup.flush_events(_FLUSH_WAIT)
        with self._watcher_lock:
            if self._watcher is not None:
                self._watcher.close()
        # A call on a worker when the input ended (hello, ps...) is still answered.
        for c in self.clients:
            c.workers.wait(5.0)
        for c in self.clients:
            c.drain(5.0)
        return code


class _Asking:
    """restart.fresh "ask": the factory that asks the client, with the ``fresh_args``
    of its fallback, which a durable session records (the ask cannot be: a key
    re-adopted by the next sidecar reruns its fallback)."""

    def __init__(self, ask: Callable[[Any], Optional[list[str]]],
                 fresh_args: Optional[list[str]]) -> None:
        self._ask = ask
        self.fresh_args = fresh_args

    def __call__(self, key: Any) -> Optional[list[str]]:
        return self._ask(key)


def _pinned(pid: int, start_time: int) -> Identity:
    now = identity(pid)
    if now is None:
        raise RpcError("no_such_process", f"no process {pid}", {"pid": pid})
    if now.start_time != start_time:
        raise RpcError("no_such_process", f"pid {pid} names another process now",
                       {"pid": pid, "start_time": now.start_time})
    return now


def _popen_kwargs(p: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if "cwd" in p:
        kw["cwd"] = p["cwd"]
    if "env" in p:
        kw["env"] = p["env"]
    return kw


def _policy(r: Optional[dict[str, Any]],
            fresh: Optional[Callable[[Any], Optional[list[str]]]] = None
            ) -> Optional[RestartPolicy]:
    if r is None:
        return None
    fresh_args = r.get("fresh_args")
    kw = {k: v for k, v in r.items() if k not in ("fresh_args", "fresh", "fresh_timeout")}
    if fresh is None and fresh_args is not None:
        fresh = FixedArgs(fresh_args)  # plain data: a durable session records it
    try:
        return RestartPolicy(fresh=fresh, **kw)
    except (TypeError, ValueError) as exc:
        raise RpcError(-32602, f"restart: {exc}", {"param": "restart"}) from None


def _signum(v: Any) -> int:
    if isinstance(v, int):
        return v
    try:
        return int(signal.Signals[v])
    except KeyError:
        raise RpcError(-32602, f"no signal {v}", {"param": "signal"}) from None


def _rpc_error(exc: BaseException, req: Request, write_timeout: float) -> RpcError:
    """A failure of the package as the wire's error."""
    key = req.params.get("key")
    k = {} if key is None else {"key": key}
    if isinstance(exc, RpcError):
        return exc
    if isinstance(exc, GenerationEnded):
        return RpcError("generation_ended", str(exc), {**k, "generation": exc.generation,
                                                       "current": exc.current})
    if isinstance(exc, KeyError):
        return RpcError("no_such_key", f"no key {key!r}", k)
    if isinstance(exc, SupervisorClosed):
        return RpcError("closed", "the supervisor is closed", k)
    if isinstance(exc, StartCancelled):
        return RpcError("cancelled", str(exc), k)
    if isinstance(exc, TeardownError):
        return RpcError("teardown_failed", str(exc), {**k, "survivors": [
            proc_brief(p) for p in exc.survivors]})
    missing_cwd = (req.method == "start" and isinstance(exc, FileNotFoundError)
                   and exc.filename is not None and exc.filename == req.params.get("cwd"))
    if isinstance(exc, FileNotFoundError) and not missing_cwd:
        return RpcError("command_not_found", str(exc), {**k, "errno": "ENOENT"})
    if isinstance(exc, NoSuchProcess):
        return RpcError("no_such_process", str(exc), k)
    if isinstance(exc, OSError) and exc.errno is not None and req.method == "start":
        return RpcError("spawn_failed", str(exc), {**k, "errno": errno.errorcode.get(
            exc.errno, str(exc.errno))})
    if isinstance(exc, InputBlocked):  # the command did not read within the timeout
        return RpcError("no_input", str(exc), {**k, "written": exc.written,
                                               "timeout": write_timeout})
    if type(exc).__name__ in ("NoInput", "NotATerminal") or (
            isinstance(exc, ProctableError) and req.method in ("write", "resize")):
        return RpcError("no_input", str(exc), k)
    if isinstance(exc, (TypeError, ValueError)):
        return RpcError(-32602, str(exc))
    return RpcError("failed", str(exc) or type(exc).__name__, k)


def _capabilities() -> dict[str, Any]:
    f = features()
    sub = _hub.subscribe(lambda: None, False)
    if sub is not None:
        sub.close()
    rd = reader()
    return {"pidfds": f.pidfd, "pidfd_exit_info": f.pidfd_info,
            "bpf": rd.name == "bpf", "bpf_why_not": rd.why_not,
            "cgroup": SubreaperBackend.usable(None) is not None and usable_parent(None) is not None,
            "subreaper": SubreaperBackend.usable(None) is not None,
            "connector": sub is not None,
            "output": _HAS_OUTPUT, "pty": _HAS_OUTPUT}


# --- the loops ---------------------------------------------------------------------------
