"""``proctable serve``: the Supervisor as a sidecar, JSON-RPC 2.0 over stdio or a Unix socket.

- :mod:`._protocol`: the wire as a pure object (bytes in -> requests and ready
  answers; results, errors, notifications -> bytes), with every method's
  parameter table; no I/O.
- :mod:`._objects`: what results and notifications hold, from the package's objects.
- :mod:`._server`: the Server: a Supervisor, its clients, every method, and the
  order in which answers follow the events they caused.
- :mod:`._client`: one client: its writer thread, the queue and budget that keep
  a slow reader from stalling anyone, the pacing of the keys it reads for.
- :mod:`._order`: worker threads and each key's order of calls.
- :mod:`._transport`: the loops around the Server (stdio, or a Unix socket only
  its uid may use) and the signals that end them.

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
from ._server import Server
from ._transport import serve_socket, serve_stdio

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
