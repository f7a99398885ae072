"""ExitStatus and the decode of a waitpid status word (pure, no I/O).

This sits below table.py and exits.py: a Proc row carries the status of a zombie.
"""

from __future__ import annotations

import signal as _signal
from typing import NamedTuple, Optional

__all__ = ["ExitStatus", "decode_wait_status"]


class ExitStatus(NamedTuple):
    """How a process ended, decoded from its waitpid status word.

    ``code`` is the exit code of a normal exit, ``signal`` the number of the
    signal that killed it; exactly one of them is set. ``raw`` is the status
    word as the kernel gave it (``None`` when the source only gave the parts).
    """

    code: Optional[int]
    signal: Optional[int]
    core_dumped: bool = False
    raw: Optional[int] = None

    @property
    def returncode(self) -> int:
        """``code``, or ``-signal`` as :mod:`subprocess` reports a signal death."""
        if self.signal is not None:
            return -self.signal
        assert self.code is not None
        return self.code

    @property
    def signal_name(self) -> Optional[str]:
        if self.signal is None:
            return None
        try:
            return _signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    def describe(self) -> str:
        """A short human phrase: ``exit code 7`` or ``killed by SIGKILL (core dumped)``."""
        if self.signal is not None:
            core = " (core dumped)" if self.core_dumped else ""
            return f"killed by {self.signal_name}{core}"
        return f"exit code {self.code}"

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        """From a :mod:`subprocess`-style return code (negative for signals).

        A return code has lost the status word: ``raw`` is None, and the core-dump
        bit is not known (``core_dumped`` False).
        """
        if returncode < 0:
            return cls(None, -returncode, False, None)
        return cls(returncode, None, False, None)


def decode_wait_status(raw: int) -> ExitStatus:
    """Decode a waitpid status word (as in field 52 of a zombie's stat line).

    The low 7 bits are the terminating signal (0 for a normal exit, whose code
    is then bits 8-15); bit 7 is the core-dump flag. A stopped or continued
    status (low byte 0x7f or 0xffff) is not an exit and raises ``ValueError``.
    """
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TypeError(f"status must be an int, not {type(raw).__name__}")
    if raw < 0 or raw > 0xFFFF:
        raise ValueError(f"not a wait status: {raw}")
    sig = raw & 0x7F
    if sig == 0x7F or raw == 0xFFFF:
        raise ValueError(f"status {raw:#x} is a stop or continue, not an exit")
    if sig == 0:
        return ExitStatus((raw >> 8) & 0xFF, None, False, raw)
    return ExitStatus(None, sig, bool(raw & 0x80), raw)
