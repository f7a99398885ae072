"""``proctable serve``: the Supervisor as a sidecar, JSON-RPC 2.0 over stdio or a Unix socket.

- :mod:`._protocol`: the wire as a pure object (bytes in -> requests and ready
  answers; results, errors, notifications -> bytes), with every method's
  parameter table; no I/O.
- :mod:`._objects`: what results and notifications hold, from the package's objects.
- :mod:`._server`: the loop around them (stdio or a socket), the methods, and
  the per-client queues that keep a slow reader from stalling anyone.

docs/serve.md is the protocol's reference.
"""

from __future__ import annotations

from ._protocol import (
    APP_ERRORS,
    MAX_LINE,
    VERSION,
    Answer,
    Protocol,
    Reply,
    Request,
    RpcError,
)
from ._server import Server, serve_socket, serve_stdio

__all__ = [
    "APP_ERRORS",
    "MAX_LINE",
    "VERSION",
    "Answer",
    "Protocol",
    "Reply",
    "Request",
    "RpcError",
    "Server",
    "serve_socket",
    "serve_stdio",
]
