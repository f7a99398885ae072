"""The checks of what a caller passes to a Supervisor: keys, args, timeouts, sizes,
output and pty choices, restart policies; each refuses bad input with a clear
error before anything starts."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any, Optional

from ._policy import MAX_SECONDS, RestartPolicy

_OUTPUTS = ("inherit", "events")
_STDIO = ("stdin", "stdout", "stderr")
_MAX_SECONDS = 10.0 * 365 * 24 * 3600  # what every timer of ours can hold (ten years)


def _seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, not {value}")
    if value > MAX_SECONDS:  # every such number is waited on: the platform must hold it
        raise ValueError(f"{name} must be at most {MAX_SECONDS:g} seconds (about 31 years), "
                         f"not {value!r}; for no bound, pass None where that is allowed")
    return float(value)


def _check_timeout(timeout: object) -> Optional[float]:
    if timeout is None:
        return None
    t = _seconds(timeout, "timeout")
    if not t > 0:
        raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
    return t


def _size(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a number of bytes >= 1, not {value!r}")
    return value


def _check_size(size: object) -> tuple[int, int]:
    if (not isinstance(size, tuple) or len(size) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 65536
                       for v in size)):
        raise ValueError(f"a terminal size is (rows, cols), each 1..65535, not {size!r}")
    return size[0], size[1]


def _check_io(output: object, pty: object, popen_kwargs: dict[str, Any]
              ) -> Optional[tuple[int, int]]:
    """Check output=, pty= and the stdio Popen keywords: what the supervisor owns is
    asked for through them, and a pipe it would not own is refused (never leaked)."""
    if output not in _OUTPUTS:
        raise ValueError(f"output must be one of {', '.join(map(repr, _OUTPUTS))}, "
                         f"not {output!r}")
    size = None if pty is None else _check_size(pty)
    for name in ("stdout", "stderr"):
        if popen_kwargs.get(name) is subprocess.PIPE:
            raise ValueError(f"{name}=subprocess.PIPE is not owned by anyone here and would "
                             "leak with every generation: pass output=\"events\" (or pty=) "
                             "and read the output events")
    if size is not None:  # output="events" agrees with it: a pty's output is events
        given = [n for n in (*_STDIO, "terminal") if popen_kwargs.get(n) is not None]
        if given:
            raise ValueError("pty= gives the command its stdin, stdout and stderr: drop "
                             + ", ".join(given))
    elif output == "events":
        given = [n for n in ("stdout", "stderr") if popen_kwargs.get(n) is not None]
        if given:
            raise ValueError(f"output=\"events\" owns stdout and stderr: drop {', '.join(given)}")
    return size


def _check_key(key: object) -> None:
    """A key is any hashable value but None; an empty str or bytes is no name either
    (the sidecar refuses it too)."""
    if key is None:
        raise TypeError("a key must not be None: name the process, e.g. 'web'")
    try:
        hash(key)
    except TypeError:
        raise TypeError(f"a key must be hashable (a str, an int, a tuple...), not "
                        f"{type(key).__name__}") from None
    if isinstance(key, (str, bytes)) and not key:
        raise ValueError("a key must not be empty: name the process, e.g. 'web'")


def _check_args(args: object) -> list[Any]:
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError("args must be a non-empty list of strings, e.g. ['sleep', '5'], "
                        f"not {type(args).__name__}")
    if not args:  # the right type, a wrong value
        raise ValueError("args must not be empty: name a command, e.g. ['sleep', '5']")
    out = list(args)
    if not all(isinstance(a, (str, bytes)) for a in out):
        raise TypeError("every arg must be a str or bytes")
    return out


def _check_policy(policy: object) -> Optional[RestartPolicy]:
    if policy is not None and not isinstance(policy, RestartPolicy):
        raise TypeError(f"restart must be a RestartPolicy or None, not {type(policy).__name__}")
    return policy
