"""The JSON-lines protocol: one object a line, each with "v" and "type".

This module is the protocol's one definition in code: the writer and a
builder for every object. docs/protocol.md documents each object, and a test
holds the two together. The rules that make it safe for other runtimes:

- ``v`` is an int that changes only when a change could break a reader (a field
  removed or its meaning or type changed); new fields, new types and new enum
  values keep it.
- Strings are ASCII on the wire (JSON escapes); bytes that are not UTF-8 in a
  process name or command line arrive as U+FFFD.
- Unknown is ``null``, never 0.
- Every line is flushed as it is written.
"""

from __future__ import annotations

import json
import time
from typing import Any, TextIO

from .._jsonobjects import (
    args_list,
    denied_object,
    probe_object,
    proc_object,
    status_object,
    text,
)

__all__ = [
    "VERSION",
    "JsonLines",
    "args_list",
    "denied_object",
    "probe_object",
    "proc_object",
    "status_object",
    "text",
]

VERSION = 1


class JsonLines:
    """Writes protocol objects to a stream, one a line, flushed line by line.

    A reader that goes away (EPIPE) does not stop the command that writes:
    ``broken`` turns true and later objects are dropped.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False

    def emit(self, type_: str, fields: dict[str, Any], stamp: bool = False) -> None:
        """Write {"v", "type", ["time",] **fields} as one line and flush it."""
        if self.broken:
            return
        obj: dict[str, Any] = {"v": VERSION, "type": type_}
        if stamp:
            obj["time"] = round(time.time(), 6)
        obj.update(fields)
        line = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except BrokenPipeError:
            self.broken = True
        except ValueError:  # the stream was closed under us
            self.broken = True
