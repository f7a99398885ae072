"""``proctable serve``: the Supervisor as a JSON-RPC 2.0 sidecar (docs/serve.md)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from .._argtypes import seconds_arg

__all__ = ["register"]

log = logging.getLogger("proctable.serve")


def _cmd_serve(args: argparse.Namespace) -> int:
    from ..serve._log import install  # noqa: PLC0415 - on use

    # Whatever the sidecar says on stderr goes through a queue that never blocks it:
    # a client may leave that pipe unread (docs/serve.md, "Lifetime").
    stderr = install(sys.stderr.fileno())
    try:
        return _serve(args)
    finally:
        stderr.flush(2.0)  # bounded: a reader that never comes does not hold the exit


def _serve(args: argparse.Namespace) -> int:
    from ..serve import Server, serve_socket, serve_stdio  # noqa: PLC0415 - on use
    from ..serve._client import WRITE_TIMEOUT  # noqa: PLC0415 - on use

    write_timeout = WRITE_TIMEOUT if args.write_timeout is None else args.write_timeout
    try:
        server = Server(grace=args.grace, kill_timeout=args.kill_timeout, mode=args.mode,
                        state_dir=args.state, on_adopt=args.on_adopt,
                        ring_size=args.ring_size, orphan_timeout=args.orphan_timeout,
                        session_cgroup=args.session_cgroup,
                        write_timeout=write_timeout)
    except Exception as exc:
        log.error("%s", exc)  # noqa: TRY400 - the message says it all
        return 1
    if args.socket is None:
        return serve_stdio(server)
    try:
        return serve_socket(server, args.socket)
    except OSError as exc:
        log.error("--socket %s: %s", args.socket, exc.strerror or exc)  # noqa: TRY400
        server.shutdown()
        return 1


def register(sub: Any) -> None:
    """Add ``proctable serve`` to the command line's subparsers."""
    p = sub.add_parser(
        "serve",
        help="run a supervisor as a sidecar: JSON-RPC 2.0 over stdio or a Unix socket",
        description="Run a Supervisor for a client in another language, speaking JSON-RPC "
        "2.0, one object a line (docs/serve.md), on stdin/stdout, or on a Unix socket "
        "that only this user can connect to (--socket). stdin's end (stdio), SIGTERM or "
        "SIGINT stop every key side by side, and the sidecar exits 0 (1 when a teardown "
        "could not prove every member gone). If the sidecar is killed, its lineages die "
        "with it. With --state, every key is a durable session instead: it outlives the "
        "sidecar (its end, SIGTERM, SIGKILL, or the detach method) and the next "
        "sidecar on the same directory takes it back; the close method ends them.",
    )
    p.add_argument("--socket", metavar="PATH", default=None,
                   help="serve on a Unix socket at PATH (mode 0600) instead of stdio; "
                   "several clients share the keys and every key's events")
    p.add_argument("--grace", type=seconds_arg, default=3.0, metavar="S",
                   help="default seconds between SIGTERM and SIGKILL at teardown (default 3)")
    p.add_argument("--kill-timeout", type=seconds_arg, default=3.0, metavar="S",
                   help="seconds allowed after SIGKILL (default 3)")
    p.add_argument("--write-timeout", type=seconds_arg, default=None, metavar="S",
                   help="seconds a write method waits for a command that does not read "
                   "its input before it gives up with no_input (default 5)")
    p.add_argument("--mode", choices=["auto", "cgroup", "subreaper", "scan"], default="auto",
                   help="lineage backend (default: the strongest this host allows)")
    p.add_argument("--state", metavar="PATH", default=None,
                   help="durable sessions: keep every key's session in this state "
                   "directory (0700, this user's; made if missing), re-adopt the sessions "
                   "found there at start")
    p.add_argument("--on-adopt", choices=["keep", "stop"], default="keep",
                   help="with --state: take the surviving sessions over (keep, the "
                   "default) or end each with proof at start (stop)")
    p.add_argument("--ring-size", type=int, default=1 << 20, metavar="BYTES",
                   help="with --state: output each session's helper keeps (default 1 MiB)")
    p.add_argument("--orphan-timeout", type=seconds_arg, default=None, metavar="S",
                   help="with --state: end a session left without a sidecar this long "
                   "(default: never)")
    p.add_argument("--session-cgroup", metavar="DIR", default=None,
                   help="with --state: a cgroup v2 directory outside the service's own "
                   "for the sessions (so that a service manager's stop spares them)")
    p.set_defaults(func=_cmd_serve)
